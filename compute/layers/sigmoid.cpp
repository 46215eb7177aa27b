#include "compute/layers/sigmoid.hpp"

#include <cmath>

#include "compute/layers/elementwise.hpp"

namespace asgd {

void Sigmoid::forward(ConstTensorView x, Tensor& y) {
  map_elements(x, y, [](float v) {
    // exp of a non-positive number only: no overflow for large |x|.
    const float e = std::exp(-std::abs(v));
    return v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  });
}

void Sigmoid::backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  map_gradient(x.shape, y.data(), dy, dx, [](float out, float g) { return g * out * (1.0f - out); });
}

}  // namespace asgd
