#pragma once
// BatchNorm2D on the CPU, with torch.nn.BatchNorm2d's parameters and buffers.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/layer.hpp"

namespace asgd {

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
  void set_pool(ThreadPool* pool) override { pool_ = pool; }
  std::vector<LayerBuffer> buffers() override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  /// Recalibration (torch.optim.swa_utils.update_bn): begin resets the
  /// running statistics and makes the following training-mode forwards keep
  /// their cumulative (equally weighted) average instead of a moving one;
  /// end returns to the moving average.
  void begin_recalibration();
  void end_recalibration();

  /// A training-mode forward needs more than one value per channel (batch x
  /// H x W > 1): with one, the variance is 0 and the unbiased estimate the
  /// running variance takes is undefined (cuDNN makes it infinite, which
  /// poisons every later inference). Throws std::invalid_argument saying so
  /// when `values_per_channel` is 1; the CPU and the GPU paths both check,
  /// as PyTorch does.
  static void check_values_per_channel(std::size_t values_per_channel);

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
  ThreadPool* pool_ = nullptr;    // the model's; null: the calling thread alone
  std::vector<double> partial_;   // (chunks, 2, C): two per-channel sums per chunk
  std::vector<float> coef_;       // (3, C): backward's dx = a dy + b x + c per channel
};

}  // namespace asgd
