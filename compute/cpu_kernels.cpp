#include "compute/cpu_kernels.hpp"

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compute/blas.hpp"

namespace asgd::cpu {

bool have_avx512() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx512f");  // a property of the CPU, not state
  return yes;
#else
  return false;
#endif
}

namespace {

#if defined(__x86_64__)
// C (mr, nr) (+)= A (mr, kc) * B (kc, nr) for mr <= MR rows and nr <= 16 NV
// columns, accumulating in MR x NV zmm registers: each step broadcasts one
// element of each A row and loads one row of B. Masked loads and stores
// handle a partial tile without reading or writing past nr; rows of A past
// mr read row 0 and are never stored. On the 2-core Xeon this reaches about
// 150 GFLOP/s a core (70% of its FMA peak), ahead of OpenBLAS 0.3.21 single-
// threaded on these narrow shapes, and leaves the threading to us.
template <int MR, int NV, bool kFull>
[[gnu::target("avx512f"), gnu::always_inline]] inline void tile_steps(std::size_t kc, const float* const* rows,
                                                                      std::size_t a_col, const float* __restrict b,
                                                                      std::size_t ldb, const __mmask16* mask,
                                                                      __m512 (&acc)[MR][NV]) {
  for (std::size_t r = 0; r < kc; ++r) {
    const std::size_t at = r * a_col;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (kFull) {
        bv[v] = _mm512_loadu_ps(b + r * ldb + 16 * v);
      } else {
        bv[v] = _mm512_maskz_loadu_ps(mask[v], b + r * ldb + 16 * v);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(rows[i][at]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
}

template <int MR, int NV>
[[gnu::target("avx512f")]] void tile_avx512(std::size_t kc, Strided a, std::size_t mr, const float* __restrict b,
                                            std::size_t ldb, std::size_t nr, float* __restrict c, std::size_t ldc,
                                            bool accumulate) {
  __mmask16 mask[NV];
  for (int v = 0; v < NV; ++v) {
    const std::size_t lo = 16 * static_cast<std::size_t>(v);
    const std::size_t lanes = nr > lo ? std::min<std::size_t>(16, nr - lo) : 0;
    mask[v] = static_cast<__mmask16>((1u << lanes) - 1u);
  }
  const float* rows[MR];
  for (int i = 0; i < MR; ++i) rows[i] = a.data + (static_cast<std::size_t>(i) < mr ? i : 0) * a.row;
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate && static_cast<std::size_t>(i) < mr ? _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v)
                                                                 : _mm512_setzero_ps();
  // The common full tile loads B without masks: GCC otherwise reloads the
  // mask registers from the stack on every step.
  if (nr == 16 * NV) {
    tile_steps<MR, NV, true>(kc, rows, a.col, b, ldb, mask, acc);
  } else {
    tile_steps<MR, NV, false>(kc, rows, a.col, b, ldb, mask, acc);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    if (static_cast<std::size_t>(i) < mr)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], acc[i][v]);
}

template <int MR, int NV>
void matmul_tiles(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
                   std::size_t ldc, bool accumulate) {
  constexpr std::size_t kCols = 16 * NV;
  // Column panels outside row blocks: a panel of B (k x 16 NV) stays in L1
  // or L2 while every row block of A passes over it. (Blocking k as well
  // measured no faster for these depths, 25 to 1600.)
  for (std::size_t j = 0; j < n; j += kCols)
    for (std::size_t i = 0; i < m; i += MR)
      tile_avx512<MR, NV>(k, {a.data + i * a.row, a.row, a.col}, std::min<std::size_t>(MR, m - i), b + j, ldb,
                          std::min(kCols, n - j), c + i * ldc + j, ldc, accumulate);
}
#endif

#if defined(__x86_64__)
// C (4, 4) += A (4, n) * B (4, n)^T: 16 dot products of rows, each summed in
// a zmm of partial sums over 16 columns at a time and reduced once at the
// end. For weight gradients with few columns (a first layer's C*k*k = 9),
// where a register tile over those columns would be mostly empty. Rows past
// ma / mb read row 0 and are never stored.
[[gnu::target("avx512f")]] void dot_tile_avx512(std::size_t n, const float* a, std::size_t lda, std::size_t ma,
                                                const float* b, std::size_t ldb, std::size_t mb, float* c,
                                                std::size_t ldc) {
  constexpr int kTile = 4;
  const float* ra[kTile];
  const float* rb[kTile];
  for (int i = 0; i < kTile; ++i) {
    ra[i] = a + (static_cast<std::size_t>(i) < ma ? i : 0) * lda;
    rb[i] = b + (static_cast<std::size_t>(i) < mb ? i : 0) * ldb;
  }
  __m512 acc[kTile][kTile];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (std::size_t t = 0; t < n; t += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<std::size_t>(16, n - t)) - 1u);
    __m512 va[kTile], vb[kTile];
#pragma GCC unroll 4
    for (int i = 0; i < kTile; ++i) {
      va[i] = _mm512_maskz_loadu_ps(m, ra[i] + t);
      vb[i] = _mm512_maskz_loadu_ps(m, rb[i] + t);
    }
#pragma GCC unroll 4
    for (int i = 0; i < kTile; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < kTile; ++j) acc[i][j] = _mm512_fmadd_ps(va[i], vb[j], acc[i][j]);
  }
  // (_mm512_reduce_add_ps trips GCC 12's -Wmaybe-uninitialized in its own header.)
  alignas(64) float lanes[16];
  for (std::size_t i = 0; i < std::min<std::size_t>(ma, kTile); ++i)
    for (std::size_t j = 0; j < std::min<std::size_t>(mb, kTile); ++j) {
      _mm512_store_ps(lanes, acc[i][j]);
      float sum = 0.0f;
      for (float v : lanes) sum += v;
      c[i * ldc + j] += sum;
    }
}
#endif

}  // namespace

void matmul_avx512(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
                   std::size_t ldc, bool accumulate) {
#if defined(__x86_64__)
  // Pick the register tile that covers (m, n) in the fewest cycles: a step
  // costs about max(FMAs, loads) at two of each per cycle, and a partial
  // tile costs as much as a full one.
  struct Choice {
    std::size_t rows, vectors;
    void (*run)(std::size_t, std::size_t, std::size_t, Strided, const float*, std::size_t, float*, std::size_t, bool);
  };
  static constexpr Choice kChoices[] = {{8, 1, matmul_tiles<8, 1>},
                                        {8, 2, matmul_tiles<8, 2>},
                                        {8, 3, matmul_tiles<8, 3>},
                                        {6, 4, matmul_tiles<6, 4>}};
  const Choice* best = nullptr;
  std::size_t best_cost = 0;
  for (const Choice& ch : kChoices) {
    const std::size_t cost =
        ceil_div(m, ch.rows) * ceil_div(n, 16 * ch.vectors) * std::max(ch.rows * ch.vectors, ch.rows + ch.vectors);
    if (!best || cost < best_cost) {
      best = &ch;
      best_cost = cost;
    }
  }
  best->run(m, n, k, a, b, ldb, c, ldc, accumulate);
#else
  matmul_reference(m, n, k, a, b, ldb, c, ldc, accumulate);
#endif
}

void matmul_reference(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb,
                      float* c, std::size_t ldc, bool accumulate) {
  for (std::size_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) std::fill(ci, ci + n, 0.0f);
    for (std::size_t r = 0; r < k; ++r) {
      const float air = a.data[i * a.row + r * a.col];
      const float* br = b + r * ldb;
      for (std::size_t j = 0; j < n; ++j) ci[j] += air * br[j];
    }
  }
}

void matmul(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
            std::size_t ldc, bool accumulate) {
  if (have_avx512()) return matmul_avx512(m, n, k, a, b, ldb, c, ldc, accumulate);
  const float beta = accumulate ? 1.0f : 0.0f;
  if (ldb == n && ldc == n && a.col == 1 && a.row == k) {
    blas::gemm(false, false, m, n, k, 1.0f, a.data, b, beta, c);
  } else if (ldb == n && ldc == n && a.row == 1 && a.col == m) {
    blas::gemm(true, false, m, n, k, 1.0f, a.data, b, beta, c);
  } else {
    matmul_reference(m, n, k, a, b, ldb, c, ldc, accumulate);
  }
}

void dot_products_avx512(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda,
                         const float* b, std::size_t ldb, float* c, std::size_t ldc) {
#if defined(__x86_64__)
  for (std::size_t i = 0; i < ma; i += 4)
    for (std::size_t j = 0; j < mb; j += 4)
      dot_tile_avx512(n, a + i * lda, lda, ma - i, b + j * ldb, ldb, mb - j, c + i * ldc + j, ldc);
#else
  dot_products_reference(ma, mb, n, a, lda, b, ldb, c, ldc);
#endif
}

void dot_products_reference(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda,
                            const float* b, std::size_t ldb, float* c, std::size_t ldc) {
  for (std::size_t i = 0; i < ma; ++i)
    for (std::size_t j = 0; j < mb; ++j) {
      float sum = 0.0f;
      for (std::size_t t = 0; t < n; ++t) sum += a[i * lda + t] * b[j * ldb + t];
      c[i * ldc + j] += sum;
    }
}

void dot_products(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda, const float* b,
                  std::size_t ldb, float* c, std::size_t ldc) {
  if (have_avx512()) return dot_products_avx512(ma, mb, n, a, lda, b, ldb, c, ldc);
  if (lda == n && ldb == n && ldc == mb) return blas::gemm(false, true, ma, mb, n, 1.0f, a, b, 1.0f, c);
  dot_products_reference(ma, mb, n, a, lda, b, ldb, c, ldc);
}

}  // namespace asgd::cpu
