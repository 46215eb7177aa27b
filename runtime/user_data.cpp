// The public descriptions of user data and user models: UserDataset's and
// ModelSpec's checks (ModelSpec's JSON form is in compute/layer_registry.cpp).

#include <cmath>

#include "asgd/dataset.hpp"
#include "asgd/model_spec.hpp"
#include "compute/model.hpp"

namespace asgd {

Status validate(const UserDataset& data) {
  const std::string who = "user data '" + data.name + "': ";
  const auto& shape = data.sample_shape;
  if (shape.size() != 1 && shape.size() != 3)
    return Status::InvalidArgument(who + "sample_shape " + shape_string(shape) +
                                   " must be (C, H, W) for images or (N) for vectors");
  const std::optional<std::size_t> values = data::sample_values(shape);
  if (!values)
    return Status::InvalidArgument(who + "sample_shape " + shape_string(shape) + " has more than " +
                                   std::to_string(data::kMaxSampleValues) + " values per sample");
  const std::size_t per_sample = *values;
  if (per_sample == 0) return Status::InvalidArgument(who + "sample_shape " + shape_string(shape) + " has a zero dimension");
  if (data.classes < 2) return Status::InvalidArgument(who + "classes must be >= 2, got " + std::to_string(data.classes));
  const std::pair<const char*, const LabeledSamples*> splits[] = {
      {"train", &data.train}, {"validation", &data.validation}, {"test", &data.test}};
  for (const auto& [split, s] : splits) {
    const std::string where = who + split + ": ";
    if (s->labels.empty() && std::string(split) != "test")
      return Status::InvalidArgument(where + "no samples (train and validation need at least one)");
    std::size_t expected = 0;
    if (__builtin_mul_overflow(s->labels.size(), per_sample, &expected) || s->values.size() != expected)
      return Status::InvalidArgument(where + std::to_string(s->values.size()) + " values for " +
                                     std::to_string(s->labels.size()) + " labels of samples " + shape_string(shape) +
                                     " (expected " + std::to_string(s->labels.size() * per_sample) + ")");
    for (std::size_t i = 0; i < s->labels.size(); ++i) {
      const std::int32_t label = s->labels[i];
      if (label < 0 || static_cast<std::size_t>(label) >= data.classes)
        return Status::InvalidArgument(where + "label " + std::to_string(label) + " of sample " + std::to_string(i) +
                                       " is not in [0, " + std::to_string(data.classes) + ")");
    }
    for (std::size_t j = 0; j < s->values.size(); ++j)
      if (!std::isfinite(s->values[j]))
        return Status::InvalidArgument(where + "value " + std::to_string(j % per_sample) + " of sample " +
                                       std::to_string(j / per_sample) + " is not finite");
  }
  return {};
}

Result<std::size_t> validate(const ModelSpec& spec, const std::vector<std::size_t>& sample_shape,
                             std::size_t classes) {
  // Vectors (N) reach models as (1, 1, N), as user data does.
  const Shape shape = sample_shape.size() == 1 ? Shape{1, 1, sample_shape[0]} : sample_shape;
  auto params = Model::count_params(spec, shape, classes);
  if (params && *params == 0)  // (it said "--shards 1 exceeds the model's 0 parameters")
    return Status::InvalidArgument("model spec '" + spec.name() + "' has no parameters to train (no dense, conv2d "
                                   "or batch_norm layer)");
  return params;
}

}  // namespace asgd
