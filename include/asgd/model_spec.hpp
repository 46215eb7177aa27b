#pragma once
// A sequential model described from code, as an alternative to a model name
// (JobConfig::model): JobConfig::model_spec, Predictor::from_params.
//
//   asgd::ModelSpec spec = asgd::ModelSpec("my-cnn")
//       .conv2d(16, 5).relu().max_pool(2)
//       .flatten().dense(128).relu().dense(10);
//
// Input sizes are inferred when the model is built for a dataset's sample
// shape, so a spec names output sizes only. The last layer must give one
// output per class. Dense layers flatten their input themselves (flatten()
// before the first one is optional), as the mlp does.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

/// A value type: copy it freely; nothing is checked until a model is built
/// from it (validate(ModelSpec, ...), or when a job starts). Thread-compatible.
class ModelSpec {
 public:
  /// One layer. Fields a kind does not use keep their defaults.
  struct Layer {
    enum class Kind {
      dense,
      conv2d,
      relu,
      max_pool,
      batch_norm,
      dropout,
      flatten,
      global_avg_pool,
      residual,
      tanh,
      sigmoid,
      leaky_relu,
    };
    Kind kind = Kind::relu;  ///< what the layer is; the fields below that it uses say the rest
    std::size_t units = 0;    ///< dense: outputs; conv2d: output channels
    std::size_t kernel = 0;   ///< conv2d, max_pool: the square window's side
    std::size_t stride = 1;   ///< conv2d, max_pool (0 for max_pool: the kernel)
    std::size_t pad = 0;      ///< conv2d: zero padding on each side
    bool bias = true;         ///< conv2d
    double p = 0.0;           ///< dropout: probability of zeroing a unit, in [0, 1)
    double negative_slope = 0.01;  ///< leaky_relu: y = negative_slope * x below zero (finite)
    std::vector<Layer> main;      ///< residual: the main path
    std::vector<Layer> shortcut;  ///< residual: the shortcut; empty is the identity
  };

  /// `name` is what JobSummary::model, checkpoints and Predictor::model()
  /// report.
  explicit ModelSpec(std::string name = "custom") : name_(std::move(name)) {}

  /// Fully connected, `units` outputs, with bias (torch.nn.Linear).
  ModelSpec& dense(std::size_t units) {
    Layer& l = push(Layer::Kind::dense);
    l.units = units;
    return *this;
  }
  /// 2-D convolution on (C, H, W): `out_channels` square `kernel`s
  /// (torch.nn.Conv2d(C, out_channels, kernel, stride, pad, bias=bias)).
  ModelSpec& conv2d(std::size_t out_channels, std::size_t kernel, std::size_t stride = 1, std::size_t pad = 0,
                    bool bias = true) {
    Layer& l = push(Layer::Kind::conv2d);
    l.units = out_channels;
    l.kernel = kernel;
    l.stride = stride;
    l.pad = pad;
    l.bias = bias;
    return *this;
  }
  /// y = max(x, 0), elementwise (torch.nn.ReLU).
  ModelSpec& relu() {
    push(Layer::Kind::relu);
    return *this;
  }
  /// y = tanh(x), elementwise (torch.nn.Tanh).
  ModelSpec& tanh() {
    push(Layer::Kind::tanh);
    return *this;
  }
  /// y = 1 / (1 + exp(-x)), elementwise (torch.nn.Sigmoid).
  ModelSpec& sigmoid() {
    push(Layer::Kind::sigmoid);
    return *this;
  }
  /// y = x above zero, else negative_slope * x, elementwise
  /// (torch.nn.LeakyReLU(negative_slope), whose default is 0.01).
  ModelSpec& leaky_relu(double negative_slope = 0.01) {
    push(Layer::Kind::leaky_relu).negative_slope = negative_slope;
    return *this;
  }
  /// Max pooling over `kernel` x `kernel` windows, stride `stride` (0: kernel).
  ModelSpec& max_pool(std::size_t kernel, std::size_t stride = 0) {
    Layer& l = push(Layer::Kind::max_pool);
    l.kernel = kernel;
    l.stride = stride;
    return *this;
  }
  /// Per-channel batch normalisation of (C, H, W) (torch.nn.BatchNorm2d).
  ModelSpec& batch_norm() {
    push(Layer::Kind::batch_norm);
    return *this;
  }
  /// Inverted dropout with probability `p` in [0, 1); identity at inference.
  ModelSpec& dropout(double p) {
    push(Layer::Kind::dropout).p = p;
    return *this;
  }
  /// (C, H, W) -> (C * H * W) (torch.nn.Flatten); dense layers flatten by
  /// themselves, so this only names the step.
  ModelSpec& flatten() {
    push(Layer::Kind::flatten);
    return *this;
  }
  /// (C, H, W) -> (C): the mean of each channel.
  ModelSpec& global_avg_pool() {
    push(Layer::Kind::global_avg_pool);
    return *this;
  }
  /// y = main(x) + shortcut(x), both paths given as specs (their names are
  /// ignored; an empty shortcut is the identity). Both must give the same
  /// shape. Add relu() after it for a ResNet basic block.
  ModelSpec& residual(const ModelSpec& main, const ModelSpec& shortcut = ModelSpec()) {
    std::vector<Layer> main_path = main.layers_, shortcut_path = shortcut.layers_;  // either may be *this
    Layer& l = push(Layer::Kind::residual);
    l.main = std::move(main_path);
    l.shortcut = std::move(shortcut_path);
    return *this;
  }

  /// The name given to the constructor.
  const std::string& name() const { return name_; }
  /// The layers added so far, in order.
  const std::vector<Layer>& layers() const { return layers_; }

  /// The spec as JSON text (what a checkpoint records), and back. from_json
  /// errors: invalid_argument for text that is not a spec.
  std::string to_json() const;
  static Result<ModelSpec> from_json(const std::string& text);

 private:
  Layer& push(Layer::Kind kind) {
    layers_.emplace_back().kind = kind;
    return layers_.back();
  }
  std::string name_;
  std::vector<Layer> layers_;
};

/// Whether `spec` builds a model for samples of `sample_shape` ((C, H, W) or
/// (N)) and `classes` outputs, and how many parameters it has. Errors:
/// invalid_argument naming the layer (by index) and the problem: an empty
/// spec, a layer that needs images after the samples became vectors, a
/// window larger than its input, a zero size, dropout p outside [0, 1), a
/// last layer whose outputs are not `classes`.
Result<std::size_t> validate(const ModelSpec& spec, const std::vector<std::size_t>& sample_shape,
                             std::size_t classes);

}  // namespace asgd
