#include "compute/layers/leaky_relu.hpp"

#include "compute/layers/elementwise.hpp"

namespace asgd {

void LeakyReLU::forward(ConstTensorView x, Tensor& y) {
  const float slope = slope_;
  map_elements(x, y, [slope](float v) { return v > 0.0f ? v : slope * v; });
}

void LeakyReLU::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  // By the sign of x, not y: with a negative or zero slope y's sign says
  // nothing about which side x was on.
  const float slope = slope_;
  map_gradient(x.shape, x.data, dy, dx, [slope](float in, float g) { return in > 0.0f ? g : slope * g; });
}

}  // namespace asgd
