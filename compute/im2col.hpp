#pragma once
// im2col and its adjoint col2im for the CPU convolution: a plain reference
// beside an AVX-512 version for strides 1 and 2 (the reference runs where
// the CPU lacks AVX-512 or the geometry does not fit; tests compare the two).

#include <cassert>
#include <cstddef>

namespace asgd::cpu {

/// Output length of a window of size k sliding with stride s over n padded
/// by pad on both sides.
inline std::size_t conv_out(std::size_t n, std::size_t k, std::size_t s, std::size_t pad) {
  assert(n + 2 * pad >= k);
  return (n + 2 * pad - k) / s + 1;
}

/// One sample's convolution: input (c, h, w), square kernel k, stride s,
/// zero padding pad, output (oh, ow) per channel.
struct ConvGeometry {
  std::size_t c, h, w, k, s, pad, oh, ow;
  std::size_t plane() const { return oh * ow; }
  std::size_t rows() const { return c * k * k; }
};

/// col (C*k*k, OH*OW) with leading dimension ld: row (c, ki, kj) holds
/// x[c][oh*s - pad + ki][ow*s - pad + kj] at every output position, zero
/// where that falls into the padding. x is one sample (C, H, W).
void im2col_reference(const ConvGeometry& g, const float* x, float* col, std::size_t ld);

/// The adjoint of im2col: dx (C, H, W) is overwritten with the sum of every
/// col entry at the input position it was copied from.
void col2im_reference(const ConvGeometry& g, const float* col, std::size_t ld, float* dx);

/// Whether the AVX-512 versions run this geometry (and this CPU them).
bool vector_im2col(const ConvGeometry& g);

/// Only where vector_im2col(g): the same on a padded copy of the sample in
/// `padded` (C, H + 2 pad, W + 2 pad), scratch.
void im2col_avx512(const ConvGeometry& g, const float* x, float* padded, float* col, std::size_t ld);
void col2im_avx512(const ConvGeometry& g, const float* col, std::size_t ld, float* padded, float* dx);

/// The fastest im2col / col2im this CPU and geometry allow.
void im2col(const ConvGeometry& g, const float* x, float* padded, float* col, std::size_t ld);
void col2im(const ConvGeometry& g, const float* col, std::size_t ld, float* padded, float* dx);

}  // namespace asgd::cpu
