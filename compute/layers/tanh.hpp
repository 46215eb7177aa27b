#pragma once
// Tanh on the CPU (torch.nn.Tanh).

#include <string>

#include "compute/layer.hpp"

namespace asgd {

/// y = tanh(x); dL/dx = dL/dy (1 - y^2).
class Tanh final : public Layer {
 public:
  std::string kind() const override { return "tanh"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace asgd
