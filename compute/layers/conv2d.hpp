#pragma once
// Conv2D on the CPU, NCHW like PyTorch (weight (O, C, KH, KW)): im2col and
// register-tiled products, the batch split across the model's threads.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/layer.hpp"

namespace asgd {

/// 2-D convolution (cross-correlation, as torch.nn.Conv2d): square kernel,
/// equal stride and zero padding on both axes, optional bias.
/// Output (B, O, OH, OW) with OH = (H + 2*pad - k) / stride + 1.
class Conv2D final : public Layer {
 public:
  Conv2D(std::size_t in_channels, std::size_t out_channels, std::size_t kernel, std::size_t stride = 1,
         std::size_t pad = 0, bool bias = true);
  ~Conv2D() override;
  std::string kind() const override { return "conv2d"; }
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;  // weight (O, C, k, k) [, bias (O)]
  void bind(std::span<float> params, std::span<float> grads) override;
  void set_pool(ThreadPool* pool) override { pool_ = pool; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::size_t in_channels() const { return in_; }
  std::size_t out_channels() const { return out_; }
  std::size_t kernel() const { return k_; }
  std::size_t stride() const { return stride_; }
  std::size_t pad() const { return pad_; }
  bool has_bias() const { return bias_; }

 private:
  std::size_t in_, out_, k_, stride_, pad_;
  bool bias_;
  float* w_ = nullptr;   // (O, C, k, k)
  float* b_ = nullptr;   // (O,) or null
  float* dw_ = nullptr;  // (O, C, k, k)
  float* db_ = nullptr;  // (O,) or null
  ThreadPool* pool_ = nullptr;  // the model's; null: the calling thread alone
  struct Scratch;        // im2col buffers and the like, kept between calls
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace asgd
