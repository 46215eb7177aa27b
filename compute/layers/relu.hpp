#pragma once
// ReLU on the CPU.

#include <string>

#include "compute/layer.hpp"

namespace asgd {

/// y = max(x, 0).
class ReLU final : public Layer {
 public:
  std::string kind() const override { return "relu"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace asgd
