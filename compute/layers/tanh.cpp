#include "compute/layers/tanh.hpp"

#include <cmath>

namespace asgd {

void Tanh::forward(ConstTensorView x, Tensor& y) {
  y.resize(x.shape);
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i) y[i] = std::tanh(x.data[i]);
}

void Tanh::backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t n = y.size();
  const float* __restrict yp = y.data();
  const float* __restrict dyp = dy.data();
  float* __restrict out = dx->data();
  for (std::size_t i = 0; i < n; ++i) out[i] = dyp[i] * (1.0f - yp[i] * yp[i]);
}

}  // namespace asgd
