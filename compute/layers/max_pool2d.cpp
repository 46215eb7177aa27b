#include "compute/layers/max_pool2d.hpp"

#include <algorithm>
#include <cassert>

#include "compute/cpu_kernels.hpp"
#include "compute/im2col.hpp"

namespace asgd {

using cpu::conv_out;
using cpu::vectorised;

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
      // (b > best || b != b): a NaN wins its window, as in torch's max_pool2d.
      where = b > best || b != b ? at + 1 : where;
      best = b > best || b != b ? b : best;
      where = c > best || c != c ? at + static_cast<std::uint32_t>(w) : where;
      best = c > best || c != c ? c : best;
      where = d > best || d != d ? at + static_cast<std::uint32_t>(w) + 1 : where;
      best = d > best || d != d ? d : best;
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
        // Row-major scan with a strict > keeps the first maximum, as PyTorch,
        // and a NaN wins its window as there (a strict > alone lost it).
        for (std::size_t i = 0; i < k_; ++i)
          for (std::size_t j = 0; j < k_; ++j) {
            const std::size_t at = (oy * stride_ + i) * w + ox * stride_ + j;
            if (in[at] > best || in[at] != in[at]) {
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

}  // namespace asgd
