// CRC-32C (Castagnoli): the wire's checksums (messaging/wire.hpp), the
// checkpoints' and the dataset cache's (base/crc32c.hpp).
#include "base/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <nmmintrin.h>
#endif

namespace asgd {

namespace {

// Software CRC-32C, one table, for CPUs without SSE4.2.
const std::array<std::uint32_t, 256>& crc_table() {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

std::uint32_t crc32c_soft(const std::byte* p, std::size_t n, std::uint32_t crc) {
  const auto& t = crc_table();
  for (std::size_t i = 0; i < n; ++i) crc = t[(crc ^ static_cast<std::uint8_t>(p[i])) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// Three streams of kBlock bytes each hide the instruction's 3-cycle
// latency; their registers are combined by shifting with tables: the raw
// CRC register is linear, reg(A || B) = shift(reg(A), |B|) ^ reg0(B).
constexpr std::size_t kBlock = 4096;

__attribute__((target("sse4.2"))) std::uint64_t crc_words(std::uint64_t c, const std::byte* p, std::size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  return c;
}

// shift(x) over kBlock zero bytes, as four byte tables.
struct ShiftTables {
  std::uint32_t t[4][256];
};
__attribute__((target("sse4.2"))) ShiftTables make_shift_tables() {
  static const std::array<std::byte, kBlock> zeros{};
  ShiftTables st;
  for (int k = 0; k < 4; ++k)
    for (std::uint32_t v = 0; v < 256; ++v)
      st.t[k][v] = static_cast<std::uint32_t>(crc_words(static_cast<std::uint64_t>(v) << (8 * k), zeros.data(), kBlock));
  return st;
}
std::uint32_t shift_block(std::uint32_t x) {
  static const ShiftTables st = make_shift_tables();
  return st.t[0][x & 0xFF] ^ st.t[1][(x >> 8) & 0xFF] ^ st.t[2][(x >> 16) & 0xFF] ^ st.t[3][x >> 24];
}

template <bool kCopy>
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hw3(std::byte* dst, const std::byte* p, std::size_t n,
                                                           std::uint32_t crc) {
  std::uint64_t a = crc;
  while (n >= 3 * kBlock) {
    std::uint64_t b = 0, c = 0;
    const std::byte* pb = p + kBlock;
    const std::byte* pc = p + 2 * kBlock;
    for (std::size_t i = 0; i < kBlock; i += 8) {
      std::uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, pb + i, 8);
      std::memcpy(&wc, pc + i, 8);
      if constexpr (kCopy) {
        std::memcpy(dst + i, &wa, 8);
        std::memcpy(dst + kBlock + i, &wb, 8);
        std::memcpy(dst + 2 * kBlock + i, &wc, 8);
      }
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      c = _mm_crc32_u64(c, wc);
    }
    a = shift_block(shift_block(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b)) ^
        static_cast<std::uint32_t>(c);
    p += 3 * kBlock;
    if constexpr (kCopy) dst += 3 * kBlock;
    n -= 3 * kBlock;
  }
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (kCopy) {
      std::memcpy(dst, &w, 8);
      dst += 8;
    }
    a = _mm_crc32_u64(a, w);
  }
  auto c32 = static_cast<std::uint32_t>(a);
  for (; n > 0; --n, ++p) {
    if constexpr (kCopy) *dst++ = *p;
    c32 = _mm_crc32_u8(c32, static_cast<std::uint8_t>(*p));
  }
  return c32;
}

bool has_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

// Long inputs on CPUs with VPCLMULQDQ: carry-less multiplication folds 256
// bytes per step (the crc32 instruction above does at most 8 bytes a
// cycle; this is limited by memory instead). The message is a polynomial
// M(x), bytes first to last and bit 0 of each byte first (highest degree);
// the CRC register is M(x) * x^32 mod P(x). A 128-bit lane holding 16 bytes
// as (L, H), the 64-bit halves in that order, stands for L(x) x^64 + H(x).
// Moving it D bits further down the message multiplies it by x^D, which is
// congruent to L(x) * (x^(D+64) mod P) + H(x) * (x^D mod P): two carry-less
// 64 x 32-bit products that fit in a lane and are simply xor-ed onto the
// data D bits on. PCLMULQDQ on bit-reflected operands yields the product
// times x^-1 and a 32-bit constant in a 64-bit half counts x^32 more, so the
// constants are x^(D+31) and x^(D-33) mod P, bit-reflected. The last lane
// is reduced with two crc32 instructions: crc32(crc32(0, L), H) = (L x^96 +
// H x^32) mod P.

// x^n mod P(x), bit-reflected as the crc32 instruction keeps its register.
std::uint32_t xpow_mod(unsigned n) {
  std::uint64_t r = 1;  // normal bit order: bit i is the coefficient of x^i
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (1ull << 32)) r ^= 0x11EDC6F41ull;  // CRC-32C's polynomial, x^32 included
  }
  std::uint32_t reflected = 0;
  for (int i = 0; i < 32; ++i)
    if (r & (1ull << i)) reflected |= 1u << (31 - i);
  return reflected;
}

struct FoldConstants {
  __m512i by_2048;  // every lane moved 256 bytes on (the main loop)
  __m512i by_512;   // every lane moved 64 bytes on (folding the four accumulators into one)
  __m512i to_last;  // lanes 0, 1, 2 moved 48, 32, 16 bytes on, onto lane 3; lane 3 times 0
};

__attribute__((target("avx512f"))) __m512i lane_constants(unsigned d0, unsigned d1, unsigned d2, unsigned d3) {
  auto lo = [](unsigned d) { return d == 0 ? 0ll : static_cast<long long>(xpow_mod(d + 31)); };
  auto hi = [](unsigned d) { return d == 0 ? 0ll : static_cast<long long>(xpow_mod(d - 33)); };
  return _mm512_setr_epi64(lo(d0), hi(d0), lo(d1), hi(d1), lo(d2), hi(d2), lo(d3), hi(d3));
}

__attribute__((target("avx512f"))) const FoldConstants& fold_constants() {
  static const FoldConstants k{lane_constants(2048, 2048, 2048, 2048), lane_constants(512, 512, 512, 512),
                               lane_constants(384, 256, 128, 0)};
  return k;
}

// acc * x^D (by the lanes' constants) xor data.
__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i fold(__m512i acc, __m512i k, __m512i data) {
  const __m512i lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
  const __m512i hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, data, 0x96);  // three-way xor
}

// What the fold does with the bytes besides checksumming them.
enum class Sink { none, copy, stream };

// 64 bytes at p + at, copied to dst + at (stream: with a non-temporal store,
// dst + at 64-byte aligned).
template <Sink kSink>
__attribute__((target("avx512f"))) inline __m512i load_block(std::byte* dst, const std::byte* p, std::size_t at) {
  const __m512i v = _mm512_loadu_si512(p + at);
  if constexpr (kSink == Sink::copy) _mm512_storeu_si512(dst + at, v);
  if constexpr (kSink == Sink::stream) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + at), v);
  return v;
}

constexpr std::size_t kFoldFrom = 1024;  ///< shorter inputs stay on the crc32 instruction

// CRC register after the longest multiple of 256 bytes of p (n >= 256), from
// register `crc`; copies those bytes to dst unless kSink is none. Returns the
// bytes done.
template <Sink kSink>
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) std::size_t crc32c_fold(std::byte* dst, const std::byte* p,
                                                                                       std::size_t n, std::uint32_t& crc) {
  const FoldConstants& k = fold_constants();
  const auto load = [dst, p](std::size_t at) __attribute__((target("avx512f"))) { return load_block<kSink>(dst, p, at); };
  __m512i a0 = _mm512_xor_si512(load(0), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i a1 = load(64), a2 = load(128), a3 = load(192);
  std::size_t at = 256;
  for (; at + 256 <= n; at += 256) {
    a0 = fold(a0, k.by_2048, load(at));
    a1 = fold(a1, k.by_2048, load(at + 64));
    a2 = fold(a2, k.by_2048, load(at + 128));
    a3 = fold(a3, k.by_2048, load(at + 192));
  }
  a1 = fold(a0, k.by_512, a1);
  a2 = fold(a1, k.by_512, a2);
  a3 = fold(a2, k.by_512, a3);
  // Lanes 0..2 onto lane 3 (whose own product is zero), then xor the lanes.
  const __m512i lanes = fold(a3, k.to_last, _mm512_maskz_mov_epi64(0xC0, a3));
  alignas(64) std::uint64_t w[8];
  _mm512_store_si512(w, lanes);
  std::uint64_t c = _mm_crc32_u64(0, w[0] ^ w[2] ^ w[4] ^ w[6]);
  c = _mm_crc32_u64(c, w[1] ^ w[3] ^ w[5] ^ w[7]);
  crc = static_cast<std::uint32_t>(c);
  return at;
}

bool has_vpclmul() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    // leaf 7, ecx bit 10: VPCLMULQDQ.
    // __builtin_cpu_supports vouches for the OS saving the zmm registers.
    return __builtin_cpu_supports("avx512f") &&
           __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 10)) != 0;
  }();
  return yes;
}

// Copies this long or longer go around the cache (non-temporal stores).
// Measured on the development VM (260 MiB of shared L3): for an 8 MiB reply
// that is read again soon, plain stores win (the copy stays in L3); for
// 32 MiB ones, in a pipeline that moves hundreds of MiB a second through
// socket buffers, streaming wins (bench comm at 16M floats: 0.77-0.81 of raw
// with plain stores, 0.81-0.84 streamed).
constexpr std::size_t kStreamFrom = 16u << 20;

// The fold for the bulk of a long input, the crc32 instruction for the rest.
template <bool kCopy>
std::uint32_t crc32c_hw(std::byte* dst, const std::byte* p, std::size_t n, std::uint32_t crc) {
  if (n >= kFoldFrom && has_vpclmul()) {
    if constexpr (kCopy) {
      if (n >= kStreamFrom) {
        // Up to dst's first 64-byte boundary the plain way, then streamed.
        const std::size_t head = (64 - reinterpret_cast<std::uintptr_t>(dst) % 64) % 64;
        crc = crc32c_hw3<true>(dst, p, head, crc);
        const std::size_t done = head + crc32c_fold<Sink::stream>(dst + head, p + head, n - head, crc);
        _mm_sfence();  // streamed stores are weakly ordered: complete them before anyone reads dst
        return crc32c_hw3<true>(dst + done, p + done, n - done, crc);
      }
    }
    const std::size_t done = crc32c_fold<kCopy ? Sink::copy : Sink::none>(dst, p, n, crc);
    p += done;
    n -= done;
    if constexpr (kCopy) dst += done;
  }
  return crc32c_hw3<kCopy>(dst, p, n, crc);
}
#endif

}  // namespace

std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc) {
  crc = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~crc32c_hw<false>(nullptr, bytes.data(), bytes.size(), crc);
#endif
  return ~crc32c_soft(bytes.data(), bytes.size(), crc);
}

std::uint32_t crc32c_copy(std::byte* dst, std::span<const std::byte> src, std::uint32_t crc) {
  crc = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~crc32c_hw<true>(dst, src.data(), src.size(), crc);
#endif
  if (!src.empty()) std::memcpy(dst, src.data(), src.size());
  return ~crc32c_soft(src.data(), src.size(), crc);
}

}  // namespace asgd
