#include "compute/layers/relu.hpp"

#include "compute/layers/elementwise.hpp"

namespace asgd {

void ReLU::forward(ConstTensorView x, Tensor& y) {
  // A NaN stays one, as torch's relu keeps it (it became 0: a NaN made inside
  // the model then trained on as a finite loss, past the dropped-batch guard).
  map_elements(x, y, [](float v) { return v > 0.0f || v != v ? v : 0.0f; });
}

void ReLU::backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  map_gradient(x.shape, y.data(), dy, dx, [](float out, float g) { return out > 0.0f ? g : 0.0f; });
}

}  // namespace asgd
