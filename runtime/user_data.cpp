// The public descriptions of user data and user models: UserDataset's and
// ModelSpec's checks, and ModelSpec's JSON form (what checkpoints record).

#include <cmath>
#include <nlohmann/json.hpp>

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
  if (numel(shape) == 0) return Status::InvalidArgument(who + "sample_shape " + shape_string(shape) + " has a zero dimension");
  if (data.classes < 2) return Status::InvalidArgument(who + "classes must be >= 2, got " + std::to_string(data.classes));
  const std::size_t per_sample = numel(shape);
  const std::pair<const char*, const LabeledSamples*> splits[] = {
      {"train", &data.train}, {"validation", &data.validation}, {"test", &data.test}};
  for (const auto& [split, s] : splits) {
    const std::string where = who + split + ": ";
    if (s->labels.empty() && std::string(split) != "test")
      return Status::InvalidArgument(where + "no samples (train and validation need at least one)");
    if (s->values.size() != s->labels.size() * per_sample)
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
  auto model = Model::build(spec, shape, classes);
  if (!model) return model.status();
  return model->num_params();
}

using Kind = ModelSpec::Layer::Kind;

// At namespace scope, where nlohmann's calls find it by argument-dependent lookup.
NLOHMANN_JSON_SERIALIZE_ENUM(Kind, {{Kind::dense, "dense"},
                                    {Kind::conv2d, "conv2d"},
                                    {Kind::relu, "relu"},
                                    {Kind::max_pool, "max_pool"},
                                    {Kind::batch_norm, "batch_norm"},
                                    {Kind::dropout, "dropout"},
                                    {Kind::flatten, "flatten"},
                                    {Kind::global_avg_pool, "global_avg_pool"},
                                    {Kind::residual, "residual"}})

namespace {

nlohmann::json layers_to_json(const std::vector<ModelSpec::Layer>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& l : layers) {
    nlohmann::json j = {{"kind", l.kind}};
    switch (l.kind) {
      case Kind::dense: j["units"] = l.units; break;
      case Kind::conv2d:
        j.update({{"units", l.units}, {"kernel", l.kernel}, {"stride", l.stride}, {"pad", l.pad}, {"bias", l.bias}});
        break;
      case Kind::max_pool: j.update({{"kernel", l.kernel}, {"stride", l.stride}}); break;
      case Kind::dropout: j["p"] = l.p; break;
      case Kind::residual: j.update({{"main", layers_to_json(l.main)}, {"shortcut", layers_to_json(l.shortcut)}}); break;
      default: break;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<ModelSpec::Layer> layers_from_json(const nlohmann::json& list) {
  std::vector<ModelSpec::Layer> out;
  for (const auto& j : list) {
    ModelSpec::Layer l;
    if (j.at("kind").get<std::string>() != nlohmann::json(j.at("kind").get<Kind>()).get<std::string>())
      throw std::invalid_argument("unknown layer kind " + j.at("kind").dump());
    l.kind = j.at("kind").get<Kind>();
    l.units = j.value("units", l.units);
    l.kernel = j.value("kernel", l.kernel);
    l.stride = j.value("stride", l.stride);
    l.pad = j.value("pad", l.pad);
    l.bias = j.value("bias", l.bias);
    l.p = j.value("p", l.p);
    if (j.contains("main")) l.main = layers_from_json(j.at("main"));
    if (j.contains("shortcut")) l.shortcut = layers_from_json(j.at("shortcut"));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

std::string ModelSpec::to_json() const {
  return nlohmann::json{{"name", name_}, {"layers", layers_to_json(layers_)}}.dump();
}

Result<ModelSpec> ModelSpec::from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    ModelSpec spec(j.at("name").get<std::string>());
    spec.layers_ = layers_from_json(j.at("layers"));
    return spec;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("not a model spec: ") + e.what());
  }
}

}  // namespace asgd
