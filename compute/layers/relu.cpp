#include "compute/layers/relu.hpp"

#include "compute/layers/elementwise.hpp"

namespace asgd {

void ReLU::forward(ConstTensorView x, Tensor& y) {
  map_elements(x, y, [](float v) { return v > 0.0f ? v : 0.0f; });
}

void ReLU::backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  map_gradient(x.shape, y.data(), dy, dx, [](float out, float g) { return out > 0.0f ? g : 0.0f; });
}

}  // namespace asgd
