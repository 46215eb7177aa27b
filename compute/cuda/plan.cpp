// PlanBuilder: the CPU layers read into the CUDA backend's node tree, each
// by its kind's GpuOps::lower, with the checks common to every kind (shapes
// that chain, the parameter layout the kernels assume).

#include <algorithm>
#include <climits>

#include "compute/cuda/nodes.hpp"
#include "compute/layers/batch_norm2d.hpp"

namespace asgd::cuda {

namespace {

std::size_t spec_count(const std::vector<ParamSpec>& specs) {
  std::size_t n = 0;
  for (const ParamSpec& s : specs) n += numel(s.shape);
  return n;
}

bool same_shapes(const std::vector<ParamSpec>& specs, const std::vector<Shape>& expected) {
  if (specs.size() != expected.size()) return false;
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i].shape != expected[i]) return false;
  return true;
}

}  // namespace

std::string Dims::str() const {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, wrongly) on "(" + ...
  std::string s = "(";
  s += std::to_string(c);
  if (image) {
    s += ", ";
    s += std::to_string(h);
    s += ", ";
    s += std::to_string(w);
  }
  s += ")";
  return s;
}

Status PlanBuilder::add_sequence(const std::vector<Layer*>& layers, Dims& shape, std::vector<Node>& out,
                                 bool first_needs_dx, const std::string& prefix) {
  out.reserve(layers.size());
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Node& node = out.emplace_back();
    node.needs_dx = i > 0 || first_needs_dx;
    node.last = i + 1 == layers.size();
    if (Status s = add_layer(*layers[i], shape, node, prefix + std::to_string(i)); !s.ok()) return s;
  }
  return {};
}

std::size_t PlanBuilder::add_stats(BatchNorm2D& bn, std::size_t channels) {
  const std::size_t at = plan_.stats;
  plan_.stats += 2 * channels;
  plan_.batchnorms.push_back(&bn);
  return at;
}

Status PlanBuilder::add_layer(Layer& layer, Dims& shape, Node& node, const std::string& path) {
  node.path = path;
  node.name = "layer " + path + " (" + layer.kind() + ")";
  node.index = next_index_++;
  node.params = plan_.params;
  node.in = shape;
  const auto fail = [&](const std::string& why) { return Status::InvalidArgument(node.name + ": " + why); };
  node.ops = find_gpu_ops(layer.kind());
  if (!node.ops) return fail("the CUDA backend has no implementation of this layer kind");
  std::vector<Shape> expected_params;
  if (Status s = node.ops->lower(layer, node, *this, expected_params); !s.ok()) return s;
  if (node.main.empty() && node.shortcut.empty()) {
    // The kernels assume each layer's documented layout (torch.nn's).
    if (!same_shapes(layer.param_specs(), expected_params)) return fail("unexpected parameter layout");
    plan_.params += spec_count(layer.param_specs());
  } else if (plan_.params - node.params != spec_count(layer.param_specs())) {
    // The paths' layers took their parameters in order, main's then shortcut's.
    return fail("parameters do not add up to main's then shortcut's");
  }
  plan_.max_numel = std::max({plan_.max_numel, node.in.numel(), node.out.numel()});
  if (plan_.max_numel > static_cast<std::size_t>(INT_MAX)) return fail("tensor too large for cuDNN");
  shape = node.out;
  return {};
}

Result<Plan> build_plan(const std::vector<Layer*>& layers, const Shape& sample_shape, std::size_t param_count) {
  Plan plan;
  if (sample_shape.size() == 3)
    plan.sample = {sample_shape[0], sample_shape[1], sample_shape[2], true};
  else if (sample_shape.size() == 1)
    plan.sample = {sample_shape[0], 1, 1, false};
  else
    return Status::InvalidArgument("CUDA backend: sample shape " + shape_string(sample_shape) +
                                   " is neither (C, H, W) nor (N)");
  Dims shape = plan.sample;
  plan.max_numel = shape.numel();
  PlanBuilder builder(plan);
  if (Status s = builder.add_sequence(layers, shape, plan.nodes, false, ""); !s.ok()) return s;
  if (shape.image)
    return Status::InvalidArgument("CUDA backend: the model must end in class scores (N), not " + shape.str());
  if (shape.numel() == 0) return Status::InvalidArgument("CUDA backend: the model has no outputs");
  if (plan.params != param_count)
    return Status::InvalidArgument("CUDA backend: the layers hold " + std::to_string(plan.params) +
                                   " parameters, the model says " + std::to_string(param_count));
  plan.classes = shape.numel();
  return plan;
}

}  // namespace asgd::cuda
