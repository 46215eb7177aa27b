#pragma once
// LeakyReLU on the CPU (torch.nn.LeakyReLU).

#include <string>

#include "compute/layer.hpp"

namespace asgd {

/// y = x for x > 0, else negative_slope * x (PyTorch's default slope 0.01);
/// dL/dx = dL/dy times 1 or the slope, by the sign of x.
class LeakyReLU final : public Layer {
 public:
  explicit LeakyReLU(float negative_slope = 0.01f) : slope_(negative_slope) {}
  std::string kind() const override { return "leaky_relu"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  float negative_slope() const { return slope_; }

 private:
  float slope_;
};

}  // namespace asgd
