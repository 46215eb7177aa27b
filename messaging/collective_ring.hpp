#pragma once
// One rank's part in a ring all-reduce of the samples-weighted mean
// (reduce-scatter, then all-gather), apart from how its pieces travel:
// messaging/zmq_collective.cpp moves them over ZeroMQ or shared memory.
//
// The vector is cut into one chunk per ring member, each sent in pieces of
// kPiece floats, passed on as soon as they are summed so that the links stay
// busy. What travels is a running weighted mean, never weight x values
// (sums of samples-weighted gradients overflowed float16 under --compress
// fp16 where the mean did not): at ring step s < m - 1 a rank folds its own
// values into the mean its left neighbour sent, in one pass
// ((w x data + W x piece) / (W + w), W the weight of the piece so far), and
// passes it on with the weights summed so far; after the rank that folds
// last into a chunk (step m - 2), m - 1 more steps pass the means around.
// So every value is written once per round (partial means and means in
// separate buffers: a transport may send from them without a copy), each
// chunk is folded in ring order (the same bits in every run), and no pass
// over the whole vector comes before or after the exchange.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "messaging/collective.hpp"

namespace asgd::messaging {

class RingReduce {
 public:
  using Buffer = std::shared_ptr<std::vector<float>>;
  /// A piece of a chunk between ring neighbours.
  struct Piece {
    std::uint32_t step = 0;   ///< the ring step, 0 .. 2 (m - 1) - 1
    std::uint32_t chunk = 0;  ///< which chunk of the vector
    std::uint64_t offset = 0;  ///< where in the chunk the piece starts
    double weight = 0;  ///< reduce-scatter: the weights folded into it so far; all-gather: the total
    std::span<const float> values;
  };
  /// Sends a piece to rank `to`; `owner` holds its values (a transport may
  /// keep a reference to them instead of copying).
  using Send = std::function<void(Rank to, const Piece&, const Buffer& owner)>;

  /// Begins a round over `ring` (the live ranks in order, `self` among
  /// them): sends this rank's own chunk. `data` stays valid and unchanged
  /// until the round is done; a `weight` of 0 adds nothing and does not read
  /// `data`. `half`: the values travel as float16, so the rank that writes a
  /// chunk's mean keeps the bits it sends.
  void begin(std::vector<Rank> ring, Rank self, std::span<const float> data, double weight, bool half,
             const Send& send);

  /// A piece from the left neighbour: taken and passed on when it is the one
  /// expected next (expect(), piece_at()); false (nothing changed) otherwise.
  bool take(const Piece& p, const Send& send);
  /// A result that a rank which finished this round sent (after a death
  /// made the others start it again): false when its length does not fit.
  bool take_result(std::span<const float> mean, double total);

  bool done() const { return done_; }
  std::uint32_t expect() const { return expect_; }
  std::uint64_t piece_at() const { return piece_at_; }
  std::size_t members() const { return ring_.size(); }
  Rank left() const { return ring_[(pos_ + ring_.size() - 1) % ring_.size()]; }

  /// Once done(): the mean (empty when the total weight is 0) and the
  /// total; result() is the buffer that holds the mean, which the caller may
  /// keep (the next round takes another while it is held).
  std::span<const float> mean() const { return total_ > 0 ? std::span<const float>(*buf_) : std::span<const float>(); }
  const Buffer& result() const { return buf_; }
  double total() const { return total_; }

 private:
  std::pair<std::size_t, std::size_t> bounds(std::size_t chunk) const;
  std::uint32_t chunk_at(std::uint32_t step) const;
  void send_piece(const Buffer& from, std::uint32_t chunk, std::uint32_t step, std::uint64_t offset, double weight,
                  const Send& send);
  Buffer acquire(std::size_t len);

  std::vector<Rank> ring_;
  std::size_t pos_ = 0;
  std::span<const float> data_;
  double weight_ = 0;
  bool half_ = false;
  bool done_ = false;
  std::uint32_t expect_ = 0;    // the ring step whose chunk comes next
  std::uint64_t piece_at_ = 0;  // and the offset in it of the next piece
  double total_ = 0;
  Buffer partial_;             // this round's partial means (reduce-scatter)
  Buffer buf_;                 // and its mean (all-gather)
  std::vector<Buffer> spare_;  // earlier rounds' buffers, reused once nobody holds them
};

}  // namespace asgd::messaging
