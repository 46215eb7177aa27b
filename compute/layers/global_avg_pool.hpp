#pragma once
// GlobalAvgPool on the CPU.

#include <string>

#include "compute/layer.hpp"

namespace asgd {

/// Mean over each channel's H x W plane: (B, C, H, W) -> (B, C), as
/// torch.nn.AdaptiveAvgPool2d(1) followed by flatten.
class GlobalAvgPool final : public Layer {
 public:
  std::string kind() const override { return "global_avg_pool"; }
  Shape output_shape(const Shape& input) const override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace asgd
