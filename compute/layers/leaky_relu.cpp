#include "compute/layers/leaky_relu.hpp"

namespace asgd {

void LeakyReLU::forward(ConstTensorView x, Tensor& y) {
  y.resize(x.shape);
  const std::size_t n = x.size();
  const float* __restrict in = x.data;
  float* __restrict out = y.data();
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : slope_ * in[i];
}

void LeakyReLU::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t n = dy.size();
  // By the sign of x, not y: with a negative or zero slope y's sign says
  // nothing about which side x was on.
  const float* __restrict in = x.data;
  const float* __restrict dyp = dy.data();
  float* __restrict out = dx->data();
  for (std::size_t i = 0; i < n; ++i) {
    const float g = dyp[i];
    out[i] = in[i] > 0.0f ? g : slope_ * g;
  }
}

}  // namespace asgd
