#pragma once
// A sequential model: layers, one flat parameter allocation split into
// per-tensor views (llm.c style), and a matching gradient allocation. The
// flat vector is what a worker pulls and pushes; keys are its indices.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asgd/model_spec.hpp"
#include "asgd/status.hpp"
#include "compute/context.hpp"
#include "compute/device.hpp"
#include "compute/layer.hpp"
#include "compute/loss.hpp"

namespace asgd {

class BatchNorm2D;

/// Where one named parameter tensor sits in the flat vector. Names follow
/// torch.nn.Sequential ("0.weight", "0.bias", "2.weight", ...), so exported
/// weights load into the equivalent PyTorch module.
struct ParamEntry {
  std::string name;
  Shape shape;
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// Loss and accuracy over a set of samples.
struct EvalResult {
  double loss = 0.0;       // mean cross-entropy
  double accuracy = 0.0;   // fraction of argmax == label
  std::size_t samples = 0;
};

/// Model names build() accepts, for help texts and errors.
const std::vector<std::string>& known_models();

/// Not thread-safe: each worker owns its own Model. Move-only (layers point
/// into the model's own buffers, which a move keeps in place).
class Model {
 public:
  /// Builds a model by name for samples of `sample_shape` (C, H, W) and
  /// `classes` outputs, on the CPU (set_device moves it). Errors:
  /// invalid_argument for an unknown name or inputs too small for it.
  /// Parameter counts are for MNIST's (1, 28, 28) and 10 classes:
  ///   mlp: Dense(784, 256) -> ReLU -> Dense(256, 128) -> ReLU
  ///        -> Dense(128, 10); 235,146 parameters.
  ///   lenet: Conv(1->16, 5x5) -> ReLU -> MaxPool(2) -> Conv(16->32, 5x5)
  ///        -> ReLU -> MaxPool(2) -> Flatten -> Dense(512, 128) -> ReLU
  ///        -> Dense(128, 10); 80,202 parameters.
  ///   resnet-mini: Conv(1->16, 3x3) -> BN -> ReLU, then two residual
  ///        blocks (16->32 and 32->64 channels, each halving H and W:
  ///        Conv 3x3 stride 2 -> BN -> ReLU -> Conv 3x3 -> BN, plus a 1x1
  ///        stride-2 projection with BN; ReLU after the add) -> global
  ///        average pool -> Dense(64, 10); 73,082 parameters (plus 608
  ///        BatchNorm running-statistic values, which are not parameters).
  static Result<Model> build(const std::string& name, const Shape& sample_shape, std::size_t classes);

  /// Builds the model `spec` describes (named spec.name()), inferring each
  /// layer's input size from the running shape. Weights start as torch.nn's
  /// defaults (bound 1 / sqrt(fan_in)). Errors: invalid_argument naming the
  /// layer ("layer 3 (max_pool): ...") when the spec does not fit
  /// `sample_shape` or `classes` (see asgd::validate(const ModelSpec&, ...)).
  static Result<Model> build(const ModelSpec& spec, const Shape& sample_shape, std::size_t classes);

  /// What build(spec, ...) would check, and the parameter count it would
  /// allocate, without allocating it.
  static Result<std::size_t> count_params(const ModelSpec& spec, const Shape& sample_shape, std::size_t classes);

  /// build(*spec, ...) when `spec` is set, else build(name, ...): what every
  /// place that builds a job's model calls.
  static Result<Model> build(const std::string& name, const ModelSpec* spec, const Shape& sample_shape,
                             std::size_t classes);

  Model(Model&&) = default;
  Model& operator=(Model&&) = default;
  ~Model();

  const std::string& name() const { return name_; }
  const Shape& sample_shape() const { return sample_shape_; }
  std::size_t classes() const { return classes_; }
  std::size_t num_params() const { return num_params_; }
  const std::vector<ParamEntry>& layout() const { return layout_; }

  const Device& device() const { return device_; }

  /// Computes on a pool of `context`'s threads from now on (the job's
  /// budget). A model starts with a context of its own, one thread per core
  /// (what OpenBLAS would take when nobody set its count).
  void use_compute(std::shared_ptr<ComputeContext> context);
  const ComputeContext& compute() const { return *compute_; }

  /// Moves the computation to `device`: compute_gradients, evaluate and
  /// prefetch run there; parameters and gradients stay in host memory.
  /// Errors: unavailable when the device cannot be used (the model stays
  /// where it was).
  Status set_device(const Device& device);

  std::span<float> params() { return view_; }
  std::span<const float> params() const { return view_; }
  std::span<const float> grads() const { return grads_; }

  /// Exchanges the parameter (or gradient) storage with `storage`, which
  /// must hold num_params() values, and rebinds the layers: an in-process
  /// worker trades whole buffers with its shard instead of copying them.
  void swap_params(std::vector<float>& storage);
  void swap_grads(std::vector<float>& storage);

  /// From now on computes on `storage` (num_params() values, owned by the
  /// caller and outliving this model) instead of its own parameters: hogwild
  /// workers share one buffer this way. Afterwards swap_params must not be
  /// called.
  void use_params(std::span<float> storage);

  /// Initialises every parameter from `seed`; the same seed gives bitwise
  /// the same parameters. Weights are uniform in +-bound with bound =
  /// sqrt(6 / fan_in) (He) for mlp, and 1 / sqrt(fan_in) (torch.nn's default
  /// for Conv2d and Linear) for lenet and resnet-mini; biases and BatchNorm
  /// shifts 0, BatchNorm scales 1.
  void init_params(std::uint64_t seed);

  /// Forward and backward over one batch x (B, sample...) with labels y (B,):
  /// overwrites grads() with the gradient of the mean loss, returns that loss.
  /// An empty batch gives loss 0 and zero gradients.
  float compute_gradients(std::span<const float> x, std::span<const std::int32_t> y);

  /// Forward only, in inference mode (running statistics, no dropout), over
  /// n samples stored back to back, in chunks of `chunk` (0: inference_chunk()).
  EvalResult evaluate(std::span<const float> x, std::span<const std::int32_t> y, std::size_t chunk = 0);
  /// The same over y.size() samples that `fill(first, n, out)` writes as
  /// floats into `out`, a chunk at a time: for samples not held as floats
  /// (a dataset's bytes), whatever their number, in one chunk's memory.
  using SampleFill = std::function<void(std::size_t first, std::size_t n, float* out)>;
  EvalResult evaluate_from(const SampleFill& fill, std::span<const std::int32_t> y, std::size_t chunk = 0);

  /// The samples an inference pass computes at once by default: as many as
  /// keep the activations it holds within about 256 MiB, at most 1000 (the
  /// mlp and lenet take 1000; resnet18 on 28x28 images about 40, where 1000
  /// held some 6 GB, and kept them for the model's life). On a device
  /// (set_device), 1000.
  std::size_t inference_chunk() const;
  /// The same bound on the host, on any device: the samples whose
  /// activations fit in about 256 MiB, at most 1000.
  std::size_t host_chunk() const;

  /// How long the last compute_gradients took, by phase: forward and
  /// backward (on a GPU, on the device's clock), the copies of parameters
  /// up and gradients down (GPU), and the rest of a GPU step (the batch's
  /// upload, launches, waits).
  struct StepTimes {
    double forward_s = 0.0;
    double backward_s = 0.0;
    double copy_s = 0.0;
    double device_s = 0.0;
  };
  const StepTimes& last_step_times() const { return step_times_; }

  /// The scores (logits) of the samples stored back to back in `x`, in
  /// inference mode: (n, classes), row-major.
  std::vector<float> scores(std::span<const float> x);

  /// The class with the largest score for each of the samples stored back
  /// to back in `x`, in inference mode, in chunks of `chunk` (0:
  /// inference_chunk()).
  std::vector<std::int32_t> classify(std::span<const float> x, std::size_t chunk = 0);

  /// A hint that the next compute_gradients will be on this batch: a GPU
  /// starts uploading it now. x and y must stay unchanged until that call.
  /// Throws std::invalid_argument for a batch whose inputs do not match its
  /// labels (on every device), and what the device throws (no memory for a
  /// larger batch, a CUDA error).
  void prefetch(std::span<const float> x, std::span<const std::int32_t> y);

  /// True when some layer keeps running statistics (BatchNorm).
  bool has_batchnorm() const { return !batchnorms_.empty(); }

  /// Recomputes every BatchNorm's running statistics for the current
  /// parameters as the equally weighted average over `x` (samples back to
  /// back, in chunks of `chunk`), as torch.optim.swa_utils.update_bn does.
  /// Evaluations of parameters that no worker trained (a shard's, an
  /// average) need this: the running statistics a model carries belong to
  /// other parameters. Does nothing without BatchNorm layers. The
  /// statistics depend on the chunk (each chunk is normalised by its own
  /// statistics on the way to the next layer), so it is the same on every
  /// device: `chunk` (0: kRecalibrationChunk; the coordinator passes the
  /// job's batch, the size training normalised by), or host_chunk() where
  /// that is smaller (resnet18 on 28x28 images: about 40). Only whole
  /// chunks are used (the samples of a last, smaller one are left out),
  /// unless `x` holds less than one.
  void recalibrate_batchnorm(std::span<const float> x, std::size_t chunk = 0);
  static constexpr std::size_t kRecalibrationChunk = 64;

  /// Non-trained state by name ("1.running_mean", "3.main.1.running_var"),
  /// in layer order, viewing the layers' own storage.
  std::vector<LayerBuffer> buffers();

 private:
  Model() = default;
  void add(std::unique_ptr<Layer> layer, Shape& shape);
  // What add() found too big to hold, as the build's error; ok otherwise.
  Status size_status() const;
  // build(spec, ...) up to the allocation: layers added, sizes planned.
  static Result<Model> assemble(const ModelSpec& spec, const Shape& sample_shape, std::size_t classes);
  void finalize();
  void bind_layers();
  void set_training(bool training);
  std::size_t sample_size() const { return numel(sample_shape_); }
  float forward(std::span<const float> x, std::size_t batch, std::span<const std::int32_t> y);
  // evaluate() over the chunks that `chunk_at(first, n)` gives.
  EvalResult evaluate_chunks(const std::function<std::span<const float>(std::size_t, std::size_t)>& chunk_at,
                             std::span<const std::int32_t> y, std::size_t chunk);
  void forward_layers(std::span<const float> x, std::size_t batch);
  // (B, classes) scores: the CPU layers' last output, or (on a device,
  // which runs inference only through this) the device's in logits_.
  const Tensor& logits(std::span<const float> x, std::size_t batch);
  // Calls f(first sample, its chunk's (b, classes) logits) for each chunk
  // of `chunk` samples of `x`, in inference mode.
  void each_chunk_of_logits(std::span<const float> x, std::size_t chunk,
                            const std::function<void(std::size_t, const Tensor&)>& f);

  std::string name_;
  Shape sample_shape_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParamEntry> layout_;
  std::vector<std::size_t> layer_offset_;  // per layer: first parameter index
  std::vector<std::size_t> layer_size_;    // per layer: parameter count
  std::size_t activation_floats_ = 0;      // per sample: what a forward pass holds (Layer::activation_floats)
  std::size_t num_params_ = 0;             // planned by add(), allocated by finalize()
  std::string oversized_;                  // the first layer add() found too big
  std::vector<float> params_;
  std::span<float> view_;                  // params_, or external storage (use_params)
  bool external_params_ = false;
  std::vector<float> grads_;
  std::vector<Tensor> acts_;               // acts_[i] = output of layer i
  std::vector<Tensor> grad_acts_;          // scratch for dL/d(acts)
  SoftmaxCrossEntropy loss_;
  std::vector<BatchNorm2D*> batchnorms_;   // every BatchNorm, nested ones included
  bool training_ = true;
  enum class WeightInit { he, torch_default };
  WeightInit weight_init_ = WeightInit::he;
  std::shared_ptr<ComputeContext> compute_;
  std::shared_ptr<ThreadPool> pool_;       // from compute_; every layer's
  Device device_;
  std::unique_ptr<DeviceModel> device_model_;  // null on the CPU
  std::size_t classes_ = 0;
  Tensor logits_;                              // (B, classes) from the device in evaluate
  StepTimes step_times_;
};

}  // namespace asgd
