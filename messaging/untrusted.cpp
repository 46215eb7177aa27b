#include "messaging/untrusted.hpp"

#include <cstring>

namespace asgd::messaging {

namespace {

template <class M>
FrameError body_of(const Frame& f) {
  M m;
  return decode(f, m);
}

}  // namespace

FrameError check_untrusted(const Message& message) {
  Frame f;
  if (FrameError e = parse_frame(message, f); e != FrameError::none) return e;
  if (!is_known(f.header.type)) return FrameError::unknown_type;
  FrameError e = FrameError::none;
  switch (static_cast<MsgType>(f.header.type)) {
    case MsgType::registration: e = body_of<Registration>(f); break;
    case MsgType::assignment: e = body_of<Assignment>(f); break;
    case MsgType::push: e = body_of<PushRequest>(f); break;
    case MsgType::pull: e = body_of<PullRequest>(f); break;
    case MsgType::parameters: e = body_of<ShardReply>(f); break;
    case MsgType::clock: e = body_of<ClockNotice>(f); break;
    case MsgType::heartbeat: e = body_of<Heartbeat>(f); break;
    case MsgType::evaluation: e = body_of<EvaluationRequest>(f); break;
    case MsgType::checkpoint: e = body_of<CheckpointRequest>(f); break;
    case MsgType::shutdown: e = body_of<Shutdown>(f); break;
    case MsgType::epoch_report: e = body_of<EpochReport>(f); break;
    case MsgType::progress: e = body_of<WorkerProgress>(f); break;
    case MsgType::failure: e = body_of<Failure>(f); break;
    case MsgType::stats: e = body_of<StatsRequest>(f); break;
    case MsgType::stats_reply: e = body_of<ShardStats>(f); break;
    case MsgType::start: e = body_of<StartTraining>(f); break;
    case MsgType::restarted: e = body_of<Restarted>(f); break;
  }
  if (e != FrameError::none) return e;
  if (f.header.type == static_cast<std::uint16_t>(MsgType::push) && can_borrow_tensor(f) && message[1].owner) {
    // As the bridge takes a big float32 push: checked where it lies, not copied.
    ReceivedFloats received;
    return borrow_tensor(f, message[1], received);
  }
  std::vector<float> tensor;
  return decode_tensor(f, tensor);
}

FrameError check_untrusted_bytes(std::span<const std::byte> data) {
  Message m;
  if (data.empty()) return check_untrusted(m);
  const auto split_hint = static_cast<std::uint8_t>(data[0]);
  data = data.subspan(1);
  if (split_hint & 1) {
    // Two parts: the next two bytes say where part 0 ends.
    std::uint16_t head = 0;
    if (data.size() >= 2) std::memcpy(&head, data.data(), 2);
    data = data.subspan(std::min<std::size_t>(2, data.size()));
    const std::size_t cut = std::min<std::size_t>(head, data.size());
    m.push_back(Part::copy_of(data.first(cut)));
    m.push_back(Part::copy_of(data.subspan(cut)));
  } else {
    m.push_back(Part::copy_of(data));
  }
  if (split_hint & 2) {
    // Recompute the checksum, so mutations get past it into the body and
    // tensor decoders (a fuzzer cannot forge CRCs by itself).
    std::vector<std::byte> head(m[0].bytes.begin(), m[0].bytes.end());
    if (head.size() >= kHeaderBytes) {
      const std::uint32_t tensor_crc = m.size() == 2 && !m[1].bytes.empty() ? crc32c(m[1].bytes) : 0;
      std::memcpy(head.data() + 28, &tensor_crc, 4);
      std::memset(head.data() + 32, 0, 4);
      const std::uint32_t crc = crc32c(head);
      std::memcpy(head.data() + 32, &crc, 4);
      m[0] = Part::take(std::move(head));
    }
  }
  return check_untrusted(m);
}

}  // namespace asgd::messaging
