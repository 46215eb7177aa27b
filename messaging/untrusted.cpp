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
  visit_wire_type(f.header.type, [&]<class M>() { e = body_of<M>(f); });
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
