// One entry per layer kind. A builder checks what the layer itself only
// asserts (sizes, shapes), so that a spec that does not fit its data is an
// error naming the layer instead of a crash.

#include "compute/layer_registry.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "base/json_text.hpp"
#include "compute/layers/batch_norm2d.hpp"
#include "compute/layers/conv2d.hpp"
#include "compute/layers/dense.hpp"
#include "compute/layers/dropout.hpp"
#include "compute/layers/flatten.hpp"
#include "compute/layers/global_avg_pool.hpp"
#include "compute/layers/leaky_relu.hpp"
#include "compute/layers/max_pool2d.hpp"
#include "compute/layers/relu.hpp"
#include "compute/layers/residual.hpp"
#include "compute/layers/sigmoid.hpp"
#include "compute/layers/tanh.hpp"

namespace asgd {

namespace {

using json = nlohmann::json;
using Built = Result<std::unique_ptr<Layer>>;
using K = SpecLayer::Kind;

Status bad(const std::string& where, const SpecLayer& l, const std::string& why) {
  return Status::InvalidArgument(where + " (" + layer_kind(l.kind).name + "): " + why);
}

bool image(const Shape& in) { return in.size() == 3; }

// A size from a spec's JSON: a whole number of 0 or more, or `fallback`
// when absent. nlohmann would turn -1 into 2^64 - 1 and 2.5 into 2.
std::size_t read_size(const json& j, const char* key, std::size_t fallback) {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_number_unsigned())
    throw std::invalid_argument(std::string("\"") + key + "\" must be a whole number of 0 or more, not " +
                                (it->is_number() ? it->dump() : std::string("a ") + it->type_name()));
  return it->get<std::size_t>();
}

Status needs_image(const std::string& where, const SpecLayer& l, const Shape& in) {
  return bad(where, l, "needs (C, H, W) input, got " + shape_string(in) + " (after a flatten or dense?)");
}

template <class L, class... Args>
Built make(Args&&... args) {
  return std::unique_ptr<Layer>(std::make_unique<L>(std::forward<Args>(args)...));
}

// A kind configured by its input alone (relu, flatten).
template <class L>
Built plain(const SpecLayer&, const Shape&, const std::string&) {
  return make<L>();
}

void no_fields(const SpecLayer&, json&) {}
void no_fields_read(const json&, SpecLayer&) {}

Built build_residual(const SpecLayer& l, const Shape& in, const std::string& where) {
  if (l.main.empty()) return bad(where, l, "the main path is empty");
  Shape main_shape = in, short_shape = in;
  auto main = build_layers(l.main, main_shape, where + " main path ");
  if (!main) return main.status();
  auto shortcut = build_layers(l.shortcut, short_shape, where + " shortcut ");
  if (!shortcut) return shortcut.status();
  if (main_shape != short_shape)
    return bad(where, l, "the main path gives " + shape_string(main_shape) + ", the shortcut " +
                             shape_string(short_shape));
  return make<Residual>(std::move(main).value(), std::move(shortcut).value());
}

// In Kind order: layer_kind() indexes this by the enum's value.
const std::array kKinds = {
    LayerKind{K::dense, "dense",
              [](const SpecLayer& l, const Shape& in, const std::string& where) -> Built {
                if (l.units == 0) return bad(where, l, "needs at least 1 output");
                return make<Dense>(numel(in), l.units);
              },
              [](const SpecLayer& l, json& j) { j["units"] = l.units; },
              [](const json& j, SpecLayer& l) { l.units = read_size(j, "units", l.units); }},
    LayerKind{K::conv2d, "conv2d",
              [](const SpecLayer& l, const Shape& in, const std::string& where) -> Built {
                if (!image(in)) return needs_image(where, l, in);
                if (l.units == 0 || l.kernel == 0 || l.stride == 0)
                  return bad(where, l, "out_channels, kernel and stride must be >= 1");
                if (std::min(in[1], in[2]) + 2 * l.pad < l.kernel)
                  return bad(where, l,
                             "kernel " + std::to_string(l.kernel) + " is larger than its padded input " +
                                 shape_string(in));
                return make<Conv2D>(in[0], l.units, l.kernel, l.stride, l.pad, l.bias);
              },
              [](const SpecLayer& l, json& j) {
                j.update({{"units", l.units}, {"kernel", l.kernel}, {"stride", l.stride}, {"pad", l.pad},
                          {"bias", l.bias}});
              },
              [](const json& j, SpecLayer& l) {
                l.units = read_size(j, "units", l.units);
                l.kernel = read_size(j, "kernel", l.kernel);
                l.stride = read_size(j, "stride", l.stride);
                l.pad = read_size(j, "pad", l.pad);
                l.bias = j.value("bias", l.bias);
              }},
    LayerKind{K::relu, "relu", plain<ReLU>, no_fields, no_fields_read},
    LayerKind{K::max_pool, "max_pool",
              [](const SpecLayer& l, const Shape& in, const std::string& where) -> Built {
                if (!image(in)) return needs_image(where, l, in);
                if (l.kernel == 0) return bad(where, l, "kernel must be >= 1");
                if (std::min(in[1], in[2]) < l.kernel)
                  return bad(where, l,
                             "window " + std::to_string(l.kernel) + " is larger than its input " + shape_string(in));
                return make<MaxPool2D>(l.kernel, l.stride);
              },
              [](const SpecLayer& l, json& j) { j.update({{"kernel", l.kernel}, {"stride", l.stride}}); },
              [](const json& j, SpecLayer& l) {
                l.kernel = read_size(j, "kernel", l.kernel);
                // Absent: the kernel, as max_pool(k) and torch's MaxPool2d(k)
                // have it (it read the conv2d default of 1).
                l.stride = read_size(j, "stride", 0);
              }},
    LayerKind{K::batch_norm, "batch_norm",
              [](const SpecLayer& l, const Shape& in, const std::string& where) -> Built {
                if (!image(in)) return needs_image(where, l, in);
                return make<BatchNorm2D>(in[0]);
              },
              no_fields, no_fields_read},
    LayerKind{K::dropout, "dropout",
              [](const SpecLayer& l, const Shape&, const std::string& where) -> Built {
                if (!(l.p >= 0.0 && l.p < 1.0)) return bad(where, l, "p must be in [0, 1), got " + std::to_string(l.p));
                return make<Dropout>(static_cast<float>(l.p));
              },
              [](const SpecLayer& l, json& j) { j["p"] = l.p; },
              [](const json& j, SpecLayer& l) { l.p = j.value("p", l.p); }},
    LayerKind{K::flatten, "flatten", plain<Flatten>, no_fields, no_fields_read},
    LayerKind{K::global_avg_pool, "global_avg_pool",
              [](const SpecLayer& l, const Shape& in, const std::string& where) -> Built {
                if (!image(in)) return needs_image(where, l, in);
                return make<GlobalAvgPool>();
              },
              no_fields, no_fields_read},
    LayerKind{K::residual, "residual", build_residual,
              [](const SpecLayer& l, json& j) {
                j.update({{"main", layers_to_json(l.main)}, {"shortcut", layers_to_json(l.shortcut)}});
              },
              [](const json& j, SpecLayer& l) {
                if (j.contains("main")) l.main = layers_from_json(j.at("main"));
                if (j.contains("shortcut")) l.shortcut = layers_from_json(j.at("shortcut"));
              }},
    LayerKind{K::tanh, "tanh", plain<Tanh>, no_fields, no_fields_read},
    LayerKind{K::sigmoid, "sigmoid", plain<Sigmoid>, no_fields, no_fields_read},
    LayerKind{K::leaky_relu, "leaky_relu",
              [](const SpecLayer& l, const Shape&, const std::string& where) -> Built {
                if (!std::isfinite(l.negative_slope))
                  return bad(where, l, "negative_slope must be finite, got " + std::to_string(l.negative_slope));
                return make<LeakyReLU>(static_cast<float>(l.negative_slope));
              },
              [](const SpecLayer& l, json& j) { j["negative_slope"] = l.negative_slope; },
              [](const json& j, SpecLayer& l) { l.negative_slope = j.value("negative_slope", l.negative_slope); }},
};

}  // namespace

std::span<const LayerKind> layer_kinds() { return kKinds; }

const LayerKind& layer_kind(SpecLayer::Kind kind) {
  const auto at = static_cast<std::size_t>(kind);
  if (at >= kKinds.size() || kKinds[at].kind != kind) throw std::logic_error("layer_registry.cpp: Kind out of order");
  return kKinds[at];
}

const LayerKind* find_layer_kind(std::string_view name) {
  for (const LayerKind& k : kKinds)
    if (name == k.name) return &k;
  return nullptr;
}

Result<Layers> build_layers(const std::vector<SpecLayer>& specs, Shape& shape, const std::string& prefix) {
  Layers out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string where = prefix + "layer " + std::to_string(i);
    auto layer = layer_kind(specs[i].kind).build(specs[i], shape, where);
    if (!layer) return layer.status();
    shape = (*layer)->output_shape(shape);
    const auto values = numel_within(shape, kMaxValuesPerSample);
    if (!values)
      return bad(where, specs[i], "gives an output of too many values a sample " + shape_string(shape) + " (at most " +
                                      std::to_string(kMaxValuesPerSample) + ")");
    if (*values == 0) return bad(where, specs[i], "gives an empty output " + shape_string(shape));
    out.push_back(std::move(layer).value());
  }
  return out;
}

json layers_to_json(const std::vector<SpecLayer>& layers) {
  json out = json::array();
  for (const SpecLayer& l : layers) {
    const LayerKind& kind = layer_kind(l.kind);
    json j = {{"kind", kind.name}};
    kind.write(l, j);
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<SpecLayer> layers_from_json(const json& list) {
  if (!list.is_array()) throw std::invalid_argument(std::string("\"layers\" must be a list, not a ") + list.type_name());
  std::vector<SpecLayer> out;
  for (const json& j : list) {
    const LayerKind* kind = find_layer_kind(j.at("kind").get<std::string>());
    if (!kind) throw std::invalid_argument("unknown layer kind " + j.at("kind").dump());
    SpecLayer l;
    l.kind = kind->kind;
    kind->read(j, l);
    out.push_back(std::move(l));
  }
  return out;
}

std::string ModelSpec::to_json() const { return json_text(json{{"name", name_}, {"layers", layers_to_json(layers_)}}); }

Result<ModelSpec> ModelSpec::from_json(const std::string& text) {
  try {
    const auto j = json::parse(text);
    ModelSpec spec(j.at("name").get<std::string>());
    spec.layers_ = layers_from_json(j.at("layers"));
    return spec;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("not a model spec: ") + e.what());
  }
}

}  // namespace asgd
