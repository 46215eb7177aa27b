#include "compute/layers/tanh.hpp"

#include <cmath>

#include "compute/layers/elementwise.hpp"

namespace asgd {

void Tanh::forward(ConstTensorView x, Tensor& y) {
  map_elements(x, y, [](float v) { return std::tanh(v); });
}

void Tanh::backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  map_gradient(x.shape, y.data(), dy, dx, [](float out, float g) { return g * (1.0f - out * out); });
}

}  // namespace asgd
