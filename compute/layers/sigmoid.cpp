#include "compute/layers/sigmoid.hpp"

#include <cmath>

namespace asgd {

void Sigmoid::forward(ConstTensorView x, Tensor& y) {
  y.resize(x.shape);
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i) {
    // exp of a non-positive number only: no overflow for large |x|.
    const float v = x.data[i];
    const float e = std::exp(-std::abs(v));
    y[i] = v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  }
}

void Sigmoid::backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t n = y.size();
  const float* __restrict yp = y.data();
  const float* __restrict dyp = dy.data();
  float* __restrict out = dx->data();
  for (std::size_t i = 0; i < n; ++i) out[i] = dyp[i] * yp[i] * (1.0f - yp[i]);
}

}  // namespace asgd
