// The ring all-reduce's arithmetic (messaging/collective_ring.hpp).
#include "messaging/collective_ring.hpp"

#include <algorithm>

#include "messaging/collective_wire.hpp"
#include "messaging/wire.hpp"

namespace asgd::messaging {

namespace {

using collective_wire::kPiece;

// The pass, on buffers that do not overlap (declared so, and kept out of
// line, so that GCC vectorizes it).
[[gnu::noinline]] void blend(float* __restrict dst, float a, const float* __restrict own, float b,
                             const float* __restrict piece, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = a * own[i] + b * piece[i];
}

}  // namespace

void RingReduce::begin(std::vector<Rank> ring, Rank self, std::span<const float> data, double weight, bool half,
                       const Send& send) {
  ring_ = std::move(ring);
  pos_ = static_cast<std::size_t>(std::find(ring_.begin(), ring_.end(), self) - ring_.begin());
  data_ = data;
  weight_ = weight > 0 ? weight : 0.0;
  half_ = half;
  done_ = false;
  expect_ = 0;
  piece_at_ = 0;
  total_ = 0;
  partial_.reset();
  buf_.reset();
  buf_ = acquire(data.size());
  if (ring_.size() == 1) {
    total_ = weight_;
    if (total_ > 0) std::copy(data.begin(), data.end(), buf_->begin());  // the mean of one
    done_ = true;
    return;
  }
  partial_ = acquire(data.size());
  const auto own = static_cast<std::uint32_t>(pos_);
  const auto [b, e] = bounds(own);
  // A chunk's first mean: its own values, or nothing (weight 0 reads none).
  if (weight_ > 0)
    std::copy(data.begin() + static_cast<std::ptrdiff_t>(b), data.begin() + static_cast<std::ptrdiff_t>(e),
              partial_->begin() + static_cast<std::ptrdiff_t>(b));
  else
    std::fill(partial_->begin() + static_cast<std::ptrdiff_t>(b), partial_->begin() + static_cast<std::ptrdiff_t>(e), 0.0f);
  std::uint64_t offset = 0;
  do {
    send_piece(partial_, own, 0, offset, weight_, send);
    offset += kPiece;
  } while (offset < e - b);
}

bool RingReduce::take(const Piece& p, const Send& send) {
  const std::size_t m = ring_.size();
  const std::uint32_t step = expect_;
  const auto [b, e] = bounds(p.chunk);
  if (done_ || p.step != step || p.chunk != chunk_at(step) || p.offset != piece_at_ ||
      p.values.size() != std::min<std::size_t>(kPiece, e - b - p.offset))
    return false;
  const std::size_t n = p.values.size(), at = b + p.offset;
  // Partial means go to partial_, finished ones to buf_: no value is written
  // twice in a round, so a piece a transport is still sending is never
  // written over.
  const Buffer& into = step + 2 < m ? partial_ : buf_;
  float* dst = into->data() + at;
  const float* own = data_.data() + at;
  double weight = p.weight;
  if (step < m - 1) {
    weight += weight_;
    if (weight_ > 0 && p.weight > 0)
      blend(dst, static_cast<float>(weight_ / weight), own, static_cast<float>(p.weight / weight), p.values.data(), n);
    else if (weight_ > 0)
      std::copy_n(own, n, dst);  // nothing folded in yet
    else
      std::copy_n(p.values.data(), n, dst);  // (not memcpy: an empty piece's data may be null)
    if (step + 1 == m - 1) {  // the last fold of this chunk: its mean
      total_ = weight;
      // In half precision every rank gets these bits, this one included
      // (unless a value is past its range: then it goes as float32 to all).
      if (half_ && fits_half({dst, n})) round_to_half({dst, n});
    }
  } else {
    std::copy_n(p.values.data(), n, dst);
    total_ = weight;
  }
  // The mean goes on, or (after m - 1 steps) the finished piece.
  if (step + 1 < 2 * (m - 1)) send_piece(into, p.chunk, step + 1, p.offset, weight, send);
  piece_at_ += n;
  if (piece_at_ < e - b) return true;
  piece_at_ = 0;
  if (++expect_ == 2 * (m - 1)) done_ = true;
  return true;
}

bool RingReduce::take_result(std::span<const float> mean, double total) {
  if (done_ || !(total >= 0) || mean.size() != (total > 0 ? data_.size() : 0)) return false;
  buf_ = std::make_shared<std::vector<float>>(mean.begin(), mean.end());
  total_ = total;
  done_ = true;
  return true;
}

std::pair<std::size_t, std::size_t> RingReduce::bounds(std::size_t chunk) const {
  const std::size_t len = data_.size(), m = ring_.size();
  return {chunk * len / m, (chunk + 1) * len / m};
}

// The chunk a rank receives at ring step `step`: during reduce-scatter the
// one its left neighbour summed last, then the finished ones in turn.
std::uint32_t RingReduce::chunk_at(std::uint32_t step) const {
  const std::size_t m = ring_.size(), p = pos_;
  const std::size_t back = step < m - 1 ? step + 1 : step - (m - 1);
  return static_cast<std::uint32_t>((p + m - back % m) % m);
}

// The piece of `chunk` at `offset` (kPiece floats, or the chunk's rest;
// one empty piece for an empty chunk), to the right neighbour.
void RingReduce::send_piece(const Buffer& from, std::uint32_t chunk, std::uint32_t step, std::uint64_t offset,
                            double weight, const Send& send) {
  const auto [b, e] = bounds(chunk);
  const std::size_t n = std::min<std::size_t>(kPiece, e - b - offset);
  const Piece piece{step, chunk, offset, weight, std::span<const float>(*from).subspan(b + offset, n)};
  send(ring_[(pos_ + 1) % ring_.size()], piece, from);
}

// A buffer that nobody else holds (not a transport sending from it, not a
// caller keeping an earlier mean), or a new one.
RingReduce::Buffer RingReduce::acquire(std::size_t len) {
  for (const Buffer& b : spare_)
    if (b.use_count() == 1) {
      b->resize(len);
      return b;
    }
  auto b = std::make_shared<std::vector<float>>(len);
  if (spare_.size() < 8) spare_.push_back(b);
  return b;
}

}  // namespace asgd::messaging
