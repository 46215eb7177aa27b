#pragma once
// The framed wire format. Every message is one ZeroMQ multipart message:
//
//   part 0: a 36-byte header, then the body (the message's fields, cereal
//           portable binary, at most kMaxBody bytes)
//   part 1: optional, the tensor: float32 values, or float16 when the
//           header's fp16 flag is set (at most kMaxTensorBytes)
//
// header (little-endian, 36 bytes):
//   u32 magic "ASGD" | u16 version | u16 type | u16 flags | u16 reserved (0)
//   u64 request id (a reply carries its request's id)
//   u32 body bytes | u32 tensor bytes
//   u32 CRC-32C of the tensor
//   u32 CRC-32C of header (this field 0) and body
//
// The decoder trusts nothing it has not checked: lengths against the part
// sizes and the limits before anything is allocated, the header and body's
// checksum before any field is read, the tensor's checksum before any value
// is used (decode_tensor checks it in the pass that copies it out;
// borrow_tensor checks it where it lies, then lends it; messages.hpp), every
// variable-length field in the body against its own bound (messages.hpp).
// A frame that fails a check is rejected with a reason; the bridge drops
// it, counts it and logs the sender once.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "asgd/status.hpp"
#include "base/crc32c.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {

inline constexpr std::uint32_t kMagic = 0x44475341;  // "ASGD" read as little-endian bytes
inline constexpr std::uint16_t kProtocolVersion = 16;
inline constexpr std::size_t kHeaderBytes = 36;
inline constexpr std::size_t kMaxBody = 1u << 20;            ///< 1 MiB of fields
inline constexpr std::size_t kMaxTensorBytes = 256u << 20;   ///< 64M float32 values

/// The largest part a peer may legally send to a receiver that is sent
/// tensors of at most `tensor_values` float32 values (0: none): part 0 with
/// a body at its limit, or such a tensor. What a bound endpoint's
/// TransportLimits::bound_max_part_bytes should be: ZeroMQ then drops a peer
/// that announces a larger part before allocating it.
constexpr std::size_t largest_part(std::size_t tensor_values) {
  return std::max(kHeaderBytes + kMaxBody, tensor_values * sizeof(float));
}

/// Frame flags.
inline constexpr std::uint16_t kFlagFp16 = 1;  ///< the tensor part holds float16 values

struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t type = 0;
  std::uint16_t flags = 0;
  std::uint16_t reserved = 0;
  std::uint64_t request_id = 0;
  std::uint32_t body_bytes = 0;
  std::uint32_t tensor_bytes = 0;
  std::uint32_t tensor_checksum = 0;
  std::uint32_t checksum = 0;
};

/// Why a frame was rejected (for counting and for the log).
enum class FrameError : std::uint8_t {
  none = 0,
  no_parts,         ///< an empty message, or more than two parts
  short_header,     ///< part 0 shorter than the header
  bad_magic,
  bad_version,
  oversized,        ///< a length over its limit
  length_mismatch,  ///< a length that does not match the part it describes
  bad_checksum,
  bad_body,         ///< the fields did not decode (truncated, a bound exceeded, trailing bytes)
  unknown_type,
};
const char* to_string(FrameError e);

/// A checked frame: header and views of body and tensor into the message's
/// parts (valid while the message lives). The tensor's checksum is not yet
/// checked: read it only through decode_tensor or borrow_tensor.
struct Frame {
  FrameHeader header;
  std::span<const std::byte> body;
  std::span<const std::byte> tensor;
};

/// Checks everything but the body's fields and the tensor's checksum.
/// Never allocates.
FrameError parse_frame(const Message& message, Frame& out);

/// Builds part 0 (header + body) and, when `tensor` has bytes, part 1, with
/// the checksums filled in. `tensor` is moved into the message (no copy).
/// `tensor_checksum`, when given, must be the tensor's CRC-32C, computed
/// earlier in a pass that wrote the bytes (checked in debug builds only);
/// otherwise it is computed here.
Message build_frame(std::uint16_t type, std::uint16_t flags, std::uint64_t request_id, std::span<const std::byte> body,
                    Part tensor, std::optional<std::uint32_t> tensor_checksum = std::nullopt);

// The frames' checksum (base/crc32c.hpp).
using asgd::crc32c;
using asgd::crc32c_copy;

/// IEEE half precision, round to nearest even; infinities and NaN kept.
std::uint16_t to_half(float f);
float from_half(std::uint16_t h);
void to_half(std::span<const float> in, std::span<std::uint16_t> out);
/// Whether every finite value stays finite in half precision (|x| < 65520,
/// which rounds to at most 65504). A tensor that does not goes as float32:
/// a gradient's one large value made the whole push infinite, and the shard
/// refused it as a NaN (858 of 860 pushes, exit 0).
bool fits_half(std::span<const float> values);
void from_half(std::span<const std::uint16_t> in, std::span<float> out);
/// Each value as half precision would carry it, in place (F16C where the
/// CPU has it, a block at a time).
void round_to_half(std::span<float> values);

}  // namespace asgd::messaging
