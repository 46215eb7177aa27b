#include "messaging/wire.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <nmmintrin.h>
#endif

namespace asgd::messaging {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian; add byte swaps");

const char* to_string(FrameError e) {
  switch (e) {
    case FrameError::none: return "ok";
    case FrameError::no_parts: return "not one or two parts";
    case FrameError::short_header: return "shorter than the header";
    case FrameError::bad_magic: return "bad magic";
    case FrameError::bad_version: return "unsupported protocol version";
    case FrameError::oversized: return "over a size limit";
    case FrameError::length_mismatch: return "lengths do not match the parts";
    case FrameError::bad_checksum: return "bad checksum";
    case FrameError::bad_body: return "malformed fields";
    case FrameError::unknown_type: return "unknown message type";
  }
  return "?";
}

namespace {

template <class T>
void put(std::byte* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <class T>
T get(const std::byte* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

// Offsets of the header fields.
constexpr std::size_t kOffType = 6, kOffFlags = 8, kOffReserved = 10, kOffRequest = 12, kOffBody = 20,
                      kOffTensor = 24, kOffTensorChecksum = 28, kOffChecksum = 32;

void write_header(const FrameHeader& h, std::byte* at) {
  put(at, h.magic);
  put(at + 4, h.version);
  put(at + kOffType, h.type);
  put(at + kOffFlags, h.flags);
  put(at + kOffReserved, h.reserved);
  put(at + kOffRequest, h.request_id);
  put(at + kOffBody, h.body_bytes);
  put(at + kOffTensor, h.tensor_bytes);
  put(at + kOffTensorChecksum, h.tensor_checksum);
  put(at + kOffChecksum, h.checksum);
}

}  // namespace

FrameError parse_frame(const Message& message, Frame& out) {
  if (message.empty() || message.size() > 2) return FrameError::no_parts;
  const auto head = message[0].bytes;
  if (head.size() < kHeaderBytes) return FrameError::short_header;
  FrameHeader h;
  h.magic = get<std::uint32_t>(head.data());
  h.version = get<std::uint16_t>(head.data() + 4);
  h.type = get<std::uint16_t>(head.data() + kOffType);
  h.flags = get<std::uint16_t>(head.data() + kOffFlags);
  h.reserved = get<std::uint16_t>(head.data() + kOffReserved);
  h.request_id = get<std::uint64_t>(head.data() + kOffRequest);
  h.body_bytes = get<std::uint32_t>(head.data() + kOffBody);
  h.tensor_bytes = get<std::uint32_t>(head.data() + kOffTensor);
  h.tensor_checksum = get<std::uint32_t>(head.data() + kOffTensorChecksum);
  h.checksum = get<std::uint32_t>(head.data() + kOffChecksum);
  if (h.magic != kMagic) return FrameError::bad_magic;
  if (h.version != kProtocolVersion) return FrameError::bad_version;
  if (h.body_bytes > kMaxBody || h.tensor_bytes > kMaxTensorBytes) return FrameError::oversized;
  const std::size_t tensor_part = message.size() == 2 ? message[1].bytes.size() : 0;
  if (head.size() != kHeaderBytes + h.body_bytes || tensor_part != h.tensor_bytes ||
      (message.size() == 2 && h.tensor_bytes == 0) || h.reserved != 0 || (h.flags & ~kFlagFp16) != 0)
    return FrameError::length_mismatch;  // (a flag bit no version defines, like a reserved one: not a frame of ours)
  std::array<std::byte, kHeaderBytes> zeroed;
  std::memcpy(zeroed.data(), head.data(), kHeaderBytes);
  put<std::uint32_t>(zeroed.data() + kOffChecksum, 0);
  std::uint32_t crc = crc32c(zeroed);
  crc = crc32c(head.subspan(kHeaderBytes), crc);
  if (crc != h.checksum) return FrameError::bad_checksum;
  if (h.tensor_bytes == 0 && h.tensor_checksum != 0) return FrameError::bad_checksum;
  out.header = h;
  out.body = head.subspan(kHeaderBytes);
  out.tensor = message.size() == 2 ? message[1].bytes : std::span<const std::byte>();
  return FrameError::none;
}

Message build_frame(std::uint16_t type, std::uint16_t flags, std::uint64_t request_id, std::span<const std::byte> body,
                    Part tensor, std::optional<std::uint32_t> tensor_checksum) {
  assert(!tensor_checksum || tensor.bytes.empty() || *tensor_checksum == crc32c(tensor.bytes));
  FrameHeader h;
  h.type = type;
  h.flags = flags;
  h.request_id = request_id;
  h.body_bytes = static_cast<std::uint32_t>(body.size());
  h.tensor_bytes = static_cast<std::uint32_t>(tensor.bytes.size());
  h.tensor_checksum = tensor.bytes.empty() ? 0 : tensor_checksum ? *tensor_checksum : crc32c(tensor.bytes);
  std::vector<std::byte> head(kHeaderBytes + body.size());
  write_header(h, head.data());
  if (!body.empty()) std::memcpy(head.data() + kHeaderBytes, body.data(), body.size());
  put<std::uint32_t>(head.data() + kOffChecksum, crc32c(head));
  Message m;
  m.push_back(Part::take(std::move(head)));
  if (!tensor.bytes.empty()) m.push_back(std::move(tensor));
  return m;
}

std::uint16_t to_half(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xFFu;
  std::uint32_t mant = x & 0x7FFFFFu;
  if (exp == 0xFF) return static_cast<std::uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));  // inf, NaN
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow: infinity
  if (e <= 0) {                                                    // subnormal or zero
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | half);
}

float from_half(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

namespace {

#if defined(__x86_64__)
// F16C converts eight values per instruction with the same rounding (to
// nearest even) as the scalar code.
__attribute__((target("avx,f16c"))) std::size_t to_half_f16c(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  return i;
}
__attribute__((target("avx,f16c"))) std::size_t from_half_f16c(const std::uint16_t* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}
bool has_f16c() {
  // clang does not know "f16c" as a __builtin_cpu_supports feature: ask
  // cpuid (leaf 1, ecx bit 29) and let the builtin vouch for AVX and its
  // OS support.
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  }();
  return yes;
}
#endif

}  // namespace

void to_half(std::span<const float> in, std::span<std::uint16_t> out) {
  std::size_t i = 0;
#if defined(__x86_64__)
  if (has_f16c()) i = to_half_f16c(in.data(), out.data(), in.size());
#endif
  for (; i < in.size(); ++i) out[i] = to_half(in[i]);
}

bool fits_half(std::span<const float> values) {
  // On the bits, which vectorises (the float compares did not: a scalar
  // pass of 0.55 ms per 512K floats, twice per ring piece): a finite value
  // of magnitude 65520 or more is between those bits and infinity's.
  constexpr std::uint32_t kFirstPast = 0x477FF000u;  // 65520.0f
  constexpr std::uint32_t kInfinity = 0x7F800000u;
  std::uint32_t past = 0;
  const std::size_t n = values.size();
  const float* v = values.data();
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, v + i, sizeof bits);
    bits &= 0x7FFFFFFFu;
    past |= static_cast<std::uint32_t>(bits >= kFirstPast) & static_cast<std::uint32_t>(bits < kInfinity);
  }
  return past == 0;
}

void round_to_half(std::span<float> values) {
  std::array<std::uint16_t, 4096> half;
  for (std::size_t at = 0; at < values.size(); at += half.size()) {
    const std::size_t n = std::min(half.size(), values.size() - at);
    to_half(values.subspan(at, n), std::span<std::uint16_t>(half.data(), n));
    from_half(std::span<const std::uint16_t>(half.data(), n), values.subspan(at, n));
  }
}

void from_half(std::span<const std::uint16_t> in, std::span<float> out) {
  std::size_t i = 0;
#if defined(__x86_64__)
  if (has_f16c()) i = from_half_f16c(in.data(), out.data(), in.size());
#endif
  for (; i < in.size(); ++i) out[i] = from_half(in[i]);
}

}  // namespace asgd::messaging
