#include "compute/conv_layers.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
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

// Runs a job of numbered chunks on the calling thread plus helper threads
// started on first use and parked between jobs. Thread t owns the t-th of
// `threads` equal runs of chunks, so that consecutive layers, which cut the
// batch alike, find their samples in the same core's cache; a thread that
// has finished its own run takes chunks from the others', so one that starts
// late (its core busy with other work, as on a worker's machine beside its
// messaging threads) does not hold up the rest. Each layer that splits its
// work owns one: spawning threads per call cost 60-250 us on the 2-core VM,
// waking a parked one about 2 us. Not thread-safe (one caller at a time).
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

  /// Calls fn(chunk, thread) for every chunk in [0, chunks) on up to
  /// `threads` threads (thread 0 is the caller; `thread` indexes per-thread
  /// scratch) and returns when all calls have returned. Which thread runs a
  /// chunk varies from call to call, so results that must not depend on it
  /// are accumulated per chunk. fn must not throw.
  template <class Fn>
  void run(std::size_t threads, std::size_t chunks, Fn& fn) {
    threads = std::min(threads, chunks);
    if (threads <= 1) {
      for (std::size_t c = 0; c < chunks; ++c) fn(c, std::size_t{0});
      return;
    }
    if (helpers_.size() + 1 < threads) {
      cursors_ = std::make_unique<Cursor[]>(threads);  // no helper is running a job now
      while (helpers_.size() + 1 < threads) {
        const std::size_t thread = helpers_.size() + 1;
        helpers_.emplace_back([this, thread, seen = generation_.load()] { helper_loop(thread, seen); });
      }
    }
    call_ = [](void* f, std::size_t chunk, std::size_t thread) { (*static_cast<Fn*>(f))(chunk, thread); };
    fn_ = &fn;
    threads_ = threads;
    for (std::size_t t = 0; t < threads; ++t) {
      cursors_[t].next.store(chunks * t / threads, std::memory_order_relaxed);
      cursors_[t].end = chunks * (t + 1) / threads;
    }
#if defined(__x86_64__)
    csr_ = _mm_getcsr();  // helpers flush denormals exactly when the caller does
#endif
    // Every helper reports back (those past `threads` without working), so
    // that none can still be reading this job's fields when the next one is
    // written.
    pending_.store(static_cast<std::uint32_t>(helpers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    work(0);
    for (std::uint32_t left; (left = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(left);
  }

 private:
  // Own run first, then the others' in turn.
  void work(std::size_t thread) {
    for (std::size_t i = 0; i < threads_; ++i) {
      Cursor& run = cursors_[(thread + i) % threads_];
      for (std::size_t c; (c = run.next.fetch_add(1, std::memory_order_relaxed)) < run.end;) call_(fn_, c, thread);
    }
  }

  struct alignas(64) Cursor {  // a cache line each: threads claim from their own without contention
    std::atomic<std::size_t> next{0};
    std::size_t end = 0;
  };

  void helper_loop(std::size_t thread, std::uint32_t seen) {
    for (;;) {
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      if (thread < threads_) {
#if defined(__x86_64__)
        _mm_setcsr(csr_);
#endif
        work(thread);
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::vector<std::thread> helpers_;  // helper i is thread i + 1
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::uint32_t> pending_{0};
  std::unique_ptr<Cursor[]> cursors_;  // per thread: the rest of its run of chunks
  std::atomic<bool> stop_{false};
  void (*call_)(void*, std::size_t, std::size_t) = nullptr;
  void* fn_ = nullptr;
  std::size_t threads_ = 0;
  unsigned csr_ = 0;
};

// The compute-thread budget: BLAS's thread count, which the runtime sets
// from --threads (OpenBLAS keeps one pool per process).
std::size_t compute_threads() { return static_cast<std::size_t>(std::max(1, blas::threads())); }

// A batch cut into chunks of consecutive samples: at least 8 (so that a
// late thread can hand work over), independent of the thread count up to 4,
// so that per-chunk partial sums make results identical with 1, 2 or 4
// threads.
struct Chunks {
  std::size_t size, count;
  std::pair<std::size_t, std::size_t> range(std::size_t chunk, std::size_t batch) const {
    return {chunk * size, std::min(batch, (chunk + 1) * size)};
  }
};

Chunks sample_chunks(std::size_t batch) {
  const std::size_t wanted = std::max<std::size_t>(8, 2 * compute_threads());
  const std::size_t size = std::max<std::size_t>(ceil_div(batch, wanted), 1);
  return {size, ceil_div(batch, size)};
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

// Plain loops that GCC vectorises are written once, always inlined, and
// called through vectorised<f>(...), which on an AVX-512 CPU runs them
// inside a function compiled for it: 16-float vectors instead of the 4 of
// the baseline x86-64 build. (target_clones does the same through an ifunc
// resolver, which ThreadSanitizer cannot run.)
#define ASGD_VECTOR_LOOP [[gnu::always_inline]] inline

#if defined(__x86_64__)
template <auto F, class... Args>
[[gnu::target("avx512f")]] auto run_avx512(Args&&... args) {
  return F(std::forward<Args>(args)...);
}
#endif

template <auto F, class... Args>
auto vectorised(Args&&... args) {
#if defined(__x86_64__)
  if (have_avx512()) return run_avx512<F>(std::forward<Args>(args)...);
#endif
  return F(std::forward<Args>(args)...);
}

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
void matmul_avx512(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
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

// C (ma, mb) += A (ma, n) * B (mb, n)^T, both read along rows.
void dot_products(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda, const float* b,
                  std::size_t ldb, float* c, std::size_t ldc) {
#if defined(__x86_64__)
  if (have_avx512()) {
    for (std::size_t i = 0; i < ma; i += 4)
      for (std::size_t j = 0; j < mb; j += 4)
        dot_tile_avx512(n, a + i * lda, lda, ma - i, b + j * ldb, ldb, mb - j, c + i * ldc + j, ldc);
    return;
  }
#endif
  if (lda == n && ldb == n && ldc == mb) {
    blas::gemm(false, true, ma, mb, n, 1.0f, a, b, 1.0f, c);
    return;
  }
  for (std::size_t i = 0; i < ma; ++i)
    for (std::size_t j = 0; j < mb; ++j) {
      float sum = 0.0f;
      for (std::size_t t = 0; t < n; ++t) sum += a[i * lda + t] * b[j * ldb + t];
      c[i * ldc + j] += sum;
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
// where that falls into the padding. x is one sample (C, H, W). The portable
// version; im2col_avx512 below is the one this machine runs.
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

// ---- Plane helpers ----------------------------------------------------------

namespace {

// Sums over one channel plane, vectorised: GCC keeps a float sum in order
// (no reassociation without -ffast-math), so each helper accumulates 16
// independent float lanes, which it does vectorise, and returns their total
// in double (call them through vectorised<>). A lane sums at most P / 16
// values, so float is as accurate here as PyTorch's double accumulation
// needs.

constexpr std::size_t kLanes = 16;

ASGD_VECTOR_LOOP double plane_sum(const float* __restrict x, std::size_t n) {
  float lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) lane[j] += x[i + j];
  double total = 0.0;
  for (; i < n; ++i) total += x[i];
  for (float v : lane) total += v;
  return total;
}

// sum (x - mean)^2
ASGD_VECTOR_LOOP double plane_sq_dev(const float* __restrict x, std::size_t n, float mean) {
  float lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) {
      const float d = x[i + j] - mean;
      lane[j] += d * d;
    }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(x[i] - mean) * static_cast<double>(x[i] - mean);
  for (float v : lane) total += v;
  return total;
}

// sum dy and sum dy * (x - mean), added to the two totals
ASGD_VECTOR_LOOP void plane_grad_sums(const float* __restrict dy, const float* __restrict x, std::size_t n,
                                        float mean, double& sum_dy, double& sum_dy_dev) {
  float lane_dy[kLanes] = {}, lane_dev[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) lane_dy[j] += dy[i + j];
    for (std::size_t j = 0; j < kLanes; ++j) lane_dev[j] += dy[i + j] * (x[i + j] - mean);
  }
  double total_dy = 0.0, total_dev = 0.0;
  for (; i < n; ++i) {
    total_dy += dy[i];
    total_dev += static_cast<double>(dy[i]) * static_cast<double>(x[i] - mean);
  }
  for (std::size_t j = 0; j < kLanes; ++j) {
    total_dy += lane_dy[j];
    total_dev += lane_dev[j];
  }
  sum_dy += total_dy;
  sum_dy_dev += total_dev;
}

// y = x * scale + shift
ASGD_VECTOR_LOOP void plane_affine(const float* __restrict x, std::size_t n, float scale, float shift,
                                     float* __restrict y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * scale + shift;
}

// dx = a * dy + b * x + c
ASGD_VECTOR_LOOP void plane_affine2(const float* __restrict dy, const float* __restrict x, std::size_t n, float a,
                                      float b, float c, float* __restrict dx) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = a * dy[i] + b * x[i] + c;
}

}  // namespace

// ---- Conv2D ---------------------------------------------------------------

namespace {

// How a call cuts its batch: groups of samples whose im2col buffer stays in
// the core's L2 cache, so that the group's products read it from there.
struct ConvPlan {
  std::size_t threads;
  std::size_t group;  // samples per product
  std::size_t ld;     // leading dimension of the group buffers
};

ConvPlan plan_conv(const ConvGeometry& g, std::size_t batch) {
  if (!have_avx512()) return {1, 1, g.plane()};  // BLAS threads itself and needs packed leading dimensions
  // About 512 KiB of im2col per group: enough columns for full register
  // tiles when planes are small (7x7), and inside a core's 2 MiB L2. No
  // larger than a chunk, so that forward's chunks (one group each) are as
  // many as backward's.
  constexpr std::size_t kColFloats = 128 * 1024;
  const std::size_t group =
      std::clamp<std::size_t>(kColFloats / (g.rows() * g.plane()), 1, sample_chunks(batch).size);
  return {compute_threads(), group, padded_ld(group * g.plane())};
}

// What one thread needs, kept between calls.
struct ConvPart {
  std::vector<float> col;     // (rows, ld): im2col of a group of samples side by side
  std::vector<float> out;     // (O, ld): a group's product before it is scattered; a group's dy side by side
  std::vector<float> dyt;     // (group * OH*OW, O): a group's dy, transposed
  std::vector<float> dcol;    // (C*k*k, ld)
  std::vector<float> padded;  // one sample with its zero padding written out
};

template <class T>
void grow(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

std::size_t padded_size(const ConvGeometry& g) { return g.c * (g.h + 2 * g.pad) * (g.w + 2 * g.pad); }

// out (B, M, OH, OW) = [bias +] A (M, rows) * im2col(in) for the n samples
// from b0: the forward pass, and for a stride-1 conv also dx (a convolution
// of dy with the flipped kernel).
void convolve_group(const ConvGeometry& g, std::size_t ld, Strided a, std::size_t m, const float* bias,
                    const float* in, float* out, std::size_t b0, std::size_t n, ConvPart& part) {
  const std::size_t plane = g.plane(), rows = g.rows(), in_size = g.c * g.h * g.w;
  for (std::size_t j = 0; j < n; ++j)
    im2col_any(g, in + (b0 + j) * in_size, part.padded.data(), part.col.data() + j * plane, ld);
  if (n == 1) {
    // out_b (M, P) = [bias +] A (M, rows) * col (rows, P), straight into out.
    float* ob = out + b0 * m * plane;
    if (bias)
      for (std::size_t o = 0; o < m; ++o) std::fill(ob + o * plane, ob + (o + 1) * plane, bias[o]);
    matmul(m, plane, rows, a, part.col.data(), ld, ob, plane, bias != nullptr);
    return;
  }
  // (M, n*P) = A * col, then each sample's columns go to its place.
  matmul(m, n * plane, rows, a, part.col.data(), ld, part.out.data(), ld, false);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t o = 0; o < m; ++o) {
      const float* __restrict src = part.out.data() + o * ld + j * plane;
      float* __restrict dst = out + ((b0 + j) * m + o) * plane;
      const float shift = bias ? bias[o] : 0.0f;
      for (std::size_t p = 0; p < plane; ++p) dst[p] = src[p] + shift;
    }
}

}  // namespace

struct Conv2D::Scratch {
  ForkJoin threads;
  std::vector<ConvPart> parts;    // per thread
  std::vector<float> dw_partial;  // per chunk of samples, its share of dW: (O, C*k*k) by dot products, else transposed
  std::vector<float> db_partial;  // per chunk: its share of db
  std::vector<float> flipped;     // (C, O, k, k): W with in and out swapped and the kernel turned 180 degrees
};

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
  y.resize({batch, out_, g.oh, g.ow});
  const ConvPlan plan = plan_conv(g, batch);
  scratch_->parts.resize(std::max(scratch_->parts.size(), plan.threads));
  for (ConvPart& part : scratch_->parts) {
    grow(part.col, g.rows() * plan.ld);
    grow(part.padded, padded_size(g));
    if (plan.group > 1) grow(part.out, out_ * plan.ld);
  }
  auto work = [&](std::size_t group, std::size_t thread) {
    const std::size_t b0 = group * plan.group;
    convolve_group(g, plan.ld, {w_, g.rows(), 1}, out_, b_, x.data, y.data(), b0, std::min(plan.group, batch - b0),
                   scratch_->parts[thread]);
  };
  scratch_->threads.run(plan.threads, ceil_div(batch, plan.group), work);
}

void Conv2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  const ConvGeometry g{in_, x.shape[2], x.shape[3], k_, stride_, pad_, conv_out(x.shape[2], k_, stride_, pad_),
                       conv_out(x.shape[3], k_, stride_, pad_)};
  const std::size_t plane = g.plane(), rows = g.rows(), in_size = in_ * g.h * g.w;
  if (dx) dx->resize(x.shape);
  const ConvPlan plan = plan_conv(g, batch);
  // With stride 1, dx is the convolution of dy, padded by k - 1 - pad, with
  // the flipped kernel: the forward path, whose products reduce over O*k*k
  // instead of O and need no col2im (2x faster on the 3x3 layers), when the
  // conv has enough input channels to fill a register tile.
  const bool dx_by_convolution = dx && stride_ == 1 && pad_ < k_ && in_ >= 8;
  const ConvGeometry gd{out_, g.oh, g.ow, k_, 1, k_ - 1 - std::min(pad_, k_ - 1), g.h, g.w};
  const ConvPlan plan_dx = dx_by_convolution ? plan_conv(gd, batch) : plan;
  // With fewer columns (C*k*k) than a vector a register tile over them would
  // be mostly empty: dW as dot products of rows of dy and col instead (2x
  // faster for a 3x3 first layer on one channel; from 16 columns on, the
  // tile is faster).
  const bool dw_by_dots = rows < 16;
  // dW and db are summed per chunk of samples, then over chunks in order.
  const Chunks chunks = sample_chunks(batch);
  Scratch& sc = *scratch_;
  grow(sc.dw_partial, chunks.count * rows * out_);
  grow(sc.db_partial, chunks.count * out_);
  if (dx_by_convolution) {
    sc.flipped.resize(in_ * out_ * k_ * k_);
    for (std::size_t o = 0; o < out_; ++o)
      for (std::size_t c = 0; c < in_; ++c)
        for (std::size_t i = 0; i < k_ * k_; ++i)
          sc.flipped[(c * out_ + o) * k_ * k_ + i] = w_[(o * in_ + c) * k_ * k_ + (k_ * k_ - 1 - i)];
  }
  sc.parts.resize(std::max(sc.parts.size(), plan.threads));
  for (ConvPart& part : sc.parts) {
    grow(part.col, rows * plan.ld);
    grow(part.padded, padded_size(g));
    if (!dw_by_dots) grow(part.dyt, plan.group * plane * out_);
    if (plan.group > 1) grow(part.out, out_ * plan.ld);
    if (dx_by_convolution) {
      grow(part.col, gd.rows() * plan_dx.ld);
      grow(part.padded, padded_size(gd));
      if (plan_dx.group > 1) grow(part.out, in_ * plan_dx.ld);
    } else if (dx) {
      grow(part.dcol, rows * plan.ld);
    }
  }
  auto weight_grads = [&](std::size_t chunk, std::size_t thread) {
    ConvPart& part = sc.parts[thread];
    float* dw = sc.dw_partial.data() + chunk * rows * out_;
    float* db = sc.db_partial.data() + chunk * out_;
    std::fill(dw, dw + rows * out_, 0.0f);
    std::fill(db, db + out_, 0.0f);
    const auto [begin, end] = chunks.range(chunk, batch);
    for (std::size_t b0 = begin; b0 < end; b0 += plan.group) {
      const std::size_t n = std::min(plan.group, end - b0);
      const float* dy0 = dy.data() + b0 * out_ * plane;
      if (bias_)
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t o = 0; o < out_; ++o)
            db[o] += static_cast<float>(vectorised<plane_sum>(dy0 + (j * out_ + o) * plane, plane));
      // The group's dy as (O, n*P).
      const float* dyg = dy0;
      std::size_t lddy = plane;
      if (n > 1 && (dw_by_dots || (dx && !dx_by_convolution))) {
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t o = 0; o < out_; ++o) {
            const float* src = dy0 + (j * out_ + o) * plane;
            std::copy(src, src + plane, part.out.data() + o * plan.ld + j * plane);
          }
        dyg = part.out.data();
        lddy = plan.ld;
      }
      for (std::size_t j = 0; j < n; ++j)
        im2col_any(g, x.data + (b0 + j) * in_size, part.padded.data(), part.col.data() + j * plane, plan.ld);
      if (dw_by_dots) {
        // dW (O, C*k*k) += dy (O, n*P) . col (C*k*k, n*P), row by row.
        dot_products(out_, rows, n * plane, dyg, lddy, part.col.data(), plan.ld, dw, rows);
      } else {
        // dy transposed, (n*P, O), then dW^T (C*k*k, O) += col (C*k*k, n*P) * dy^T (n*P, O).
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t o = 0; o < out_; ++o) {
            const float* src = dy0 + (j * out_ + o) * plane;
            float* dst = part.dyt.data() + j * plane * out_ + o;
            for (std::size_t p = 0; p < plane; ++p) dst[p * out_] = src[p];
          }
        matmul(rows, out_, n * plane, {part.col.data(), plan.ld, 1}, part.dyt.data(), out_, dw, out_, true);
      }
      if (!dx || dx_by_convolution) continue;
      // dcol (C*k*k, n*P) = W^T (C*k*k, O) * dy (O, n*P), folded back onto dx.
      matmul(rows, n * plane, out_, {w_, 1, rows}, dyg, lddy, part.dcol.data(), plan.ld, false);
      for (std::size_t j = 0; j < n; ++j)
        col2im_any(g, part.dcol.data() + j * plane, plan.ld, part.padded.data(), dx->data() + (b0 + j) * in_size);
    }
  };
  sc.threads.run(plan.threads, chunks.count, weight_grads);
  if (dx_by_convolution) {
    auto input_grads = [&](std::size_t group, std::size_t thread) {
      const std::size_t b0 = group * plan_dx.group;
      convolve_group(gd, plan_dx.ld, {sc.flipped.data(), gd.rows(), 1}, in_, nullptr, dy.data(), dx->data(), b0,
                     std::min(plan_dx.group, batch - b0), sc.parts[thread]);
    };
    sc.threads.run(plan_dx.threads, ceil_div(batch, plan_dx.group), input_grads);
  }
  // dW (O, C*k*k) = the sum of the chunks' shares, in chunk order; db likewise.
  for (std::size_t o = 0; o < out_; ++o)
    for (std::size_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (std::size_t c = 0; c < chunks.count; ++c)
        sum += sc.dw_partial[c * rows * out_ + (dw_by_dots ? o * rows + r : r * out_ + o)];
      dw_[o * rows + r] = sum;
    }
  if (bias_)
    for (std::size_t o = 0; o < out_; ++o) {
      float sum = 0.0f;
      for (std::size_t c = 0; c < chunks.count; ++c) sum += sc.db_partial[c * out_ + o];
      db_[o] = sum;
    }
}

// ---- MaxPool2D ------------------------------------------------------------

Shape MaxPool2D::output_shape(const Shape& input) const {
  assert(input.size() == 3);
  return {input[0], conv_out(input[1], k_, stride_, 0), conv_out(input[2], k_, stride_, 0)};
}

namespace {

// The 2x2, stride 2 case on one plane, branch-free so that it vectorises:
// the four candidates are compared in row-major order with a strict >,
// which keeps the first maximum on ties.
ASGD_VECTOR_LOOP void max_pool_2x2(const float* __restrict in, std::size_t w, std::size_t oh, std::size_t ow,
                                     float* __restrict out, std::uint32_t* __restrict arg) {
  for (std::size_t oy = 0; oy < oh; ++oy) {
    const float* __restrict r0 = in + 2 * oy * w;
    const float* __restrict r1 = r0 + w;
    const auto base = static_cast<std::uint32_t>(2 * oy * w);
    for (std::size_t ox = 0; ox < ow; ++ox) {
      const float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
      const auto at = base + static_cast<std::uint32_t>(2 * ox);
      float best = a;
      std::uint32_t where = at;
      where = b > best ? at + 1 : where;
      best = b > best ? b : best;
      where = c > best ? at + static_cast<std::uint32_t>(w) : where;
      best = c > best ? c : best;
      where = d > best ? at + static_cast<std::uint32_t>(w) + 1 : where;
      best = d > best ? d : best;
      out[oy * ow + ox] = best;
      arg[oy * ow + ox] = where;
    }
  }
}

}  // namespace

void MaxPool2D::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4);
  const std::size_t batch = x.shape[0], channels = x.shape[1], h = x.shape[2], w = x.shape[3];
  const std::size_t oh = conv_out(h, k_, stride_, 0), ow = conv_out(w, k_, stride_, 0);
  y.resize({batch, channels, oh, ow});
  argmax_.resize(batch * channels * oh * ow);
  float* out = y.data();
  std::uint32_t* arg = argmax_.data();
  if (k_ == 2 && stride_ == 2) {
    for (std::size_t plane = 0; plane < batch * channels; ++plane)
      vectorised<max_pool_2x2>(x.data + plane * h * w, w, oh, ow, out + plane * oh * ow, arg + plane * oh * ow);
    return;
  }
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


// The batch is cut into chunks of samples as Conv2D cuts it, so that each
// thread mostly reads samples the previous layer left in its own core's
// cache (split by channel, half of every read crossed cores: BatchNorm took
// 17% of a resnet step). Statistics are per-chunk partial sums added in
// chunk order between parallel passes, so they do not depend on the threads.
struct BatchNorm2D::Threads {
  ForkJoin fork_join;
  std::vector<double> partial;  // (chunks, 2, C): two per-channel sums per chunk
  std::vector<float> coef;      // (3, C): backward's dx = a dy + b x + c per channel
};

void BatchNorm2D::ThreadsDeleter::operator()(Threads* t) const { std::default_delete<Threads>()(t); }

BatchNorm2D::BatchNorm2D(std::size_t channels, float eps, float momentum)
    : c_(channels),
      eps_(eps),
      momentum_(momentum),
      running_mean_(channels, 0.0f),
      running_var_(channels, 1.0f),
      mean_(channels, 0.0f),
      inv_std_(channels, 1.0f),
      threads_(new Threads) {}

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
  const Chunks chunks = sample_chunks(batch);
  const std::size_t threads = compute_threads();
  Threads& t = *threads_;
  if (t.partial.size() < chunks.count * 2 * c_) t.partial.resize(chunks.count * 2 * c_);
  // Sums f(plane of sample b, channel c) over the batch per channel, into
  // partial[0][slot].
  auto sum_planes = [&](std::size_t slot, auto f) {
    auto work = [&](std::size_t chunk, std::size_t /*thread*/) {
      double* acc = t.partial.data() + (chunk * 2 + slot) * c_;
      std::fill(acc, acc + c_, 0.0);
      const auto [b0, b1] = chunks.range(chunk, batch);
      for (std::size_t b = b0; b < b1; ++b)
        for (std::size_t c = 0; c < c_; ++c) acc[c] += f(x.data + (b * c_ + c) * plane, c);
    };
    t.fork_join.run(threads, chunks.count, work);
    double* total = t.partial.data() + slot * c_;
    for (std::size_t chunk = 1; chunk < chunks.count; ++chunk)
      for (std::size_t c = 0; c < c_; ++c) total[c] += t.partial[(chunk * 2 + slot) * c_ + c];
    return total;
  };
  if (training_ && n > 0) {
    const float factor = cumulative_ ? 1.0f / static_cast<float>(++batches_seen_) : momentum_;
    // Two passes (mean, then squared deviations): E[x^2] - mean^2 would
    // cancel catastrophically for channels far from zero.
    const double* sums =
        sum_planes(0, [&](const float* p, std::size_t) { return vectorised<plane_sum>(p, plane); });
    for (std::size_t c = 0; c < c_; ++c) mean_[c] = static_cast<float>(sums[c] / static_cast<double>(n));
    const double* sq = sum_planes(
        1, [&](const float* p, std::size_t c) { return vectorised<plane_sq_dev>(p, plane, mean_[c]); });
    for (std::size_t c = 0; c < c_; ++c) {
      const double var = sq[c] / static_cast<double>(n);
      const double unbiased = n > 1 ? sq[c] / static_cast<double>(n - 1) : var;
      inv_std_[c] = static_cast<float>(1.0 / std::sqrt(var + eps_));
      running_mean_[c] = (1.0f - factor) * running_mean_[c] + factor * mean_[c];
      running_var_[c] = (1.0f - factor) * running_var_[c] + factor * static_cast<float>(unbiased);
    }
  } else {
    for (std::size_t c = 0; c < c_; ++c) {
      mean_[c] = running_mean_[c];
      inv_std_[c] = 1.0f / std::sqrt(running_var_[c] + eps_);
    }
  }
  // y = (x - mean) * inv_std * gamma + beta = x * scale + shift
  auto normalise = [&](std::size_t chunk, std::size_t /*thread*/) {
    const auto [b0, b1] = chunks.range(chunk, batch);
    for (std::size_t b = b0; b < b1; ++b)
      for (std::size_t c = 0; c < c_; ++c) {
        const float scale = inv_std_[c] * gamma_[c];
        const float shift = beta_[c] - mean_[c] * scale;
        const std::size_t at = (b * c_ + c) * plane;
        vectorised<plane_affine>(x.data + at, plane, scale, shift, y.data() + at);
      }
  };
  t.fork_join.run(threads, chunks.count, normalise);
}

void BatchNorm2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const std::size_t n = batch * plane;
  if (dx) dx->resize(x.shape);
  const Chunks chunks = sample_chunks(batch);
  const std::size_t threads = compute_threads();
  Threads& t = *threads_;
  if (t.partial.size() < chunks.count * 2 * c_) t.partial.resize(chunks.count * 2 * c_);
  auto sums = [&](std::size_t chunk, std::size_t /*thread*/) {
    double* sum_dy = t.partial.data() + chunk * 2 * c_;
    double* sum_dy_dev = sum_dy + c_;
    std::fill(sum_dy, sum_dy + 2 * c_, 0.0);
    const auto [b0, b1] = chunks.range(chunk, batch);
    for (std::size_t b = b0; b < b1; ++b)
      for (std::size_t c = 0; c < c_; ++c) {
        const std::size_t at = (b * c_ + c) * plane;
        vectorised<plane_grad_sums>(dy.data() + at, x.data + at, plane, mean_[c], sum_dy[c], sum_dy_dev[c]);
      }
  };
  t.fork_join.run(threads, chunks.count, sums);
  t.coef.resize(3 * c_);
  for (std::size_t c = 0; c < c_; ++c) {
    double sum_dy = 0.0, sum_dy_dev = 0.0;
    for (std::size_t chunk = 0; chunk < chunks.count; ++chunk) {
      sum_dy += t.partial[chunk * 2 * c_ + c];
      sum_dy_dev += t.partial[(chunk * 2 + 1) * c_ + c];
    }
    const float mean = mean_[c], inv_std = inv_std_[c];
    const double sum_dy_xhat = sum_dy_dev * inv_std;
    dbeta_[c] = static_cast<float>(sum_dy);
    dgamma_[c] = static_cast<float>(sum_dy_xhat);
    // dx = k (dy - mean(dy) - xhat mean(dy xhat)) with k = gamma inv_std in
    // training mode, where the batch statistics depend on x too; in
    // inference mode the layer is affine and dx = k dy. Written as
    // dx = a dy + b x + c, with xhat = (x - mean) inv_std.
    const float k = gamma_[c] * inv_std;
    double mean_dy = 0.0, mean_dy_xhat = 0.0;
    if (training_ && n > 0) {
      mean_dy = sum_dy / static_cast<double>(n);
      mean_dy_xhat = sum_dy_xhat / static_cast<double>(n);
    }
    const double slope = -static_cast<double>(k) * mean_dy_xhat * inv_std;  // per unit of x
    t.coef[c] = k;
    t.coef[c_ + c] = static_cast<float>(slope);
    t.coef[2 * c_ + c] = static_cast<float>(-k * mean_dy - slope * mean);
  }
  if (!dx) return;
  auto input_grads = [&](std::size_t chunk, std::size_t /*thread*/) {
    const auto [b0, b1] = chunks.range(chunk, batch);
    for (std::size_t b = b0; b < b1; ++b)
      for (std::size_t c = 0; c < c_; ++c) {
        const std::size_t at = (b * c_ + c) * plane;
        vectorised<plane_affine2>(dy.data() + at, x.data + at, plane, t.coef[c], t.coef[c_ + c], t.coef[2 * c_ + c],
                      dx->data() + at);
      }
  };
  t.fork_join.run(threads, chunks.count, input_grads);
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

std::size_t per_sample(const Shape& shape) { return shape.empty() || shape[0] == 0 ? 0 : numel(shape) / shape[0]; }

ASGD_VECTOR_LOOP void add_arrays(const float* __restrict a, const float* __restrict b, float* __restrict out,
                                   std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

ASGD_VECTOR_LOOP void accumulate(float* __restrict acc, const float* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += b[i];
}

}  // namespace

// The sums cut the batch into chunks like the layers around them, so that
// each thread mostly adds samples in its own core's cache.
struct Residual::Threads {
  ForkJoin fork_join;

  // out = a + b, or out += b when a is null; all (batch, per_sample).
  void add(std::size_t batch, std::size_t per_sample, const float* a, const float* b, float* out) {
    const Chunks chunks = sample_chunks(batch);
    auto work = [&](std::size_t chunk, std::size_t /*thread*/) {
      const auto [b0, b1] = chunks.range(chunk, batch);
      const std::size_t at = b0 * per_sample, n = (b1 - b0) * per_sample;
      if (a) {
        vectorised<add_arrays>(a + at, b + at, out + at, n);
      } else {
        vectorised<accumulate>(out + at, b + at, n);
      }
    };
    fork_join.run(compute_threads(), chunks.count, work);
  }
};

Residual::Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut)
    : main_(std::move(main)),
      shortcut_(std::move(shortcut)),
      main_acts_(main_.size()),
      shortcut_acts_(shortcut_.size()),
      threads_(std::make_unique<Threads>()) {}

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
  // Called every step: walk the paths rather than build children().
  for (auto* path : {&main_, &shortcut_})
    for (const auto& layer : *path) layer->set_training(training);
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
  threads_->add(y.dim(0), per_sample(y.shape()), main_out.data, short_out.data, y.data());
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
  const Tensor* other = &dy;  // an identity shortcut passes dy through
  if (!shortcut_.empty()) {
    run(shortcut_, shortcut_acts_, &grad_short_);
    other = &grad_short_;
  }
  assert(other->size() == dx->size());
  threads_->add(dx->dim(0), per_sample(dx->shape()), nullptr, other->data(), dx->data());
}

}  // namespace asgd
