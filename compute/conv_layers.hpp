#pragma once
// Layers for convolutional networks on the CPU, NCHW like PyTorch, so that
// parameter layouts and names match torch.nn (Conv2d weight (O, C, KH, KW),
// BatchNorm2d weight/bias/running_mean/running_var). Per-sample shapes are
// (C, H, W); batched tensors are (B, C, H, W). Each layer's accessors give
// the CUDA backend its configuration, so one model definition drives both.

#include <cstdint>
#include <memory>
#include <vector>

#include "compute/layers.hpp"
#include "compute/random.hpp"

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
  struct Scratch;        // im2col buffers and the like, kept between calls
  std::unique_ptr<Scratch> scratch_;
};

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

/// Mean over each channel's H x W plane: (B, C, H, W) -> (B, C), as
/// torch.nn.AdaptiveAvgPool2d(1) followed by flatten.
class GlobalAvgPool final : public Layer {
 public:
  std::string kind() const override { return "global_avg_pool"; }
  Shape output_shape(const Shape& input) const override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

/// torch.nn.BatchNorm2d(C, eps=1e-5, momentum=0.1): in training mode each
/// channel is normalised by its batch mean and biased batch variance, and
/// the running statistics move towards the batch's (running_var with the
/// unbiased variance, as PyTorch); in inference mode the running statistics
/// are used. Parameters weight (C) = 1 and bias (C) = 0 initially; buffers
/// running_mean (C) = 0 and running_var (C) = 1.
class BatchNorm2D final : public Layer {
 public:
  explicit BatchNorm2D(std::size_t channels, float eps = 1e-5f, float momentum = 0.1f);
  std::string kind() const override { return "batchnorm2d"; }
  Shape output_shape(const Shape& input) const override { return input; }
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::span<float> params, std::span<float> grads) override;
  void set_training(bool training) override { training_ = training; }
  std::vector<LayerBuffer> buffers() override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  /// Recalibration (torch.optim.swa_utils.update_bn): begin resets the
  /// running statistics and makes the following training-mode forwards keep
  /// their cumulative (equally weighted) average instead of a moving one;
  /// end returns to the moving average.
  void begin_recalibration();
  void end_recalibration();

  std::size_t channels() const { return c_; }
  float eps() const { return eps_; }
  float momentum() const { return momentum_; }
  bool training() const { return training_; }
  std::span<float> running_mean() { return running_mean_; }
  std::span<float> running_var() { return running_var_; }

 private:
  std::size_t c_;
  float eps_, momentum_;
  bool training_ = true;
  bool cumulative_ = false;
  std::size_t batches_seen_ = 0;  // while recalibrating
  std::vector<float> running_mean_, running_var_;  // (C,)
  std::vector<float> mean_, inv_std_;              // (C,) of the last training forward
  float* gamma_ = nullptr;
  float* beta_ = nullptr;
  float* dgamma_ = nullptr;
  float* dbeta_ = nullptr;
  struct Threads;  // splits the batch across the compute threads
  struct ThreadsDeleter {
    void operator()(Threads* t) const;
  };
  std::unique_ptr<Threads, ThreadsDeleter> threads_;
};

/// (B, ...) -> (B, prod(...)). Copies nothing it need not.
class Flatten final : public Layer {
 public:
  std::string kind() const override { return "flatten"; }
  Shape output_shape(const Shape& input) const override { return {numel(input)}; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

/// Inverted dropout (torch.nn.Dropout(p)): in training mode each unit is
/// zeroed with probability p and the rest scaled by 1 / (1 - p); identity in
/// inference mode. Masks come from the layer's own seeded generator.
class Dropout final : public Layer {
 public:
  explicit Dropout(float p, std::uint64_t seed = 0) : p_(p), rng_(seed) {}
  std::string kind() const override { return "dropout"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void set_training(bool training) override { training_ = training; }
  void reseed(std::uint64_t seed) override { rng_ = Rng(seed); }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  float p() const { return p_; }

 private:
  float p_;
  bool training_ = true;
  Rng rng_;
  std::vector<float> mask_;  // (B, ...) of the last training forward: 0 or 1 / (1 - p)
};

/// y = main(x) + shortcut(x), where each path is a sequence of layers and an
/// empty shortcut is the identity: the body of a ResNet basic block (the
/// ReLU after the add is a separate layer). Parameters are main's then
/// shortcut's, named "main.I.*" and "shortcut.I.*".
class Residual final : public Layer {
 public:
  Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut);
  ~Residual() override;
  std::string kind() const override { return "residual"; }
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::span<float> params, std::span<float> grads) override;
  void set_training(bool training) override;
  std::vector<LayerBuffer> buffers() override;  // "main.I.running_mean", ...
  std::vector<Layer*> children() override;
  void reseed(std::uint64_t seed) override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  const std::vector<std::unique_ptr<Layer>>& main_path() const { return main_; }
  const std::vector<std::unique_ptr<Layer>>& shortcut_path() const { return shortcut_; }

 private:
  std::vector<std::unique_ptr<Layer>> main_, shortcut_;
  std::vector<Tensor> main_acts_, shortcut_acts_;  // per path layer: its output
  Tensor grad_a_, grad_b_, grad_short_;           // backward scratch
  struct Threads;  // splits the sums across the compute threads, batch-wise
  std::unique_ptr<Threads> threads_;
};

}  // namespace asgd
