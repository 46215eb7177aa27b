#pragma once
// Layers of a sequential model on the CPU. Shapes are (B, ...) with B the
// batch; a layer's parameters and gradients are slices of its model's single
// flat allocation (bound once), which is also the unit shards own.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/tensor.hpp"

namespace asgd {

/// How a parameter tensor is initialised.
enum class Init { zeros, ones, he_uniform };

/// One parameter tensor a layer needs; the model lays them out back to back.
struct ParamSpec {
  std::string name;      // "weight", "bias"; nested layers prefix theirs ("main.0.weight")
  Shape shape;
  Init init = Init::zeros;
  std::size_t fan_in = 0;
};

/// State a layer keeps that is not trained by gradients (BatchNorm's running
/// statistics): it is never pushed to shards; exports name it like PyTorch's
/// module buffers ("running_mean").
struct LayerBuffer {
  std::string name;
  std::span<float> values;
};

/// A differentiable function of one input. Not thread-safe: one instance per
/// worker. Scratch buffers are kept between calls so that steady batch sizes
/// never allocate.
class Layer {
 public:
  virtual ~Layer() = default;

  /// "dense", "relu", ...
  virtual std::string kind() const = 0;

  /// Per-sample output shape for a per-sample input shape (no batch dim).
  virtual Shape output_shape(const Shape& input) const = 0;

  /// Parameters this layer needs, in layout order.
  virtual std::vector<ParamSpec> param_specs() const { return {}; }

  /// Points the layer at its parameters and their gradients: contiguous
  /// slices, in param_specs() order, that outlive the layer's use.
  virtual void bind(std::span<float> /*params*/, std::span<float> /*grads*/) {}

  /// Training mode (the default) uses batch statistics and drops units;
  /// inference mode uses running statistics and drops nothing.
  virtual void set_training(bool /*training*/) {}

  /// Non-trained state, in a fixed order (empty for most layers).
  virtual std::vector<LayerBuffer> buffers() { return {}; }

  /// Layers nested inside this one (a residual block's paths), for walks
  /// over the whole model; empty for plain layers.
  virtual std::vector<Layer*> children() { return {}; }

  /// Reseeds any randomness the layer draws (Dropout's masks).
  virtual void reseed(std::uint64_t /*seed*/) {}

  /// y = f(x). x is (B, input...), y is resized to (B, output...).
  virtual void forward(ConstTensorView x, Tensor& y) = 0;

  /// Given the forward pass's x and y and dL/dy, overwrites this layer's
  /// parameter gradients with dL/dparams and, when dx is not null, writes
  /// dL/dx (resized to x's shape). The first layer passes dx = nullptr, which
  /// skips the input gradient nobody needs.
  virtual void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) = 0;
};

/// y = x W^T + b with W (out, in) and b (out): torch.nn.Linear's layout.
class Dense final : public Layer {
 public:
  Dense(std::size_t in, std::size_t out) : in_(in), out_(out) {}
  std::string kind() const override { return "dense"; }
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::span<float> params, std::span<float> grads) override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::size_t in() const { return in_; }
  std::size_t out() const { return out_; }

 private:
  std::size_t in_, out_;
  float* w_ = nullptr;   // (out, in)
  float* b_ = nullptr;   // (out,)
  float* dw_ = nullptr;  // (out, in)
  float* db_ = nullptr;  // (out,)
};

/// y = max(x, 0).
class ReLU final : public Layer {
 public:
  std::string kind() const override { return "relu"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

/// Mean softmax cross-entropy over a batch of logits (B, C) and labels (B,).
/// Not a Layer: it ends the graph and owns the labels.
class SoftmaxCrossEntropy {
 public:
  /// Returns the mean loss over the batch and keeps the probabilities for
  /// backward(). Labels must lie in [0, C).
  float forward(ConstTensorView logits, std::span<const std::int32_t> labels);

  /// dL/dlogits = (softmax - onehot) / B, resized to (B, C).
  void backward(std::span<const std::int32_t> labels, Tensor& dlogits) const;

  /// How many rows of the last forward() had their largest logit at the label.
  std::size_t correct(std::span<const std::int32_t> labels) const;

 private:
  Tensor probs_;  // (B, C)
};

}  // namespace asgd
