#include "asgd/predictor.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <unordered_map>

#include "compute/model.hpp"
#include "actors/checkpoint.hpp"
#include "dataset/dataset.hpp"
#include "runtime/checkpointed_model.hpp"

namespace asgd {

struct Predictor::Impl {
  Model model;
  std::vector<float> mean;         // per channel, or one for every channel
  std::vector<float> stddev;
  std::vector<float> normalised;  // (1, C, H, W) scratch
};

Predictor::Predictor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Predictor::Predictor(Predictor&&) noexcept = default;
Predictor& Predictor::operator=(Predictor&&) noexcept = default;
Predictor::~Predictor() = default;

namespace {

Status check_inputs(const Shape& sample_shape, std::size_t classes, const std::vector<float>& mean,
                    const std::vector<float>& stddev) {
  const std::optional<std::size_t> values = data::sample_values(sample_shape);  // {2^62, 4, 4} would wrap to 0
  if (sample_shape.size() != 3 || (values && *values == 0))
    return Status::InvalidArgument("sample shape must be (C, H, W) with no zero dimension");
  if (!values)
    return Status::InvalidArgument("sample shape " + shape_string(sample_shape) + " has more than " +
                                   std::to_string(data::kMaxSampleValues) + " values per sample");
  if (classes < 2) return Status::InvalidArgument("a classifier needs at least 2 classes");
  for (const std::vector<float>* v : {&mean, &stddev})
    if (v->size() != 1 && v->size() != sample_shape[0])
      return Status::InvalidArgument("the input normalisation has " + std::to_string(v->size()) +
                                     " values for samples of " + std::to_string(sample_shape[0]) +
                                     " channels (one per channel, or one for all)");
  for (const float s : stddev)
    if (!(s > 0.0f) || !std::isfinite(s))
      return Status::InvalidArgument("input stddev must be a positive number, got " + std::to_string(s));
  for (const float m : mean)
    if (!std::isfinite(m)) return Status::InvalidArgument("input mean must be a finite number, got " + std::to_string(m));
  return {};
}

}  // namespace

Result<Predictor> Predictor::from_params(const std::string& model, const std::vector<std::size_t>& sample_shape,
                                         std::size_t classes, std::span<const float> params, float input_mean,
                                         float input_stddev) {
  return from_params_impl(model, nullptr, sample_shape, classes, params, input_mean, input_stddev);
}

Result<Predictor> Predictor::from_params(const ModelSpec& spec, const std::vector<std::size_t>& sample_shape,
                                         std::size_t classes, std::span<const float> params, float input_mean,
                                         float input_stddev) {
  return from_params_impl(spec.name(), &spec, sample_shape, classes, params, input_mean, input_stddev);
}

Result<Predictor> Predictor::from_params_impl(const std::string& model, const ModelSpec* spec,
                                              const std::vector<std::size_t>& given_shape, std::size_t classes,
                                              std::span<const float> params, float input_mean, float input_stddev) {
  // Vectors (N) are (1, 1, N) inside, as a job on user data has them. Named
  // models keep their (C, H, W)-only contract.
  const Shape sample_shape = spec && given_shape.size() == 1 ? Shape{1, 1, given_shape[0]} : given_shape;
  if (Status s = check_inputs(sample_shape, classes, {input_mean}, {input_stddev}); !s.ok()) return s;
  auto built = Model::build(model, spec, sample_shape, classes);
  if (!built) return built.status();
  if (params.size() != built->num_params())
    return Status::InvalidArgument(model + " has " + std::to_string(built->num_params()) + " parameters, got " +
                                   std::to_string(params.size()));
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!std::isfinite(params[i]))
      return Status::InvalidArgument("parameter " + std::to_string(i) + " of " + model +
                                     " is not finite (NaN or infinity): the training it came from diverged?");
  std::copy(params.begin(), params.end(), built->params().begin());
  return Predictor(std::unique_ptr<Impl>(new Impl{std::move(built).value(), {input_mean}, {input_stddev}, {}}));
}

Result<Model> checkpointed_model(const Checkpoint& c, const std::string& where) {
  auto corrupt = [&](const std::string& why) { return Status::Corruption(where + ": " + why); };
  if (Status s = check_inputs(c.sample_shape, c.classes, c.input_mean, c.input_stddev); !s.ok())
    return corrupt(s.message());
  std::optional<ModelSpec> spec;
  if (!c.model_spec.empty()) {
    auto parsed = ModelSpec::from_json(c.model_spec);
    if (!parsed) return corrupt("model_spec: " + parsed.status().message());
    spec = std::move(parsed).value();
  }
  auto built = Model::build(c.model, spec ? &*spec : nullptr, c.sample_shape, c.classes);
  if (!built) return spec ? corrupt(built.status().message()) : built.status();
  Model& m = *built;

  // The layout is the contract: same names, shapes and order as this
  // build's model, or the numbers would land in the wrong tensors.
  const auto& layout = m.layout();
  if (layout.size() != c.params.size())
    return corrupt(std::to_string(c.params.size()) + " parameter tensors, " + c.model + " has " +
                   std::to_string(layout.size()));
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const ParamEntry& e = layout[i];
    const CheckpointTensor& t = c.params[i];
    if (t.name != e.name || t.shape != e.shape || t.values.size() != e.size)
      return corrupt("parameter " + t.name + " " + shape_string(t.shape) + " does not match " + c.model + "'s " +
                     e.name + " " + shape_string(e.shape));
    if (!all_finite(t.values))
      return corrupt("parameter " + t.name + " is not finite (NaN or infinity): the training it came from diverged?");
    std::copy(t.values.begin(), t.values.end(), m.params().begin() + static_cast<std::ptrdiff_t>(e.offset));
  }
  std::unordered_map<std::string, const CheckpointTensor*> saved;
  for (const CheckpointTensor& t : c.buffers)
    if (!saved.emplace(t.name, &t).second) return corrupt("buffer " + t.name + " appears twice");
  if (saved.size() != m.buffers().size())
    return corrupt(std::to_string(saved.size()) + " buffers, " + c.model + " has " +
                   std::to_string(m.buffers().size()));
  for (const LayerBuffer& b : m.buffers()) {
    const auto it = saved.find(b.name);
    if (it == saved.end()) return corrupt("buffer " + b.name + " is missing");
    if (it->second->values.size() != b.values.size()) return corrupt("buffer " + b.name + " has the wrong size");
    if (!all_finite(it->second->values)) return corrupt("buffer " + b.name + " is not finite (NaN or infinity)");
    std::copy(it->second->values.begin(), it->second->values.end(), b.values.begin());
  }
  return built;
}

Result<Predictor> Predictor::from_checkpoint(const std::string& dir) {
  auto ckpt = read_checkpoint(dir);
  if (!ckpt) return ckpt.status();
  auto model = checkpointed_model(*ckpt, dir);
  if (!model) return model.status();
  return Predictor(
      std::unique_ptr<Impl>(new Impl{std::move(model).value(), ckpt->input_mean, ckpt->input_stddev, {}}));
}

Result<std::vector<int>> Predictor::predict(std::span<const float> samples) {
  if (!impl_) return Status::InvalidArgument("this Predictor was moved from: use the one it was moved to");
  Impl& s = *impl_;
  const std::size_t per_sample = sample_size();
  if (samples.size() % per_sample != 0)
    return Status::InvalidArgument(std::to_string(samples.size()) + " values are not a whole number of samples of " +
                                   std::to_string(per_sample));
  for (const float v : samples)
    if (!std::isfinite(v)) return Status::InvalidArgument("a sample value is not finite");

  s.normalised.resize(samples.size());
  // Channel c of a sample is its c-th block of H x W values.
  const Shape& shape = s.model.sample_shape();
  const std::size_t plane = shape[1] * shape[2];
  for (std::size_t j = 0; j < samples.size(); ++j) {
    const std::size_t c = (j / plane) % shape[0];
    s.normalised[j] = (samples[j] - data::channel_value(s.mean, c)) / data::channel_value(s.stddev, c);
  }
  const std::vector<std::int32_t> best = s.model.classify(s.normalised);
  return std::vector<int>(best.begin(), best.end());
}

// A moved-from Predictor has no model: empty answers.
const std::string& Predictor::model() const {
  static const std::string none;
  return impl_ ? impl_->model.name() : none;
}
std::size_t Predictor::classes() const { return impl_ ? impl_->model.classes() : 0; }
std::size_t Predictor::sample_size() const { return impl_ ? numel(impl_->model.sample_shape()) : 0; }
const std::vector<std::size_t>& Predictor::sample_shape() const {
  static const std::vector<std::size_t> none;
  return impl_ ? impl_->model.sample_shape() : none;
}

}  // namespace asgd
