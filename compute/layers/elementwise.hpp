#pragma once
// The loops every activation layer runs (ReLU, LeakyReLU, Tanh, Sigmoid):
// y = f(x) element by element, and dx = g(an input, dy) element by element.
// Header templates so that each layer's f and g inline into one
// vectorisable loop.

#include "compute/layer.hpp"

namespace asgd {

/// y = f(x), element by element, y resized to x's shape.
template <class F>
void map_elements(ConstTensorView x, Tensor& y, F f) {
  y.resize(x.shape);
  const std::size_t n = x.size();
  const float* __restrict in = x.data;
  float* __restrict out = y.data();
  for (std::size_t i = 0; i < n; ++i) out[i] = f(in[i]);
}

/// dx = g(by[i], dy[i]), element by element, when dx is wanted; `by` is what
/// the gradient depends on (the layer's input or output) and has dy's size.
/// dy is loaded unconditionally before g sees it: a load inside g's ?: is
/// one the compiler may not hoist, and ReLU's backward then branched and
/// mispredicted on every other element (3x slower than a vectorised select).
template <class G>
void map_gradient(const Shape& shape, const float* by, const Tensor& dy, Tensor* dx, G g) {
  if (!dx) return;
  dx->resize(shape);
  const std::size_t n = dy.size();
  const float* __restrict b = by;
  const float* __restrict dyp = dy.data();
  float* __restrict out = dx->data();
  for (std::size_t i = 0; i < n; ++i) {
    const float d = dyp[i];
    out[i] = g(b[i], d);
  }
}

}  // namespace asgd
