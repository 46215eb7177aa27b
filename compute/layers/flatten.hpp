#pragma once
// Flatten.

#include <string>

#include "compute/layer.hpp"

namespace asgd {

/// (B, ...) -> (B, prod(...)). Copies nothing it need not.
class Flatten final : public Layer {
 public:
  std::string kind() const override { return "flatten"; }
  Shape output_shape(const Shape& input) const override { return {numel(input)}; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace asgd
