#pragma once
// The messages of the workers' collective across processes
// (messaging/zmq_collective.cpp), as docs/wire-protocol.md describes them:
// a 64-byte header, then the values.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "messaging/wire.hpp"  // crc32c

namespace asgd::messaging::collective_wire {

using messaging::crc32c;

static_assert(std::endian::native == std::endian::little, "the collective sends floats as this host lays them out");

constexpr std::uint32_t kMagic = 0x4C4F4341;  // "ACOL"
constexpr std::uint16_t kVersion = 5;  // 5: a chunk's piece carries a mean, not a sum
// A chunk goes in pieces of 256K floats (1 MiB), each passed on as soon as
// it is summed, so that the links stay busy.
constexpr std::size_t kPiece = std::size_t{1} << 18;
// result: a round's mean (its total weight in the header), from a rank that
// finished it to ranks that start it again after a death (serve_result).
enum class Kind : std::uint16_t { chunk = 1, gossip = 2, leave = 3, result = 4 };

struct Header {  // 64 bytes, in this order, little-endian
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  Kind kind = Kind::chunk;
  std::uint16_t from = 0;
  std::uint16_t coding = 0;   ///< the values: 0 float32, 1 float16 (an all-reduce's chunks under --compress fp16)
  std::uint32_t step = 0;     ///< chunk: the ring step (0 .. 2(m-1)-1)
  std::uint64_t round = 0;    ///< chunk: the all-reduce's round; gossip: the copy's clock; leave: the last round done
  std::uint64_t mask = 0;     ///< chunk: the live ranks the round was begun with
  std::uint64_t count = 0;    ///< floats in the second part
  std::uint64_t offset = 0;   ///< chunk: where in the chunk this piece starts
  std::uint32_t chunk = 0;    ///< chunk: which chunk of the vector
  std::uint32_t crc = 0;      ///< CRC-32C of the second part
  double weight = 0;  ///< chunk: the weights summed into it (the total, all-gather); result: the total
};

static_assert(sizeof(Header) == 64);

/// What a receiver checks before it reads a message's values: its magic,
/// version and kind, a sender of the `ranks` other than `self`, a coding the
/// kind may have, as many bytes as the count says (at most `max_values`),
/// and their CRC-32C, and a weight that is finite and not negative.
inline bool well_formed(const Header& h, std::span<const std::byte> values, std::uint32_t ranks, std::uint32_t self,
                        std::size_t max_values) {
  const std::size_t width = h.coding == 1 ? sizeof(std::uint16_t) : sizeof(float);
  return h.magic == kMagic && h.version == kVersion && h.kind >= Kind::chunk && h.kind <= Kind::result &&
         h.from < ranks && h.from != self && (h.coding == 0 || (h.coding == 1 && h.kind == Kind::chunk)) &&
         values.size() == h.count * width && h.count <= max_values && h.weight >= 0 && std::isfinite(h.weight) &&
         crc32c(values) == h.crc;
}

/// The values of a message `well_formed` passed, as float32: in place when
/// they are float32 at a float's alignment (ZeroMQ may hand a message's
/// bytes over at any address: small ones sit inside its receive buffer),
/// else converted or copied into `scratch`; no allocation beyond its growth.
inline std::span<const float> read_values(const Header& h, std::span<const std::byte> bytes,
                                          std::vector<float>& scratch) {
  if (h.coding == 1) {
    scratch.resize(h.count);
    if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(std::uint16_t) == 0) {
      from_half({reinterpret_cast<const std::uint16_t*>(bytes.data()), h.count}, scratch);
    } else {
      for (std::size_t i = 0; i < h.count; ++i) {
        std::uint16_t half = 0;
        std::memcpy(&half, bytes.data() + i * sizeof half, sizeof half);
        scratch[i] = from_half(half);
      }
    }
    return scratch;
  }
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) == 0)
    return {reinterpret_cast<const float*>(bytes.data()), h.count};
  scratch.resize(h.count);
  // (Not for no values: an empty vector's data() may be null, and memcpy
  // from or to null is undefined even for no bytes.)
  if (!bytes.empty()) std::memcpy(scratch.data(), bytes.data(), bytes.size());
  return scratch;
}

}  // namespace asgd::messaging::collective_wire
