#pragma once
// Sigmoid on the CPU (torch.nn.Sigmoid).

#include <string>

#include "compute/layer.hpp"

namespace asgd {

/// y = 1 / (1 + exp(-x)); dL/dx = dL/dy y (1 - y).
class Sigmoid final : public Layer {
 public:
  std::string kind() const override { return "sigmoid"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace asgd
