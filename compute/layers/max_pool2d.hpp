#pragma once
// MaxPool2D on the CPU.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compute/layer.hpp"

namespace asgd {

/// Max pooling over k x k windows with stride s (default s = k), no padding:
/// torch.nn.MaxPool2d(k, s). Ties go to the first maximum in row-major order.
class MaxPool2D final : public Layer {
 public:
  explicit MaxPool2D(std::size_t kernel, std::size_t stride = 0) : k_(kernel), stride_(stride ? stride : kernel) {}
  std::string kind() const override { return "maxpool2d"; }
  Shape output_shape(const Shape& input) const override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::size_t kernel() const { return k_; }
  std::size_t stride() const { return stride_; }

 private:
  std::size_t k_, stride_;
  std::vector<std::uint32_t> argmax_;  // (B, C, OH, OW): input index of each max within its image plane
};

}  // namespace asgd
