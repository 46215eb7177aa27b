#include "compute/im2col.hpp"

#include <algorithm>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compute/cpu_kernels.hpp"

namespace asgd::cpu {

namespace {

// The output columns [lo, hi) whose input column ox * s + kj - pad lies
// inside the image; the rest read padding.
std::pair<std::size_t, std::size_t> valid_columns(const ConvGeometry& g, std::size_t kj) {
  const std::size_t lo = kj >= g.pad ? 0 : ceil_div(g.pad - kj, g.s);
  if (g.w + g.pad < kj + 1) return {0, 0};
  const std::size_t hi = std::min(g.ow, (g.w + g.pad - kj - 1) / g.s + 1);
  return {std::min(lo, hi), hi};
}

}  // namespace

// col (C*k*k, OH*OW) with leading dimension ld: row (c, ki, kj) holds
// x[c][oh*s - pad + ki][ow*s - pad + kj] at every output position, zero
// where that falls into the padding. x is one sample (C, H, W).
void im2col_reference(const ConvGeometry& g, const float* __restrict x, float* __restrict col, std::size_t ld) {
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
void col2im_reference(const ConvGeometry& g, const float* __restrict col, std::size_t ld, float* __restrict dx) {
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
namespace {

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

}  // namespace

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
#else
void im2col_avx512(const ConvGeometry& g, const float* x, float*, float* col, std::size_t ld) {
  im2col_reference(g, x, col, ld);
}
void col2im_avx512(const ConvGeometry& g, const float* col, std::size_t ld, float*, float* dx) {
  col2im_reference(g, col, ld, dx);
}
#endif

bool vector_im2col(const ConvGeometry& g) { return have_avx512() && (g.s == 1 || g.s == 2) && g.ow <= 64; }

void im2col(const ConvGeometry& g, const float* x, float* padded, float* col, std::size_t ld) {
  if (vector_im2col(g)) return im2col_avx512(g, x, padded, col, ld);
  im2col_reference(g, x, col, ld);
}

void col2im(const ConvGeometry& g, const float* col, std::size_t ld, float* padded, float* dx) {
  if (vector_im2col(g)) return col2im_avx512(g, col, ld, padded, dx);
  col2im_reference(g, col, ld, dx);
}

}  // namespace asgd::cpu
