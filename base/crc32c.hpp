#pragma once
// CRC-32C (Castagnoli): the checksum of the wire's frames
// (messaging/wire.hpp), of checkpoints and of the dataset cache's files.

#include <cstddef>
#include <cstdint>
#include <span>

namespace asgd {

/// CRC-32C, continuing from `crc` (0 to start). Folds long inputs with
/// VPCLMULQDQ where the CPU has it, else uses the SSE4.2 instruction on
/// three interleaved streams where it has that, else a table.
std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0);

/// Copies `src` to `dst` (same size, not overlapping) and returns CRC-32C of
/// the bytes, in one pass over memory. From 16 MiB on, with the AVX-512
/// fold, `dst` is written with non-temporal stores (completed before it
/// returns).
std::uint32_t crc32c_copy(std::byte* dst, std::span<const std::byte> src, std::uint32_t crc = 0);

}  // namespace asgd
