#pragma once
// The interface every layer of a sequential model implements on the CPU;
// each kind lives in compute/layers/ and has one entry in
// compute/layer_registry.cpp. Shapes are (B, ...) with B the batch; a
// layer's parameters and gradients are slices of its model's single flat
// allocation (bound once), which is also the unit shards own.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/tensor.hpp"

namespace asgd {

class ThreadPool;

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

  /// Floats a forward pass keeps per sample of `input` (per-sample shape):
  /// its output, and for a layer made of layers, theirs too. What sizes
  /// the chunks an evaluation runs in.
  virtual std::size_t activation_floats(const Shape& input) const { return numel(output_shape(input)); }

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

  /// The pool this layer splits its batches across: its model's, which
  /// outlives the layer's use of it. Null (the default): the calling
  /// thread alone.
  virtual void set_pool(ThreadPool* /*pool*/) {}

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

}  // namespace asgd
