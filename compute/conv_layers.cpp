#include "compute/conv_layers.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compute/blas.hpp"

namespace asgd {

namespace {

// Output length of a window of size k sliding with stride s over n padded by
// pad on both sides.
std::size_t conv_out(std::size_t n, std::size_t k, std::size_t s, std::size_t pad) {
  assert(n + 2 * pad >= k);
  return (n + 2 * pad - k) / s + 1;
}

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// ---- Threads ----------------------------------------------------------------

// Runs a job split into parts: part 0 on the calling thread, the others on
// helper threads started on first use and parked between jobs. Each layer
// that splits its work owns one: spawning threads per call cost 60-250 us on
// the 2-core VM, waking a parked one about 2 us. Not thread-safe (one caller).
class ForkJoin {
 public:
  ForkJoin() = default;
  ForkJoin(const ForkJoin&) = delete;
  ForkJoin& operator=(const ForkJoin&) = delete;
  ~ForkJoin() {
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }

  /// Calls fn(part) for every part in [0, parts), concurrently, and returns
  /// when all have returned. fn must not throw.
  template <class Fn>
  void run(std::size_t parts, Fn& fn) {
    if (parts <= 1) {
      fn(std::size_t{0});
      return;
    }
    while (helpers_.size() + 1 < parts) {
      const std::size_t part = helpers_.size() + 1;
      helpers_.emplace_back([this, part, seen = generation_.load()] { helper_loop(part, seen); });
    }
    call_ = [](void* f, std::size_t part) { (*static_cast<Fn*>(f))(part); };
    fn_ = &fn;
    parts_ = parts;
#if defined(__x86_64__)
    csr_ = _mm_getcsr();  // helpers flush denormals exactly when the caller does
#endif
    // Every helper takes part (those past `parts` do nothing), so that none
    // can still be reading this job's fields when the next one is written.
    pending_.store(static_cast<std::uint32_t>(helpers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    fn(std::size_t{0});
    for (std::uint32_t left; (left = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(left);
  }

 private:
  void helper_loop(std::size_t part, std::uint32_t seen) {
    for (;;) {
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      if (part < parts_) {
#if defined(__x86_64__)
        _mm_setcsr(csr_);
#endif
        call_(fn_, part);
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::vector<std::thread> helpers_;  // helper i runs part i + 1
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::uint32_t> pending_{0};
  std::atomic<bool> stop_{false};
  void (*call_)(void*, std::size_t) = nullptr;
  void* fn_ = nullptr;
  std::size_t parts_ = 0;
  unsigned csr_ = 0;
};

// How many parts to split a batch into: BLAS's thread count is the
// process's compute-thread budget (the runtime sets it from --threads).
std::size_t compute_parts(std::size_t batch) {
  return std::max<std::size_t>(1, std::min<std::size_t>(static_cast<std::size_t>(blas::threads()), batch));
}

// Samples [begin, end) of part `part` when `batch` samples are split evenly.
std::pair<std::size_t, std::size_t> part_range(std::size_t batch, std::size_t parts, std::size_t part) {
  return {batch * part / parts, batch * (part + 1) / parts};
}

// ---- Matrix products --------------------------------------------------------

// A matrix read through strides: element (i, r) is data[i * row + r * col],
// which lets one product read W, W^T or an im2col buffer without copies.
struct Strided {
  const float* data;
  std::size_t row, col;
};

bool have_avx512() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx512f");  // a property of the CPU, not state
  return yes;
#else
  return false;
#endif
}

#if defined(__x86_64__)
// C (mr, nr) (+)= A (mr, kc) * B (kc, nr) for mr <= MR rows and nr <= 16 NV
// columns, accumulating in MR x NV zmm registers: each step broadcasts one
// element of each A row and loads one row of B. Masked loads and stores
// handle a partial tile without reading or writing past nr; rows of A past
// mr read row 0 and are never stored. On the 2-core Xeon this reaches about
// 150 GFLOP/s a core (70% of its FMA peak), ahead of OpenBLAS 0.3.21 single-
// threaded on these narrow shapes, and leaves the threading to us.
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
  for (std::size_t r = 0; r < kc; ++r) {
    const std::size_t at = r * a.col;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], b + r * ldb + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(rows[i][at]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    if (static_cast<std::size_t>(i) < mr)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], acc[i][v]);
}

template <int MR, int NV>
void matmul_avx512(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
                   std::size_t ldc, bool accumulate) {
  constexpr std::size_t kCols = 16 * NV;
  // Column panels outermost: a panel of B (k x 16 NV) stays in L1/L2 while
  // every row block of A passes over it.
  for (std::size_t j = 0; j < n; j += kCols)
    for (std::size_t i = 0; i < m; i += MR)
      tile_avx512<MR, NV>(k, {a.data + i * a.row, a.row, a.col}, std::min<std::size_t>(MR, m - i), b + j, ldb,
                          std::min(kCols, n - j), c + i * ldc + j, ldc, accumulate);
}
#endif

// C (m, n) = A (m, k) * B (k, n), or C += A B when accumulate; B and C are
// row-major with leading dimensions ldb and ldc. Single-threaded: callers
// split their work across threads themselves.
void matmul(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
            std::size_t ldc, bool accumulate) {
#if defined(__x86_64__)
  if (have_avx512()) {
    // Pick the register tile that covers (m, n) in the fewest cycles: a step
    // costs about max(FMAs, loads) at two of each per cycle, and a partial
    // tile costs as much as a full one.
    struct Choice {
      std::size_t rows, vectors;
      void (*run)(std::size_t, std::size_t, std::size_t, Strided, const float*, std::size_t, float*, std::size_t, bool);
    };
    static constexpr Choice kChoices[] = {{8, 1, matmul_avx512<8, 1>},
                                          {8, 2, matmul_avx512<8, 2>},
                                          {8, 3, matmul_avx512<8, 3>},
                                          {6, 4, matmul_avx512<6, 4>}};
    const Choice* best = nullptr;
    std::size_t best_cost = 0;
    for (const Choice& ch : kChoices) {
      const std::size_t cost = ceil_div(m, ch.rows) * ceil_div(n, 16 * ch.vectors) *
                               std::max(ch.rows * ch.vectors, ch.rows + ch.vectors);
      if (!best || cost < best_cost) {
        best = &ch;
        best_cost = cost;
      }
    }
    best->run(m, n, k, a, b, ldb, c, ldc, accumulate);
    return;
  }
#endif
  const float beta = accumulate ? 1.0f : 0.0f;
  if (ldb == n && ldc == n && a.col == 1 && a.row == k) {
    blas::gemm(false, false, m, n, k, 1.0f, a.data, b, beta, c);
  } else if (ldb == n && ldc == n && a.row == 1 && a.col == m) {
    blas::gemm(true, false, m, n, k, 1.0f, a.data, b, beta, c);
  } else {
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
}

// ---- im2col -------------------------------------------------------------------

struct ConvGeometry {
  std::size_t c, h, w, k, s, pad, oh, ow;
  std::size_t plane() const { return oh * ow; }
  std::size_t rows() const { return c * k * k; }
};

// The output columns [lo, hi) whose input column ox * s + kj - pad lies
// inside the image; the rest read padding.
std::pair<std::size_t, std::size_t> valid_columns(const ConvGeometry& g, std::size_t kj) {
  const std::size_t lo = kj >= g.pad ? 0 : ceil_div(g.pad - kj, g.s);
  if (g.w + g.pad < kj + 1) return {0, 0};
  const std::size_t hi = std::min(g.ow, (g.w + g.pad - kj - 1) / g.s + 1);
  return {std::min(lo, hi), hi};
}

// col (C*k*k, OH*OW) with leading dimension ld: row (c, ki, kj) holds
// x[c][oh*s - pad + ki][ow*s - pad + kj] at every output position, zero
// where that falls into the padding. x is one sample (C, H, W). Plain loops
// rather than std::copy / std::fill: the runs are a dozen floats, where a
// memmove call cost more than the copy (18% of a conv's time went there).
void im2col(const ConvGeometry& g, const float* __restrict x, float* __restrict col, std::size_t ld) {
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t ki = 0; ki < g.k; ++ki)
      for (std::size_t kj = 0; kj < g.k; ++kj) {
        float* row = col + ((c * g.k + ki) * g.k + kj) * ld;
        const auto [lo, hi] = valid_columns(g, kj);
        for (std::size_t oy = 0; oy < g.oh; ++oy) {
          float* __restrict out = row + oy * g.ow;
          const std::size_t iy = oy * g.s + ki;  // + pad
          if (iy < g.pad || iy >= g.h + g.pad) {
            for (std::size_t ox = 0; ox < g.ow; ++ox) out[ox] = 0.0f;
            continue;
          }
          // Input column of output column ox is ox * s + kj - pad >= 0 on [lo, hi).
          const float* __restrict in = x + (c * g.h + iy - g.pad) * g.w + kj - g.pad;
          for (std::size_t ox = 0; ox < lo; ++ox) out[ox] = 0.0f;
          if (g.s == 1) {
            for (std::size_t ox = lo; ox < hi; ++ox) out[ox] = in[ox];
          } else {
            for (std::size_t ox = lo; ox < hi; ++ox) out[ox] = in[ox * g.s];
          }
          for (std::size_t ox = hi; ox < g.ow; ++ox) out[ox] = 0.0f;
        }
      }
}

// The adjoint of im2col: dx (C, H, W) is overwritten with the sum of every
// col entry at the input position it was copied from.
void col2im(const ConvGeometry& g, const float* __restrict col, std::size_t ld, float* __restrict dx) {
  for (std::size_t i = 0; i < g.c * g.h * g.w; ++i) dx[i] = 0.0f;
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t ki = 0; ki < g.k; ++ki)
      for (std::size_t kj = 0; kj < g.k; ++kj) {
        const float* row = col + ((c * g.k + ki) * g.k + kj) * ld;
        const auto [lo, hi] = valid_columns(g, kj);
        for (std::size_t oy = 0; oy < g.oh; ++oy) {
          const std::size_t iy = oy * g.s + ki;
          if (iy < g.pad || iy >= g.h + g.pad) continue;
          const float* __restrict in = row + oy * g.ow;
          float* __restrict out = dx + (c * g.h + iy - g.pad) * g.w + kj - g.pad;
          if (g.s == 1) {
            for (std::size_t ox = lo; ox < hi; ++ox) out[ox] += in[ox];
          } else {
            for (std::size_t ox = lo; ox < hi; ++ox) out[ox * g.s] += in[ox];
          }
        }
      }
}

#if defined(__x86_64__)
// The same two functions for strides 1 and 2 with AVX-512, on a copy of the
// sample with its zero padding written out (C, H + 2 pad, W + 2 pad): every
// run of a col row is then a plain (or every-other-element) copy of one
// padded input row, one or two masked vector moves for these image sizes.
// im2col was a third of a 3x3 conv's time in scalar code.

__mmask16 first_lanes(std::size_t n) { return static_cast<__mmask16>((1u << std::min<std::size_t>(n, 16)) - 1u); }

struct Padded {
  std::size_t h, w;  // padded plane
};

[[gnu::target("avx512f")]] void pad_copy(const ConvGeometry& g, const float* __restrict x, float* __restrict xp) {
  const Padded p{g.h + 2 * g.pad, g.w + 2 * g.pad};
  const __m512 zero = _mm512_setzero_ps();
  for (std::size_t c = 0; c < g.c; ++c) {
    float* plane = xp + c * p.h * p.w;
    for (std::size_t i = 0; i < g.pad * p.w; ++i) plane[i] = 0.0f;
    for (std::size_t i = (g.h + g.pad) * p.w; i < p.h * p.w; ++i) plane[i] = 0.0f;
    for (std::size_t y = 0; y < g.h; ++y) {
      float* out = plane + (y + g.pad) * p.w;
      const float* in = x + (c * g.h + y) * g.w;
      for (std::size_t i = 0; i < g.pad; ++i) out[i] = out[g.pad + g.w + i] = 0.0f;
      for (std::size_t i = 0; i < g.w; i += 16) {
        const __mmask16 m = first_lanes(g.w - i);
        _mm512_mask_storeu_ps(out + g.pad + i, m, _mm512_mask_loadu_ps(zero, m, in + i));
      }
    }
  }
}

// Moves one output row of ow values from / to a padded input row in chunks
// of 16, with the masks and gather indices worked out once per geometry so
// that the innermost loop is a load, a permute and a store.
struct RowChunks {
  std::size_t count;                   // ceil(ow / 16)
  __mmask16 out[4], in_lo[4], in_hi[4];  // per chunk: its outputs; for stride 2 its inputs
};

[[gnu::target("avx512f")]] RowChunks row_chunks(const ConvGeometry& g) {
  RowChunks rc{ceil_div(g.ow, 16), {}, {}, {}};
  assert(rc.count <= 4);
  for (std::size_t q = 0; q < rc.count; ++q) {
    const std::size_t n = std::min<std::size_t>(16, g.ow - 16 * q);
    const std::size_t span = 2 * n - 1;  // stride 2 reads the even elements of the next 2n - 1
    rc.out[q] = first_lanes(n);
    rc.in_lo[q] = first_lanes(span);
    rc.in_hi[q] = first_lanes(span > 16 ? span - 16 : 0);
  }
  return rc;
}

// One col row (c, ki, kj): oh output rows of ow values, read from the padded
// plane starting at `in`. Stride is a template parameter and the geometry
// locals, so that the loop keeps everything in registers.
template <int S>
[[gnu::target("avx512f")]] inline void gather_rows(const float* __restrict in, std::size_t in_step, std::size_t rows,
                                                   std::size_t ow, const RowChunks& rc, float* __restrict out) {
  const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  for (std::size_t oy = 0; oy < rows; ++oy, in += in_step, out += ow)
    for (std::size_t q = 0; q < rc.count; ++q) {
      if constexpr (S == 1) {
        _mm512_mask_storeu_ps(out + 16 * q, rc.out[q], _mm512_maskz_loadu_ps(rc.out[q], in + 16 * q));
      } else {
        const __m512 lo = _mm512_maskz_loadu_ps(rc.in_lo[q], in + 32 * q);
        const __m512 hi = _mm512_maskz_loadu_ps(rc.in_hi[q], in + 32 * q + 16);
        _mm512_mask_storeu_ps(out + 16 * q, rc.out[q], _mm512_permutex2var_ps(lo, evens, hi));
      }
    }
}

[[gnu::target("avx512f")]] void im2col_avx512(const ConvGeometry& g, const float* __restrict x, float* __restrict xp,
                                              float* __restrict col, std::size_t ld) {
  pad_copy(g, x, xp);
  const Padded p{g.h + 2 * g.pad, g.w + 2 * g.pad};
  const RowChunks rc = row_chunks(g);
  const std::size_t k = g.k, oh = g.oh, ow = g.ow, in_step = g.s * p.w;
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t ki = 0; ki < k; ++ki)
      for (std::size_t kj = 0; kj < k; ++kj) {
        float* out = col + ((c * k + ki) * k + kj) * ld;
        const float* in = xp + (c * p.h + ki) * p.w + kj;
        if (g.s == 1) {
          gather_rows<1>(in, in_step, oh, ow, rc, out);
        } else {
          gather_rows<2>(in, in_step, oh, ow, rc, out);
        }
      }
}

[[gnu::target("avx512f")]] void col2im_avx512(const ConvGeometry& g, const float* __restrict col, std::size_t ld,
                                              float* __restrict dxp, float* __restrict dx) {
  const Padded p{g.h + 2 * g.pad, g.w + 2 * g.pad};
  for (std::size_t i = 0; i < g.c * p.h * p.w; ++i) dxp[i] = 0.0f;
  const RowChunks rc = row_chunks(g);
  // Spread 8 values to the even lanes of 16, zeros between (index 16 reads
  // lane 0 of the zero operand).
  const __m512i spread_lo = _mm512_set_epi32(16, 7, 16, 6, 16, 5, 16, 4, 16, 3, 16, 2, 16, 1, 16, 0);
  const __m512i spread_hi = _mm512_set_epi32(16, 15, 16, 14, 16, 13, 16, 12, 16, 11, 16, 10, 16, 9, 16, 8);
  const __m512 zero = _mm512_setzero_ps();
  const std::size_t out_step = g.s * p.w;
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t ki = 0; ki < g.k; ++ki)
      for (std::size_t kj = 0; kj < g.k; ++kj) {
        const float* in = col + ((c * g.k + ki) * g.k + kj) * ld;
        float* out = dxp + (c * p.h + ki) * p.w + kj;
        for (std::size_t oy = 0; oy < g.oh; ++oy, in += g.ow, out += out_step)
          for (std::size_t q = 0; q < rc.count; ++q) {
            const __m512 v = _mm512_maskz_loadu_ps(rc.out[q], in + 16 * q);
            if (g.s == 1) {
              float* at = out + 16 * q;
              _mm512_mask_storeu_ps(at, rc.out[q], _mm512_add_ps(_mm512_maskz_loadu_ps(rc.out[q], at), v));
            } else {
              float* at = out + 32 * q;
              _mm512_mask_storeu_ps(at, rc.in_lo[q],
                                    _mm512_add_ps(_mm512_maskz_loadu_ps(rc.in_lo[q], at),
                                                  _mm512_permutex2var_ps(v, spread_lo, zero)));
              _mm512_mask_storeu_ps(at + 16, rc.in_hi[q],
                                    _mm512_add_ps(_mm512_maskz_loadu_ps(rc.in_hi[q], at + 16),
                                                  _mm512_permutex2var_ps(v, spread_hi, zero)));
            }
          }
      }
  // Crop the padding.
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t y = 0; y < g.h; ++y) {
      const float* in = dxp + (c * p.h + y + g.pad) * p.w + g.pad;
      float* out = dx + (c * g.h + y) * g.w;
      for (std::size_t i = 0; i < g.w; i += 16) {
        const __mmask16 m = first_lanes(g.w - i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_maskz_loadu_ps(m, in + i));
      }
    }
}
#endif

// The fastest im2col / col2im this CPU and geometry allow; `padded` is
// scratch for a padded copy of one sample (C, H + 2 pad, W + 2 pad).
bool vector_im2col(const ConvGeometry& g) { return have_avx512() && (g.s == 1 || g.s == 2) && g.ow <= 64; }

void im2col_any(const ConvGeometry& g, const float* x, float* padded, float* col, std::size_t ld) {
#if defined(__x86_64__)
  if (vector_im2col(g)) return im2col_avx512(g, x, padded, col, ld);
#endif
  (void)padded;
  im2col(g, x, col, ld);
}

void col2im_any(const ConvGeometry& g, const float* col, std::size_t ld, float* padded, float* dx) {
#if defined(__x86_64__)
  if (vector_im2col(g)) return col2im_avx512(g, col, ld, padded, dx);
#endif
  (void)padded;
  col2im(g, col, ld, dx);
}

// A leading dimension for n columns that keeps rows 64-byte aligned relative
// to each other and away from multiples of 4 KiB, where successive rows
// would contend for the same L1 sets (a 1024-float stride halved the speed
// of the product).
std::size_t padded_ld(std::size_t n) {
  std::size_t ld = ceil_div(n, 16) * 16;
  if (ld % 1024 == 0) ld += 16;
  return ld;
}

}  // namespace

// ---- Conv2D ---------------------------------------------------------------

// The batch is split into one contiguous range of samples per thread; each
// thread works through its range in groups of samples whose im2col buffer
// stays in its core's L2 cache, so a group's products read it from there.
struct Conv2D::Scratch {
  struct Part {
    std::vector<float> col;   // (C*k*k, ld): im2col of a group of samples side by side
    std::vector<float> out;   // (O, ld): forward product before it is scattered into y;
                              // backward: the group's dy side by side
    std::vector<float> dyt;   // (group * OH*OW, O): the group's dy, transposed
    std::vector<float> dcol;  // (C*k*k, ld)
    std::vector<float> dwt;   // (C*k*k, O): this part's dW, transposed
    std::vector<float> db;    // (O,)
    std::vector<float> padded;  // (C, H + 2 pad, W + 2 pad): one sample with its padding
  };
  ForkJoin threads;
  std::vector<Part> parts;
};

namespace {

// How a call splits its batch, shared by forward and backward.
struct ConvPlan {
  std::size_t parts;  // threads
  std::size_t group;  // samples per product
  std::size_t ld;     // leading dimension of the group buffers
};

ConvPlan plan_conv(const ConvGeometry& g, std::size_t batch) {
  ConvPlan p{};
  if (!have_avx512()) {
    // BLAS threads itself and needs packed leading dimensions.
    p.parts = 1;
    p.group = 1;
    p.ld = g.plane();
    return p;
  }
  p.parts = compute_parts(batch);
  // About 256 KiB of im2col per group: enough columns for full register
  // tiles when planes are small (7x7), and well inside a core's 2 MiB L2.
  constexpr std::size_t kColFloats = 64 * 1024;
  const std::size_t per_part = ceil_div(batch, p.parts);
  p.group = std::clamp<std::size_t>(kColFloats / (g.rows() * g.plane()), 1, std::max<std::size_t>(per_part, 1));
  p.ld = padded_ld(p.group * g.plane());
  return p;
}

}  // namespace

Conv2D::Conv2D(std::size_t in_channels, std::size_t out_channels, std::size_t kernel, std::size_t stride,
               std::size_t pad, bool bias)
    : in_(in_channels),
      out_(out_channels),
      k_(kernel),
      stride_(stride),
      pad_(pad),
      bias_(bias),
      scratch_(std::make_unique<Scratch>()) {
  assert(in_ > 0 && out_ > 0 && k_ > 0 && stride_ > 0);
}

Conv2D::~Conv2D() = default;

Shape Conv2D::output_shape(const Shape& input) const {
  assert(input.size() == 3 && input[0] == in_);
  return {out_, conv_out(input[1], k_, stride_, pad_), conv_out(input[2], k_, stride_, pad_)};
}

std::vector<ParamSpec> Conv2D::param_specs() const {
  const std::size_t fan_in = in_ * k_ * k_;
  std::vector<ParamSpec> specs = {{"weight", {out_, in_, k_, k_}, Init::he_uniform, fan_in}};
  if (bias_) specs.push_back({"bias", {out_}, Init::zeros, fan_in});
  return specs;
}

void Conv2D::bind(std::span<float> params, std::span<float> grads) {
  const std::size_t wsize = out_ * in_ * k_ * k_;
  assert(params.size() == wsize + (bias_ ? out_ : 0) && grads.size() == params.size());
  w_ = params.data();
  dw_ = grads.data();
  b_ = bias_ ? w_ + wsize : nullptr;
  db_ = bias_ ? dw_ + wsize : nullptr;
}

void Conv2D::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4 && x.shape[1] == in_);
  const std::size_t batch = x.shape[0];
  const ConvGeometry g{in_, x.shape[2], x.shape[3], k_, stride_, pad_, conv_out(x.shape[2], k_, stride_, pad_),
                       conv_out(x.shape[3], k_, stride_, pad_)};
  const std::size_t plane = g.plane(), rows = g.rows(), in_size = in_ * g.h * g.w;
  y.resize({batch, out_, g.oh, g.ow});
  const ConvPlan plan = plan_conv(g, batch);
  scratch_->parts.resize(plan.parts);
  for (Scratch::Part& part : scratch_->parts) {
    part.col.resize(rows * plan.ld);
    part.padded.resize(in_ * (g.h + 2 * pad_) * (g.w + 2 * pad_));
    if (plan.group > 1) part.out.resize(out_ * plan.ld);
  }
  const Strided w{w_, rows, 1};  // (O, C*k*k)
  auto work = [&](std::size_t index) {
    Scratch::Part& part = scratch_->parts[index];
    const auto [begin, end] = part_range(batch, plan.parts, index);
    for (std::size_t b0 = begin; b0 < end; b0 += plan.group) {
      const std::size_t n = std::min(plan.group, end - b0);
      for (std::size_t j = 0; j < n; ++j)
        im2col_any(g, x.data + (b0 + j) * in_size, part.padded.data(), part.col.data() + j * plane, plan.ld);
      if (n == 1) {
        // y_b (O, P) = [b +] W (O, C*k*k) * col (C*k*k, P), straight into y.
        float* yb = y.data() + b0 * out_ * plane;
        if (bias_)
          for (std::size_t o = 0; o < out_; ++o) std::fill(yb + o * plane, yb + (o + 1) * plane, b_[o]);
        matmul(out_, plane, rows, w, part.col.data(), plan.ld, yb, plane, bias_);
        continue;
      }
      // out (O, n*P) = W * col, then each sample's columns go to its y_b.
      matmul(out_, n * plane, rows, w, part.col.data(), plan.ld, part.out.data(), plan.ld, false);
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t o = 0; o < out_; ++o) {
          const float* __restrict src = part.out.data() + o * plan.ld + j * plane;
          float* __restrict dst = y.data() + ((b0 + j) * out_ + o) * plane;
          const float shift = bias_ ? b_[o] : 0.0f;
          for (std::size_t p = 0; p < plane; ++p) dst[p] = src[p] + shift;
        }
    }
  };
  scratch_->threads.run(plan.parts, work);
}

void Conv2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  const ConvGeometry g{in_, x.shape[2], x.shape[3], k_, stride_, pad_, conv_out(x.shape[2], k_, stride_, pad_),
                       conv_out(x.shape[3], k_, stride_, pad_)};
  const std::size_t plane = g.plane(), rows = g.rows(), in_size = in_ * g.h * g.w;
  if (dx) dx->resize(x.shape);
  const ConvPlan plan = plan_conv(g, batch);
  scratch_->parts.resize(plan.parts);
  for (Scratch::Part& part : scratch_->parts) {
    part.col.resize(rows * plan.ld);
    part.padded.resize(in_ * (g.h + 2 * pad_) * (g.w + 2 * pad_));
    part.dyt.resize(plan.group * plane * out_);
    part.dwt.resize(rows * out_);
    part.db.resize(out_);
    if (plan.group > 1) part.out.resize(out_ * plan.ld);
    if (dx) part.dcol.resize(rows * plan.ld);
  }
  const Strided wt{w_, 1, rows};  // W^T (C*k*k, O)
  auto work = [&](std::size_t index) {
    Scratch::Part& part = scratch_->parts[index];
    std::fill(part.dwt.begin(), part.dwt.end(), 0.0f);
    std::fill(part.db.begin(), part.db.end(), 0.0f);
    const auto [begin, end] = part_range(batch, plan.parts, index);
    for (std::size_t b0 = begin; b0 < end; b0 += plan.group) {
      const std::size_t n = std::min(plan.group, end - b0);
      const float* dy0 = dy.data() + b0 * out_ * plane;
      // The group's dy as (O, n*P) for dx, and transposed, (n*P, O), for dW.
      const float* dyg = dy0;
      std::size_t lddy = plane;
      if (n > 1) {
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t o = 0; o < out_; ++o) {
            const float* src = dy0 + (j * out_ + o) * plane;
            std::copy(src, src + plane, part.out.data() + o * plan.ld + j * plane);
          }
        dyg = part.out.data();
        lddy = plan.ld;
      }
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t o = 0; o < out_; ++o) {
          const float* src = dy0 + (j * out_ + o) * plane;
          float* dst = part.dyt.data() + j * plane * out_ + o;
          float sum = 0.0f;
          for (std::size_t p = 0; p < plane; ++p) {
            dst[p * out_] = src[p];
            sum += src[p];
          }
          part.db[o] += sum;
        }
      for (std::size_t j = 0; j < n; ++j)
        im2col_any(g, x.data + (b0 + j) * in_size, part.padded.data(), part.col.data() + j * plane, plan.ld);
      // dW^T (C*k*k, O) += col (C*k*k, n*P) * dy^T (n*P, O)
      matmul(rows, out_, n * plane, {part.col.data(), plan.ld, 1}, part.dyt.data(), out_, part.dwt.data(), out_, true);
      if (dx) {
        // dcol (C*k*k, n*P) = W^T (C*k*k, O) * dy (O, n*P), folded back onto dx.
        matmul(rows, n * plane, out_, wt, dyg, lddy, part.dcol.data(), plan.ld, false);
        for (std::size_t j = 0; j < n; ++j)
          col2im_any(g, part.dcol.data() + j * plane, plan.ld, part.padded.data(), dx->data() + (b0 + j) * in_size);
      }
    }
  };
  scratch_->threads.run(plan.parts, work);
  // dW (O, C*k*k) = sum over parts of dW^T; db likewise.
  for (std::size_t o = 0; o < out_; ++o)
    for (std::size_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (const Scratch::Part& part : scratch_->parts) sum += part.dwt[r * out_ + o];
      dw_[o * rows + r] = sum;
    }
  if (bias_)
    for (std::size_t o = 0; o < out_; ++o) {
      float sum = 0.0f;
      for (const Scratch::Part& part : scratch_->parts) sum += part.db[o];
      db_[o] = sum;
    }
}

// ---- MaxPool2D ------------------------------------------------------------

Shape MaxPool2D::output_shape(const Shape& input) const {
  assert(input.size() == 3);
  return {input[0], conv_out(input[1], k_, stride_, 0), conv_out(input[2], k_, stride_, 0)};
}

void MaxPool2D::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4);
  const std::size_t batch = x.shape[0], channels = x.shape[1], h = x.shape[2], w = x.shape[3];
  const std::size_t oh = conv_out(h, k_, stride_, 0), ow = conv_out(w, k_, stride_, 0);
  y.resize({batch, channels, oh, ow});
  argmax_.resize(batch * channels * oh * ow);
  float* out = y.data();
  std::uint32_t* arg = argmax_.data();
  for (std::size_t plane = 0; plane < batch * channels; ++plane) {
    const float* in = x.data + plane * h * w;
    for (std::size_t oy = 0; oy < oh; ++oy)
      for (std::size_t ox = 0; ox < ow; ++ox) {
        std::size_t best_at = oy * stride_ * w + ox * stride_;
        float best = in[best_at];
        // Row-major scan with a strict > keeps the first maximum, as PyTorch.
        for (std::size_t i = 0; i < k_; ++i)
          for (std::size_t j = 0; j < k_; ++j) {
            const std::size_t at = (oy * stride_ + i) * w + ox * stride_ + j;
            if (in[at] > best) {
              best = in[at];
              best_at = at;
            }
          }
        *out++ = best;
        *arg++ = static_cast<std::uint32_t>(best_at);
      }
  }
}

void MaxPool2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t planes = x.shape[0] * x.shape[1];
  const std::size_t in_plane = x.shape[2] * x.shape[3];
  const std::size_t out_plane = dy.size() / std::max<std::size_t>(planes, 1);
  std::fill(dx->data(), dx->data() + dx->size(), 0.0f);
  const float* g = dy.data();
  const std::uint32_t* arg = argmax_.data();
  for (std::size_t plane = 0; plane < planes; ++plane) {
    float* out = dx->data() + plane * in_plane;
    // += because overlapping windows (stride < kernel) can share a maximum.
    for (std::size_t i = 0; i < out_plane; ++i) out[arg[i]] += g[i];
    g += out_plane;
    arg += out_plane;
  }
}

// ---- GlobalAvgPool --------------------------------------------------------

Shape GlobalAvgPool::output_shape(const Shape& input) const {
  assert(input.size() == 3);
  return {input[0]};
}

void GlobalAvgPool::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4);
  const std::size_t planes = x.shape[0] * x.shape[1];
  const std::size_t plane = x.shape[2] * x.shape[3];
  y.resize({x.shape[0], x.shape[1]});
  const float scale = 1.0f / static_cast<float>(plane);
  for (std::size_t i = 0; i < planes; ++i) {
    const float* in = x.data + i * plane;
    float sum = 0.0f;
    for (std::size_t j = 0; j < plane; ++j) sum += in[j];
    y[i] = sum * scale;
  }
}

void GlobalAvgPool::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t planes = x.shape[0] * x.shape[1];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const float scale = 1.0f / static_cast<float>(plane);
  for (std::size_t i = 0; i < planes; ++i) {
    float* out = dx->data() + i * plane;
    std::fill(out, out + plane, dy[i] * scale);
  }
}

// ---- BatchNorm2D ----------------------------------------------------------

BatchNorm2D::BatchNorm2D(std::size_t channels, float eps, float momentum)
    : c_(channels),
      eps_(eps),
      momentum_(momentum),
      running_mean_(channels, 0.0f),
      running_var_(channels, 1.0f),
      mean_(channels, 0.0f),
      inv_std_(channels, 1.0f) {}

std::vector<ParamSpec> BatchNorm2D::param_specs() const {
  return {{"weight", {c_}, Init::ones, 0}, {"bias", {c_}, Init::zeros, 0}};
}

void BatchNorm2D::bind(std::span<float> params, std::span<float> grads) {
  assert(params.size() == 2 * c_ && grads.size() == params.size());
  gamma_ = params.data();
  beta_ = gamma_ + c_;
  dgamma_ = grads.data();
  dbeta_ = dgamma_ + c_;
}

std::vector<LayerBuffer> BatchNorm2D::buffers() {
  return {{"running_mean", running_mean_}, {"running_var", running_var_}};
}

void BatchNorm2D::begin_recalibration() {
  // torch's reset_running_stats(), then momentum=None averages the batches.
  std::fill(running_mean_.begin(), running_mean_.end(), 0.0f);
  std::fill(running_var_.begin(), running_var_.end(), 1.0f);
  cumulative_ = true;
  batches_seen_ = 0;
}

void BatchNorm2D::end_recalibration() { cumulative_ = false; }

void BatchNorm2D::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4 && x.shape[1] == c_);
  const std::size_t batch = x.shape[0];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const std::size_t n = batch * plane;
  y.resize(x.shape);
  if (training_ && n > 0) {
    // Two passes in double: the variance as E[(x - mean)^2] does not cancel.
    float factor = momentum_;
    if (cumulative_) factor = 1.0f / static_cast<float>(++batches_seen_);
    for (std::size_t c = 0; c < c_; ++c) {
      double sum = 0.0;
      for (std::size_t b = 0; b < batch; ++b) {
        const float* in = x.data + (b * c_ + c) * plane;
        for (std::size_t i = 0; i < plane; ++i) sum += in[i];
      }
      const double mean = sum / static_cast<double>(n);
      double sq = 0.0;
      for (std::size_t b = 0; b < batch; ++b) {
        const float* in = x.data + (b * c_ + c) * plane;
        for (std::size_t i = 0; i < plane; ++i) {
          const double d = in[i] - mean;
          sq += d * d;
        }
      }
      const double var = sq / static_cast<double>(n);
      const double unbiased = n > 1 ? sq / static_cast<double>(n - 1) : var;
      mean_[c] = static_cast<float>(mean);
      inv_std_[c] = static_cast<float>(1.0 / std::sqrt(var + eps_));
      running_mean_[c] = (1.0f - factor) * running_mean_[c] + factor * static_cast<float>(mean);
      running_var_[c] = (1.0f - factor) * running_var_[c] + factor * static_cast<float>(unbiased);
    }
  } else {
    for (std::size_t c = 0; c < c_; ++c) {
      mean_[c] = running_mean_[c];
      inv_std_[c] = 1.0f / std::sqrt(running_var_[c] + eps_);
    }
  }
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t c = 0; c < c_; ++c) {
      // y = (x - mean) * inv_std * gamma + beta = x * scale + shift
      const float scale = inv_std_[c] * gamma_[c];
      const float shift = beta_[c] - mean_[c] * scale;
      const float* __restrict in = x.data + (b * c_ + c) * plane;
      float* __restrict out = y.data() + (b * c_ + c) * plane;
      for (std::size_t i = 0; i < plane; ++i) out[i] = in[i] * scale + shift;
    }
}

void BatchNorm2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const std::size_t n = batch * plane;
  if (dx) dx->resize(x.shape);
  for (std::size_t c = 0; c < c_; ++c) {
    const float mean = mean_[c], inv_std = inv_std_[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (std::size_t b = 0; b < batch; ++b) {
      const float* in = x.data + (b * c_ + c) * plane;
      const float* g = dy.data() + (b * c_ + c) * plane;
      for (std::size_t i = 0; i < plane; ++i) {
        sum_dy += g[i];
        sum_dy_xhat += static_cast<double>(g[i]) * ((in[i] - mean) * inv_std);
      }
    }
    dbeta_[c] = static_cast<float>(sum_dy);
    dgamma_[c] = static_cast<float>(sum_dy_xhat);
    if (!dx) continue;
    const float k = gamma_[c] * inv_std;
    // Training mode: the batch statistics depend on x too, which subtracts
    // the mean gradient and its projection on xhat. Inference mode: affine.
    const float mean_dy = training_ && n > 0 ? static_cast<float>(sum_dy / static_cast<double>(n)) : 0.0f;
    const float mean_dy_xhat = training_ && n > 0 ? static_cast<float>(sum_dy_xhat / static_cast<double>(n)) : 0.0f;
    for (std::size_t b = 0; b < batch; ++b) {
      const float* __restrict in = x.data + (b * c_ + c) * plane;
      const float* __restrict g = dy.data() + (b * c_ + c) * plane;
      float* __restrict out = dx->data() + (b * c_ + c) * plane;
      for (std::size_t i = 0; i < plane; ++i) {
        const float xhat = (in[i] - mean) * inv_std;
        out[i] = k * (g[i] - mean_dy - xhat * mean_dy_xhat);
      }
    }
  }
}

// ---- Flatten --------------------------------------------------------------

void Flatten::forward(ConstTensorView x, Tensor& y) {
  const std::size_t batch = x.shape[0];
  y.resize({batch, batch ? x.size() / batch : 0});
  std::copy(x.data, x.data + x.size(), y.data());
}

void Flatten::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  std::copy(dy.data(), dy.data() + dy.size(), dx->data());
}

// ---- Dropout --------------------------------------------------------------

void Dropout::forward(ConstTensorView x, Tensor& y) {
  y.resize(x.shape);
  const std::size_t n = x.size();
  if (!training_) {
    mask_.clear();  // backward passes the gradient through unchanged
    std::copy(x.data, x.data + n, y.data());
    return;
  }
  mask_.resize(n);
  // p = 1 drops everything (torch gives zeros, not 0 * inf).
  const float keep_scale = p_ < 1.0f ? 1.0f / (1.0f - p_) : 0.0f;
  for (std::size_t i = 0; i < n; ++i) mask_[i] = rng_.uniform() < p_ ? 0.0f : keep_scale;
  for (std::size_t i = 0; i < n; ++i) y[i] = x.data[i] * mask_[i];
}

void Dropout::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t n = dy.size();
  if (mask_.size() != n) {
    std::copy(dy.data(), dy.data() + n, dx->data());
    return;
  }
  for (std::size_t i = 0; i < n; ++i) (*dx)[i] = dy[i] * mask_[i];
}

// ---- Residual -------------------------------------------------------------

namespace {

std::size_t params_of(const Layer& layer) {
  std::size_t n = 0;
  for (const ParamSpec& spec : layer.param_specs()) n += numel(spec.shape);
  return n;
}

ConstTensorView view(const Tensor& t) { return {t.data(), t.shape()}; }

void add_into(Tensor& acc, const Tensor& other) {
  assert(acc.size() == other.size());
  float* __restrict a = acc.data();
  const float* __restrict b = other.data();
  for (std::size_t i = 0; i < acc.size(); ++i) a[i] += b[i];
}

}  // namespace

Residual::Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut)
    : main_(std::move(main)),
      shortcut_(std::move(shortcut)),
      main_acts_(main_.size()),
      shortcut_acts_(shortcut_.size()) {}

Residual::~Residual() = default;

Shape Residual::output_shape(const Shape& input) const {
  Shape main_shape = input;
  for (const auto& layer : main_) main_shape = layer->output_shape(main_shape);
  [[maybe_unused]] Shape short_shape = input;
  for (const auto& layer : shortcut_) short_shape = layer->output_shape(short_shape);
  assert(main_shape == short_shape);
  return main_shape;
}

std::vector<ParamSpec> Residual::param_specs() const {
  std::vector<ParamSpec> specs;
  auto add = [&](const std::vector<std::unique_ptr<Layer>>& path, const std::string& prefix) {
    for (std::size_t i = 0; i < path.size(); ++i)
      for (ParamSpec spec : path[i]->param_specs()) {
        spec.name = prefix + std::to_string(i) + "." + spec.name;
        specs.push_back(std::move(spec));
      }
  };
  add(main_, "main.");
  add(shortcut_, "shortcut.");
  return specs;
}

void Residual::bind(std::span<float> params, std::span<float> grads) {
  assert(grads.size() == params.size());
  std::size_t offset = 0;
  for (auto* path : {&main_, &shortcut_})
    for (const auto& layer : *path) {
      const std::size_t n = params_of(*layer);
      layer->bind(params.subspan(offset, n), grads.subspan(offset, n));
      offset += n;
    }
  assert(offset == params.size());
}

void Residual::set_training(bool training) {
  for (Layer* layer : children()) layer->set_training(training);
}

std::vector<LayerBuffer> Residual::buffers() {
  std::vector<LayerBuffer> all;
  auto add = [&](const std::vector<std::unique_ptr<Layer>>& path, const std::string& prefix) {
    for (std::size_t i = 0; i < path.size(); ++i)
      for (LayerBuffer buffer : path[i]->buffers()) {
        buffer.name = prefix + std::to_string(i) + "." + buffer.name;
        all.push_back(std::move(buffer));
      }
  };
  add(main_, "main.");
  add(shortcut_, "shortcut.");
  return all;
}

std::vector<Layer*> Residual::children() {
  std::vector<Layer*> all;
  for (const auto& layer : main_) all.push_back(layer.get());
  for (const auto& layer : shortcut_) all.push_back(layer.get());
  return all;
}

void Residual::reseed(std::uint64_t seed) {
  // A stream per sub-layer, so that two dropouts in one block differ.
  const std::vector<Layer*> all = children();
  for (std::size_t i = 0; i < all.size(); ++i) all[i]->reseed(mix_seed(seed, i));
}

void Residual::forward(ConstTensorView x, Tensor& y) {
  auto run = [&](std::vector<std::unique_ptr<Layer>>& path, std::vector<Tensor>& acts) -> ConstTensorView {
    ConstTensorView in = x;
    for (std::size_t i = 0; i < path.size(); ++i) {
      path[i]->forward(in, acts[i]);
      in = view(acts[i]);
    }
    return in;
  };
  const ConstTensorView main_out = run(main_, main_acts_);
  const ConstTensorView short_out = run(shortcut_, shortcut_acts_);
  assert(main_out.shape == short_out.shape);
  y.resize(main_out.shape);
  const float* __restrict a = main_out.data;
  const float* __restrict b = short_out.data;
  float* __restrict out = y.data();
  for (std::size_t i = 0; i < y.size(); ++i) out[i] = a[i] + b[i];
}

void Residual::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  // Backpropagates dy through one path, ping-ponging between grad_a_ and
  // grad_b_; the path's input gradient lands in `out` (skipped when null).
  auto run = [&](std::vector<std::unique_ptr<Layer>>& path, std::vector<Tensor>& acts, Tensor* out) {
    if (path.empty()) {
      if (out) *out = dy;
      return;
    }
    const Tensor* g = &dy;
    for (std::size_t i = path.size(); i-- > 0;) {
      const ConstTensorView in = i == 0 ? x : view(acts[i - 1]);
      Tensor* target = i == 0 ? out : (g == &grad_a_ ? &grad_b_ : &grad_a_);
      path[i]->backward(in, acts[i], *g, target);
      g = target;
    }
  };
  run(main_, main_acts_, dx);
  if (!dx) {
    run(shortcut_, shortcut_acts_, nullptr);
    return;
  }
  if (shortcut_.empty()) {
    add_into(*dx, dy);
  } else {
    run(shortcut_, shortcut_acts_, &grad_short_);
    add_into(*dx, grad_short_);
  }
}

}  // namespace asgd
