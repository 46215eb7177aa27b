#include "compute/model.hpp"

#include <cassert>
#include <cmath>

#include "compute/denormals.hpp"
#include "compute/random.hpp"

namespace asgd {

const std::vector<std::string>& known_models() {
  static const std::vector<std::string> names = {"mlp"};
  return names;
}

Model::~Model() = default;

Result<Model> Model::build(const std::string& name, const Shape& sample_shape, std::size_t classes) {
  Model m;
  m.name_ = name;
  m.sample_shape_ = sample_shape;
  Shape shape = {numel(sample_shape)};  // Dense layers see the sample flattened
  if (name == "mlp") {
    m.add(std::make_unique<Dense>(shape[0], 256), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<Dense>(256, 128), shape);
    m.add(std::make_unique<ReLU>(), shape);
    m.add(std::make_unique<Dense>(128, classes), shape);
  } else {
    return Status::InvalidArgument("unknown model '" + name + "' (known: mlp)");
  }
  m.finalize();
  return m;
}

void Model::add(std::unique_ptr<Layer> layer, Shape& shape) {
  const std::size_t index = layers_.size();
  layer_offset_.push_back(params_.size());
  std::size_t count = 0;
  for (const ParamSpec& spec : layer->param_specs()) {
    const std::size_t n = numel(spec.shape);
    layout_.push_back({std::to_string(index) + "." + spec.name, spec.shape, params_.size() + count, n});
    count += n;
  }
  params_.resize(params_.size() + count);
  layer_size_.push_back(count);
  shape = layer->output_shape(shape);
  layers_.push_back(std::move(layer));
}

void Model::finalize() {
  grads_.assign(params_.size(), 0.0f);
  bind_layers();
  acts_.resize(layers_.size());
  grad_acts_.resize(2);
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
        const float bound = std::sqrt(6.0f / static_cast<float>(spec.fan_in));
        for (std::size_t i = 0; i < e.size; ++i) p[i] = rng.uniform(-bound, bound);
      } else {
        std::fill(p, p + e.size, 0.0f);
      }
    }
  }
}

float Model::forward(std::span<const float> x, std::size_t batch, std::span<const std::int32_t> y) {
  Shape in_shape = {batch};
  in_shape.insert(in_shape.end(), sample_shape_.begin(), sample_shape_.end());
  ConstTensorView in{x.data(), in_shape};
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(in, acts_[i]);
    in = ConstTensorView{acts_[i].data(), acts_[i].shape()};
  }
  return loss_.forward(in, y);
}

float Model::compute_gradients(std::span<const float> x, std::span<const std::int32_t> y) {
  const FlushDenormals flush;
  const std::size_t batch = y.size();
  if (batch == 0) {  // no samples, no gradient (and no 1/0 in the loss)
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return 0.0f;
  }
  const float loss = forward(x, batch, y);
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
  return loss;
}

EvalResult Model::evaluate(std::span<const float> x, std::span<const std::int32_t> y, std::size_t chunk) {
  const FlushDenormals flush;
  EvalResult r;
  const std::size_t n = y.size();
  chunk = std::max<std::size_t>(chunk, 1);
  const std::size_t per_sample = numel(sample_shape_);
  double loss_sum = 0.0;
  std::size_t hits = 0;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t b = std::min(chunk, n - begin);
    auto labels = y.subspan(begin, b);
    loss_sum += static_cast<double>(forward(x.subspan(begin * per_sample, b * per_sample), b, labels)) *
                static_cast<double>(b);
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
