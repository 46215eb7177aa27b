#include "messaging/messages.hpp"

#include <algorithm>

#include "compute/tensor.hpp"

#include <cstring>
#include <sstream>
#include <streambuf>

namespace asgd::messaging {

const char* to_string(MsgType t) {
  switch (t) {
    case MsgType::registration: return "registration";
    case MsgType::assignment: return "assignment";
    case MsgType::push: return "push";
    case MsgType::pull: return "pull";
    case MsgType::parameters: return "parameters";
    case MsgType::clock: return "clock";
    case MsgType::heartbeat: return "heartbeat";
    case MsgType::evaluation: return "evaluation";
    case MsgType::checkpoint: return "checkpoint";
    case MsgType::shutdown: return "shutdown";
    case MsgType::epoch_report: return "epoch_report";
    case MsgType::failure: return "failure";
    case MsgType::stats: return "stats";
    case MsgType::start: return "start";
    case MsgType::stats_reply: return "stats_reply";
    case MsgType::progress: return "progress";
    case MsgType::restarted: return "restarted";
    case MsgType::calibration: return "calibration";
    case MsgType::worker_ready: return "worker_ready";
    case MsgType::stop_training: return "stop_training";
  }
  return "unknown";
}

bool is_known(std::uint16_t type) {
  return visit_wire_type(type, []<class M>() {});
}

namespace {

// Reads straight out of a frame's bytes: no copy, and what is left is known.
class SpanBuf : public std::streambuf {
 public:
  explicit SpanBuf(std::span<const std::byte> bytes) {
    char* begin = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));
    setg(begin, begin, begin + bytes.size());
  }
  std::size_t left() const { return static_cast<std::size_t>(egptr() - gptr()); }
};

class VectorBuf : public std::streambuf {
 public:
  std::vector<std::byte> bytes;

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    const auto* p = reinterpret_cast<const std::byte*>(s);
    bytes.insert(bytes.end(), p, p + n);
    return n;
  }
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) bytes.push_back(static_cast<std::byte>(c));
    return c;
  }
};

}  // namespace

std::vector<std::byte> serialize_body(const std::function<void(cereal::PortableBinaryOutputArchive&)>& write) {
  VectorBuf buf;
  {
    std::ostream os(&buf);
    cereal::PortableBinaryOutputArchive ar(os);
    write(ar);
  }
  return std::move(buf.bytes);
}

FrameError deserialize_body(std::span<const std::byte> body,
                            const std::function<void(cereal::PortableBinaryInputArchive&)>& read) {
  SpanBuf buf(body);
  std::istream is(&buf);
  try {
    cereal::PortableBinaryInputArchive ar(is);
    read(ar);
  } catch (const std::exception&) {  // cereal::Exception: truncated, or a bound exceeded
    return FrameError::bad_body;
  }
  return buf.left() == 0 ? FrameError::none : FrameError::bad_body;
}

std::vector<float> TensorPool::take(std::size_t n) {
  if (n >= kMinFloats) {
    std::lock_guard lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() == n) {
        std::vector<float> v = std::move(*it);
        free_.erase(it);
        return v;
      }
    }
  }
  return std::vector<float>(n);
}

void TensorPool::give(std::vector<float>&& v) {
  if (v.size() < kMinFloats) return;
  std::lock_guard lock(mu_);
  if (free_.size() < kMaxFree) free_.push_back(std::move(v));
}

Part tensor_part(std::vector<float>&& tensor, TensorCoding coding, std::shared_ptr<TensorPool> pool) {
  if (tensor.empty()) return {};
  if (coding == TensorCoding::float32 && pool) {
    // The vector goes back to the pool when ZeroMQ lets go of it.
    auto* raw = new std::vector<float>(std::move(tensor));
    std::shared_ptr<std::vector<float>> holder(raw, [pool](std::vector<float>* v) {
      pool->give(std::move(*v));
      delete v;
    });
    Part p;
    p.bytes = std::as_bytes(std::span<const float>(*holder));
    p.owner = std::move(holder);
    return p;
  }
  if (coding == TensorCoding::float32) return Part::take(std::move(tensor));
  std::vector<std::uint16_t> half(tensor.size());
  to_half(tensor, half);
  if (pool) pool->give(std::move(tensor));  // converted: the floats can receive a later tensor
  return Part::take(std::move(half));
}

FrameError decode_tensor(const Frame& frame, std::vector<float>& out, std::optional<std::size_t> expected,
                         TensorPool* pool) {
  const bool fp16 = frame.header.flags & kFlagFp16;
  const std::size_t width = fp16 ? 2 : 4;
  if (frame.tensor.size() % width != 0) return FrameError::bad_body;
  const std::size_t n = frame.tensor.size() / width;
  if (expected && n != *expected) return FrameError::bad_body;
  if (pool && out.empty()) {
    out = pool->take(n);
  } else {
    out.resize(n);
  }
  std::uint32_t crc = 0;
  if (fp16) {
    // The part's bytes need not be 2-byte aligned: copy (and check) blocks
    // into an aligned buffer, then convert.
    constexpr std::size_t kBlock = 4096;
    std::uint16_t block[kBlock];
    for (std::size_t i = 0; i < n; i += kBlock) {
      const std::size_t m = std::min(kBlock, n - i);
      crc = crc32c_copy(reinterpret_cast<std::byte*>(block), frame.tensor.subspan(i * 2, m * 2), crc);
      from_half(std::span<const std::uint16_t>(block, m), std::span<float>(out).subspan(i, m));
    }
  } else if (n > 0) {  // copy and check in one pass over memory
    crc = crc32c_copy(reinterpret_cast<std::byte*>(out.data()), frame.tensor);
  }
  if (crc != frame.header.tensor_checksum) {
    out.clear();
    return FrameError::bad_checksum;
  }
  return FrameError::none;
}

bool can_borrow_tensor(const Frame& frame) {
  return !(frame.header.flags & kFlagFp16) && frame.tensor.size() >= kBorrowFromBytes &&
         reinterpret_cast<std::uintptr_t>(frame.tensor.data()) % alignof(float) == 0;
}

FrameError borrow_tensor(const Frame& frame, const Part& part, ReceivedFloats& out, TensorPool* pool) {
  if (frame.tensor.size() % sizeof(float) != 0) return FrameError::bad_body;
  // The whole checksum before any value is read: nothing downstream sees
  // an unchecked byte, and a bad frame is dropped before it costs more.
  // The same pass, block by block while each is in cache, also finds out
  // whether every value is finite, which spares the shard a pass of its own.
  const std::size_t n = frame.tensor.size() / sizeof(float);
  const auto* values = reinterpret_cast<const float*>(frame.tensor.data());
  constexpr std::size_t kBlock = 8192;  // floats: 32 KiB
  std::uint32_t crc = 0;
  bool finite = true;
  for (std::size_t begin = 0; begin < n; begin += kBlock) {
    const std::span<const float> block(values + begin, std::min(kBlock, n - begin));
    crc = crc32c(std::as_bytes(block), crc);
    finite = finite && all_finite(block);
  }
  if (crc != frame.header.tensor_checksum) return FrameError::bad_checksum;
  out.finite = finite;
  out.owner = part.owner;
  out.values = std::span<const float>(values, n);
  if (part.exclusive) {
    // The receive buffer is ours alone (and not const memory): the reply
    // may be written over the gradient, each value after it was read.
    out.writable = std::span<float>(const_cast<float*>(values), n);
  } else {
    out.spare = pool ? pool->take(n) : std::vector<float>(n);
  }
  return FrameError::none;
}

Message encode_in_frame(const ShardReply& reply, std::uint64_t request_id, const ReceivedFloats& params,
                        std::uint32_t crc) {
  auto body = serialize_body(
      [&](cereal::PortableBinaryOutputArchive& ar) { archive_message(ar, const_cast<ShardReply&>(reply)); });
  Part tensor;
  tensor.owner = params.owner;
  tensor.bytes = std::as_bytes(params.values);
  return build_frame(static_cast<std::uint16_t>(MsgType::parameters), 0, request_id, body, std::move(tensor), crc);
}

}  // namespace asgd::messaging
