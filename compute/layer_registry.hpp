#pragma once
// Every layer kind a ModelSpec can name, each described by one entry: its
// name (the JSON "kind" and the name in messages), how a spec layer builds
// it, and its JSON fields. The CUDA backend keeps its lowering of each kind
// by the same name (compute/cuda/lowerings.cpp), so a build without CUDA
// needs nothing of it. docs/architecture.md, "Adding a layer", lists the
// steps.

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "asgd/model_spec.hpp"
#include "asgd/status.hpp"
#include "compute/layer.hpp"

namespace asgd {

using SpecLayer = ModelSpec::Layer;
using Layers = std::vector<std::unique_ptr<Layer>>;

struct LayerKind {
  SpecLayer::Kind kind;
  const char* name;  ///< "dense", "max_pool": what JSON and error messages say
  /// The layer `spec` describes for per-sample input `in` (C, H, W) or (N),
  /// or invalid_argument saying why not, prefixed with `where` ("layer 3")
  /// and the kind's name.
  Result<std::unique_ptr<Layer>> (*build)(const SpecLayer& spec, const Shape& in, const std::string& where);
  /// Writes the fields this kind uses beyond "kind" into `out`.
  void (*write)(const SpecLayer& spec, nlohmann::json& out);
  /// Reads them back (absent fields keep their defaults). Throws
  /// nlohmann::json's exceptions on fields of the wrong type.
  void (*read)(const nlohmann::json& in, SpecLayer& spec);
};

/// Every kind, in ModelSpec::Layer::Kind order.
std::span<const LayerKind> layer_kinds();

/// The entry of `kind`; every Kind has one.
const LayerKind& layer_kind(SpecLayer::Kind kind);

/// The entry named `name`, or null.
const LayerKind* find_layer_kind(std::string_view name);

/// Builds `specs` in order from per-sample shape `shape`, which ends as the
/// last layer's output shape. Layers are named "<prefix>layer I" in errors.
Result<Layers> build_layers(const std::vector<SpecLayer>& specs, Shape& shape, const std::string& prefix);

/// A list of spec layers as JSON ([{"kind": "dense", "units": 10}, ...]) and
/// back; layers_from_json throws std::invalid_argument for an unknown kind.
nlohmann::json layers_to_json(const std::vector<SpecLayer>& layers);
std::vector<SpecLayer> layers_from_json(const nlohmann::json& list);

}  // namespace asgd
