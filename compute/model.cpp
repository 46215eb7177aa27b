#include "compute/model.hpp"

#include <cassert>
#include <cmath>

#include "base/cpus.hpp"
#include "compute/denormals.hpp"
#include "compute/layer_registry.hpp"
#include "compute/layers/batch_norm2d.hpp"
#include "compute/layers/conv2d.hpp"
#include "compute/layers/dense.hpp"
#include "compute/layers/flatten.hpp"
#include "compute/layers/global_avg_pool.hpp"
#include "compute/layers/max_pool2d.hpp"
#include "compute/layers/relu.hpp"
#include "compute/layers/residual.hpp"
#include "base/random.hpp"

namespace asgd {

const std::vector<std::string>& known_models() {
  static const std::vector<std::string> names = {"mlp", "lenet", "resnet-mini", "resnet18"};
  return names;
}

namespace {

constexpr std::size_t kMostAtOnce = 1000;  // samples an inference pass computes at once, at most

template <class... L>
Layers sequence(std::unique_ptr<L>... layers) {
  Layers out;
  (out.push_back(std::move(layers)), ...);
  return out;
}

// A ResNet basic block that changes width and halves H and W: the main path
// is two 3x3 convolutions with BatchNorm, the shortcut a 1x1 projection.
std::unique_ptr<Layer> downsampling_block(std::size_t in, std::size_t out) {
  auto main = sequence(std::make_unique<Conv2D>(in, out, 3, 2, 1, false), std::make_unique<BatchNorm2D>(out),
                       std::make_unique<ReLU>(), std::make_unique<Conv2D>(out, out, 3, 1, 1, false),
                       std::make_unique<BatchNorm2D>(out));
  auto shortcut = sequence(std::make_unique<Conv2D>(in, out, 1, 2, 0, false), std::make_unique<BatchNorm2D>(out));
  return std::make_unique<Residual>(std::move(main), std::move(shortcut));
}

// ResNet's basic block (He et al. 2016): two 3x3 convolutions with
// BatchNorm; the shortcut is the identity where the shape stays, else a 1x1
// projection with BatchNorm (option B).
std::unique_ptr<Layer> basic_block(std::size_t in, std::size_t out, std::size_t stride) {
  auto main = sequence(std::make_unique<Conv2D>(in, out, 3, stride, 1, false), std::make_unique<BatchNorm2D>(out),
                       std::make_unique<ReLU>(), std::make_unique<Conv2D>(out, out, 3, 1, 1, false),
                       std::make_unique<BatchNorm2D>(out));
  Layers shortcut;
  if (stride != 1 || in != out)
    shortcut = sequence(std::make_unique<Conv2D>(in, out, 1, stride, 0, false), std::make_unique<BatchNorm2D>(out));
  return std::make_unique<Residual>(std::move(main), std::move(shortcut));
}

void collect_batchnorms(Layer& layer, std::vector<BatchNorm2D*>& out) {
  if (auto* bn = dynamic_cast<BatchNorm2D*>(&layer)) out.push_back(bn);
  for (Layer* child : layer.children()) collect_batchnorms(*child, out);
}

}  // namespace

Model::~Model() = default;

Result<Model> Model::build(const std::string& name, const ModelSpec* spec, const Shape& sample_shape,
                           std::size_t classes) {
  return spec ? build(*spec, sample_shape, classes) : build(name, sample_shape, classes);
}

Result<Model> Model::build(const ModelSpec& spec, const Shape& sample_shape, std::size_t classes) {
  auto m = assemble(spec, sample_shape, classes);
  if (m) m->finalize();
  return m;
}

Result<std::size_t> Model::count_params(const ModelSpec& spec, const Shape& sample_shape, std::size_t classes) {
  auto m = assemble(spec, sample_shape, classes);
  if (!m) return m.status();
  return m->num_params();
}

Result<Model> Model::assemble(const ModelSpec& spec, const Shape& sample_shape, std::size_t classes) {
  auto bad = [&](const std::string& why) { return Status::InvalidArgument("model '" + spec.name() + "': " + why); };
  if (spec.layers().empty()) return bad("the spec has no layers");
  if (sample_shape.empty() || numel(sample_shape) == 0)
    return bad("samples of shape " + shape_string(sample_shape) + " hold no values");
  Shape shape = sample_shape;
  auto layers = build_layers(spec.layers(), shape, "");
  if (!layers) return bad(layers.status().message());
  if (shape != Shape{classes})
    return bad("the last layer gives " + shape_string(shape) + ", the data has " + std::to_string(classes) +
               " classes (end with dense(" + std::to_string(classes) + "))");
  Model m;
  m.name_ = spec.name();
  m.sample_shape_ = sample_shape;
  m.weight_init_ = WeightInit::torch_default;
  Shape running = sample_shape;
  for (auto& layer : *layers) m.add(std::move(layer), running);
  if (Status s = m.size_status(); !s.ok()) return s;
  m.classes_ = classes;
  return m;
}

Result<Model> Model::build(const std::string& name, const Shape& sample_shape, std::size_t classes) {
  Model m;
  m.name_ = name;
  m.sample_shape_ = sample_shape;
  const bool image = sample_shape.size() == 3;
  const std::size_t channels = image ? sample_shape[0] : 0;
  const std::size_t side = image ? std::min(sample_shape[1], sample_shape[2]) : 0;
  auto too_small = [&](std::size_t min_side) {
    return Status::InvalidArgument("model '" + name + "' needs image samples (C, H, W) with H and W >= " +
                                   std::to_string(min_side) + ", not " + shape_string(sample_shape));
  };
  if (name == "mlp") {
    Shape shape = {numel(sample_shape)};  // Dense layers see the sample flattened
    m.add(std::make_unique<Dense>(shape[0], 256), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<Dense>(256, 128), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<Dense>(128, classes), shape);
  } else if (name == "lenet") {
    if (side < 16) return too_small(16);
    // With He's bound (2.4x torch's) lenet trained under async to 0.985-0.990
    // test accuracy in 6 epochs, and diverged at lr 0.05; with torch's
    // default 0.9905-0.9915 (asgd train --model lenet --policy async
    // --workers 2 --epochs 6, seeds 1 and 3).
    m.weight_init_ = WeightInit::torch_default;
    Shape shape = sample_shape;
    m.add(std::make_unique<Conv2D>(channels, 16, 5), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<MaxPool2D>(2), shape);
    m.add(std::make_unique<Conv2D>(16, 32, 5), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<MaxPool2D>(2), shape);
    m.add(std::make_unique<Flatten>(), shape);
    m.add(std::make_unique<Dense>(shape[0], 128), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<Dense>(128, classes), shape);
  } else if (name == "resnet-mini") {
    if (side < 4) return too_small(4);
    m.weight_init_ = WeightInit::torch_default;
    Shape shape = sample_shape;
    m.add(std::make_unique<Conv2D>(channels, 16, 3, 1, 1, false), shape);
    m.add(std::make_unique<BatchNorm2D>(16), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(downsampling_block(16, 32), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(downsampling_block(32, 64), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<GlobalAvgPool>(), shape);
    m.add(std::make_unique<Dense>(64, classes), shape);
  } else if (name == "resnet18") {
    // The CIFAR variant (a 3x3 stem, no max-pool): four stages of two basic
    // blocks, 64 to 512 channels, the last three halving H and W; 11.2M
    // parameters for 10 classes.
    if (side < 8) return too_small(8);
    m.weight_init_ = WeightInit::torch_default;
    Shape shape = sample_shape;
    m.add(std::make_unique<Conv2D>(channels, 64, 3, 1, 1, false), shape);
    m.add(std::make_unique<BatchNorm2D>(64), shape);
    m.add(std::make_unique<ReLU>(), shape);
    std::size_t width = 64;
    for (const std::size_t stage : {64, 128, 256, 512}) {
      for (int b = 0; b < 2; ++b) {
        m.add(basic_block(width, stage, b == 0 && stage != 64 ? 2 : 1), shape);
        m.add(std::make_unique<ReLU>(), shape);
        width = stage;
      }
    }
    m.add(std::make_unique<GlobalAvgPool>(), shape);
    m.add(std::make_unique<Dense>(512, classes), shape);
  } else {
    std::string known;
    for (const auto& k : known_models()) known += (known.empty() ? "" : ", ") + k;
    return Status::InvalidArgument("unknown model '" + name + "' (known: " + known + ")");
  }
  if (Status s = m.size_status(); !s.ok()) return s;
  m.classes_ = classes;
  m.finalize();
  return m;
}

void Model::add(std::unique_ptr<Layer> layer, Shape& shape) {
  const std::size_t index = layers_.size();
  layer_offset_.push_back(num_params_);
  std::size_t count = 0;
  for (const ParamSpec& spec : layer->param_specs()) {
    const auto n = numel_within(spec.shape, kMaxParams);
    const std::size_t offset = num_params_ + count;
    if (!n || __builtin_add_overflow(count, *n, &count) || count > kMaxParams) {
      if (oversized_.empty()) oversized_ = "layer " + std::to_string(index) + " alone";
      count = 0;
      break;
    }
    layout_.push_back({std::to_string(index) + "." + spec.name, spec.shape, offset, *n});
  }
  if (oversized_.empty() && (__builtin_add_overflow(num_params_, count, &num_params_) || num_params_ > kMaxParams))
    oversized_ = "layers 0 to " + std::to_string(index);
  layer_size_.push_back(count);
  shape = layer->output_shape(shape);
  layers_.push_back(std::move(layer));
}

Status Model::size_status() const {
  if (oversized_.empty()) return {};
  return Status::InvalidArgument("model '" + name_ + "': " + oversized_ + " would have too many parameters (more than " +
                                 std::to_string(kMaxParams) + ", " + std::to_string(kMaxParams * sizeof(float) >> 30) +
                                 " GiB of floats)");
}

void Model::finalize() {
  params_.resize(num_params_);
  use_compute(std::make_shared<ComputeContext>(usable_cpus()));
  for (const auto& layer : layers_) collect_batchnorms(*layer, batchnorms_);
  grads_.assign(params_.size(), 0.0f);
  bind_layers();
  acts_.resize(layers_.size());
  grad_acts_.resize(2);
  Shape shape = sample_shape_;
  for (const auto& layer : layers_) {
    activation_floats_ += layer->activation_floats(shape);
    shape = layer->output_shape(shape);
  }
}

std::size_t Model::inference_chunk() const {
  // On a device the layers' host activations stay unused, and a GPU wants
  // large batches: 1000, as it always ran.
  return device_model_ ? kMostAtOnce : host_chunk();
}

std::size_t Model::host_chunk() const {
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  const std::size_t per_sample = std::max<std::size_t>(activation_floats_, 1) * sizeof(float);
  return std::clamp<std::size_t>(kBytes / per_sample, 1, kMostAtOnce);
}

void Model::use_compute(std::shared_ptr<ComputeContext> context) {
  compute_ = std::move(context);
  pool_ = compute_->make_pool();
  for (const auto& layer : layers_) layer->set_pool(pool_.get());
}

void Model::bind_layers() {
  if (!external_params_) view_ = params_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->bind(view_.subspan(layer_offset_[i], layer_size_[i]),
                     std::span(grads_).subspan(layer_offset_[i], layer_size_[i]));
  }
}

void Model::swap_params(std::vector<float>& storage) {
  assert(storage.size() == params_.size() && !external_params_);
  params_.swap(storage);
  bind_layers();
}

void Model::use_params(std::span<float> storage) {
  assert(storage.size() == params_.size());
  external_params_ = true;
  view_ = storage;
  bind_layers();
}

void Model::swap_grads(std::vector<float>& storage) {
  assert(storage.size() == grads_.size());
  grads_.swap(storage);
  bind_layers();
}

void Model::init_params(std::uint64_t seed) {
  Rng rng(seed);
  std::size_t entry = 0;
  for (const auto& layer : layers_) {
    for (const ParamSpec& spec : layer->param_specs()) {
      const ParamEntry& e = layout_[entry++];
      float* p = view_.data() + e.offset;
      if (spec.init == Init::he_uniform) {
        const float fan_in = static_cast<float>(spec.fan_in);
        const float bound = weight_init_ == WeightInit::he ? std::sqrt(6.0f / fan_in) : 1.0f / std::sqrt(fan_in);
        for (std::size_t i = 0; i < e.size; ++i) p[i] = rng.uniform(-bound, bound);
      } else {
        std::fill(p, p + e.size, spec.init == Init::ones ? 1.0f : 0.0f);
      }
    }
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) layers_[i]->reseed(mix_seed(seed, i, 0x5eed));
}

Status Model::set_device(const Device& device) {
  if (device.kind == Device::Kind::cpu) {
    device_model_.reset();
    device_ = device;
    return {};
  }
  std::vector<Layer*> layers;
  for (const auto& layer : layers_) layers.push_back(layer.get());
  auto made = make_cuda_model(layers, sample_shape_, params_.size(), device.index);
  if (!made) return made.status();
  device_model_ = std::move(made).value();
  device_ = device;
  return {};
}

void Model::set_training(bool training) {
  if (training == training_) return;
  training_ = training;
  for (const auto& layer : layers_) layer->set_training(training);
}

std::vector<LayerBuffer> Model::buffers() {
  std::vector<LayerBuffer> out;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    for (LayerBuffer& b : layers_[i]->buffers()) out.push_back({std::to_string(i) + "." + b.name, b.values});
  return out;
}

std::vector<float> Model::scores(std::span<const float> x) {
  const FlushDenormals flush;
  std::vector<float> out;
  out.reserve(x.size() / sample_size() * classes_);
  each_chunk_of_logits(x, inference_chunk(), [&](std::size_t, const Tensor& part) {
    out.insert(out.end(), part.span().begin(), part.span().end());
  });
  return out;
}

void Model::each_chunk_of_logits(std::span<const float> x, std::size_t chunk,
                                 const std::function<void(std::size_t, const Tensor&)>& f) {
  const std::size_t n = x.size() / sample_size();
  set_training(false);
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t b = std::min(chunk, n - begin);
    f(begin, logits(x.subspan(begin * sample_size(), b * sample_size()), b));
  }
}

std::vector<std::int32_t> Model::classify(std::span<const float> x, std::size_t chunk) {
  const FlushDenormals flush;
  std::vector<std::int32_t> out(x.size() / sample_size());
  each_chunk_of_logits(x, chunk == 0 ? inference_chunk() : chunk, [&](std::size_t begin, const Tensor& scores) {
    for (std::size_t r = 0; r < scores.shape()[0]; ++r) {
      const float* z = scores.data() + r * classes_;
      out[begin + r] = static_cast<std::int32_t>(std::max_element(z, z + classes_) - z);
    }
  });
  return out;
}

void Model::prefetch(std::span<const float> x, std::span<const std::int32_t> y) {
  // A malformed batch is refused here, on every device, before any copy.
  if (x.size() != y.size() * sample_size())
    throw std::invalid_argument("a batch of " + std::to_string(y.size()) + " labels with " + std::to_string(x.size()) +
                                " input values: samples of " + shape_string(sample_shape_) + " need " +
                                std::to_string(y.size() * sample_size()));
  if (device_model_) device_model_->prefetch(x, y);
}

void Model::recalibrate_batchnorm(std::span<const float> x, std::size_t chunk) {
  if (batchnorms_.empty()) return;
  const FlushDenormals flush;
  chunk = std::min(chunk == 0 ? kRecalibrationChunk : chunk, host_chunk());
  // Whole chunks only: a last, smaller one would weigh as much in the
  // average as a whole one (and one sample alone has no variance).
  std::size_t n = x.size() / sample_size();
  if (n > chunk) n -= n % chunk;
  set_training(true);
  for (BatchNorm2D* bn : batchnorms_) bn->begin_recalibration();
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t b = std::min(chunk, n - begin);
    forward_layers(x.subspan(begin * sample_size(), b * sample_size()), b);
  }
  for (BatchNorm2D* bn : batchnorms_) bn->end_recalibration();
}

void Model::forward_layers(std::span<const float> x, std::size_t batch) {
  Shape in_shape = {batch};
  in_shape.insert(in_shape.end(), sample_shape_.begin(), sample_shape_.end());
  ConstTensorView in{x.data(), in_shape};
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(in, acts_[i]);
    in = ConstTensorView{acts_[i].data(), acts_[i].shape()};
  }
}

const Tensor& Model::logits(std::span<const float> x, std::size_t batch) {
  if (!device_model_) {
    forward_layers(x, batch);
    return acts_.back();
  }
  logits_.resize({batch, classes_});  // inference on the device
  device_model_->infer(view_, x, batch, logits_.span());
  return logits_;
}

float Model::forward(std::span<const float> x, std::size_t batch, std::span<const std::int32_t> y) {
  const Tensor& out = logits(x, batch);
  return loss_.forward(ConstTensorView{out.data(), out.shape()}, y);
}

float Model::compute_gradients(std::span<const float> x, std::span<const std::int32_t> y) {
  const FlushDenormals flush;
  const std::size_t batch = y.size();
  if (batch == 0) {  // no samples, no gradient (and no 1/0 in the loss)
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return 0.0f;
  }
  set_training(true);
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto t0 = Clock::now();
  step_times_ = {};
  if (device_model_) {
    const float loss = device_model_->compute_gradients(view_, grads_, x, y);
    const double step_s = seconds(t0, Clock::now());
    const DeviceModel::StepPhases p = device_model_->last_step_phases();
    step_times_.forward_s = p.forward_s;
    step_times_.backward_s = p.backward_s;
    step_times_.copy_s = p.copy_s;
    step_times_.device_s = std::max(0.0, step_s - p.forward_s - p.backward_s - p.copy_s);
    return loss;
  }
  const float loss = forward(x, batch, y);
  const auto t1 = Clock::now();
  step_times_.forward_s = seconds(t0, t1);
  Tensor* dy = &grad_acts_[0];
  Tensor* dx = &grad_acts_[1];
  loss_.backward(y, *dy);
  Shape in_shape = {batch};
  in_shape.insert(in_shape.end(), sample_shape_.begin(), sample_shape_.end());
  for (std::size_t i = layers_.size(); i-- > 0;) {
    ConstTensorView in = i == 0 ? ConstTensorView{x.data(), in_shape}
                                : ConstTensorView{acts_[i - 1].data(), acts_[i - 1].shape()};
    layers_[i]->backward(in, acts_[i], *dy, i == 0 ? nullptr : dx);
    std::swap(dy, dx);
  }
  step_times_.backward_s = seconds(t1, Clock::now());
  return loss;
}

EvalResult Model::evaluate(std::span<const float> x, std::span<const std::int32_t> y, std::size_t chunk) {
  const std::size_t per_sample = sample_size();
  return evaluate_chunks([&](std::size_t first, std::size_t n) { return x.subspan(first * per_sample, n * per_sample); },
                         y, chunk);
}

EvalResult Model::evaluate_from(const SampleFill& fill, std::span<const std::int32_t> y, std::size_t chunk) {
  const std::size_t per_sample = sample_size();
  std::vector<float> buffer;
  return evaluate_chunks(
      [&](std::size_t first, std::size_t n) {
        buffer.resize(n * per_sample);
        fill(first, n, buffer.data());
        return std::span<const float>(buffer);
      },
      y, chunk);
}

EvalResult Model::evaluate_chunks(const std::function<std::span<const float>(std::size_t, std::size_t)>& chunk_at,
                                  std::span<const std::int32_t> y, std::size_t chunk) {
  const FlushDenormals flush;
  EvalResult r;
  const std::size_t n = y.size();
  if (chunk == 0) chunk = inference_chunk();
  set_training(false);
  double loss_sum = 0.0;
  std::size_t hits = 0;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t b = std::min(chunk, n - begin);
    auto labels = y.subspan(begin, b);
    loss_sum += static_cast<double>(forward(chunk_at(begin, b), b, labels)) * static_cast<double>(b);
    hits += loss_.correct(labels);
  }
  r.samples = n;
  if (n > 0) {
    r.loss = loss_sum / static_cast<double>(n);
    r.accuracy = static_cast<double>(hits) / static_cast<double>(n);
  }
  return r;
}

}  // namespace asgd
