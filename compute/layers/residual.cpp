#include "compute/layers/residual.hpp"

#include <cassert>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compute/cpu_kernels.hpp"
#include "base/random.hpp"
#include "compute/thread_pool.hpp"

namespace asgd {

using cpu::vectorised;

namespace {

std::size_t params_of(const Layer& layer) {
  std::size_t n = 0;
  for (const ParamSpec& spec : layer.param_specs()) n += numel(spec.shape);
  return n;
}

ConstTensorView view(const Tensor& t) { return {t.data(), t.shape()}; }

std::size_t per_sample(const Shape& shape) { return shape.empty() || shape[0] == 0 ? 0 : numel(shape) / shape[0]; }

ASGD_VECTOR_LOOP void add_arrays(const float* __restrict a, const float* __restrict b, float* __restrict out,
                                   std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

ASGD_VECTOR_LOOP void accumulate(float* __restrict acc, const float* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += b[i];
}

// out = a + b, or out += b when a is null; all (batch, per_sample). The
// sums cut the batch into chunks like the layers around them, so that each
// thread mostly adds samples in its own core's cache.
void add_batch(ThreadPool* pool, std::size_t batch, std::size_t per_sample, const float* a, const float* b,
               float* out) {
  const Chunks chunks = sample_chunks(batch, threads_of(pool));
  auto work = [&](std::size_t chunk, std::size_t /*thread*/) {
    const auto [b0, b1] = chunks.range(chunk, batch);
    const std::size_t at = b0 * per_sample, n = (b1 - b0) * per_sample;
    if (a) {
      vectorised<add_arrays>(a + at, b + at, out + at, n);
    } else {
      vectorised<accumulate>(out + at, b + at, n);
    }
  };
  run_chunks(pool, chunks.count, work);
}

}  // namespace

Residual::Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut)
    : main_(std::move(main)),
      shortcut_(std::move(shortcut)),
      main_acts_(main_.size()),
      shortcut_acts_(shortcut_.size()) {}

Residual::~Residual() = default;

Shape Residual::output_shape(const Shape& input) const {
  Shape main_shape = input;
  for (const auto& layer : main_) main_shape = layer->output_shape(main_shape);
  [[maybe_unused]] Shape short_shape = input;
  for (const auto& layer : shortcut_) short_shape = layer->output_shape(short_shape);
  assert(main_shape == short_shape);
  return main_shape;
}

std::size_t Residual::activation_floats(const Shape& input) const {
  std::size_t floats = 0;
  for (const auto* path : {&main_, &shortcut_}) {
    Shape shape = input;
    for (const auto& layer : *path) {
      floats += layer->activation_floats(shape);
      shape = layer->output_shape(shape);
    }
  }
  return floats + numel(output_shape(input));
}

std::vector<ParamSpec> Residual::param_specs() const {
  std::vector<ParamSpec> specs;
  auto add = [&](const std::vector<std::unique_ptr<Layer>>& path, const std::string& prefix) {
    for (std::size_t i = 0; i < path.size(); ++i)
      for (ParamSpec spec : path[i]->param_specs()) {
        spec.name = prefix + std::to_string(i) + "." + spec.name;
        specs.push_back(std::move(spec));
      }
  };
  add(main_, "main.");
  add(shortcut_, "shortcut.");
  return specs;
}

void Residual::bind(std::span<float> params, std::span<float> grads) {
  assert(grads.size() == params.size());
  std::size_t offset = 0;
  for (auto* path : {&main_, &shortcut_})
    for (const auto& layer : *path) {
      const std::size_t n = params_of(*layer);
      layer->bind(params.subspan(offset, n), grads.subspan(offset, n));
      offset += n;
    }
  assert(offset == params.size());
}

void Residual::set_training(bool training) {
  // Called every step: walk the paths rather than build children().
  for (auto* path : {&main_, &shortcut_})
    for (const auto& layer : *path) layer->set_training(training);
}

std::vector<LayerBuffer> Residual::buffers() {
  std::vector<LayerBuffer> all;
  auto add = [&](const std::vector<std::unique_ptr<Layer>>& path, const std::string& prefix) {
    for (std::size_t i = 0; i < path.size(); ++i)
      for (LayerBuffer buffer : path[i]->buffers()) {
        buffer.name = prefix + std::to_string(i) + "." + buffer.name;
        all.push_back(std::move(buffer));
      }
  };
  add(main_, "main.");
  add(shortcut_, "shortcut.");
  return all;
}

std::vector<Layer*> Residual::children() {
  std::vector<Layer*> all;
  for (const auto& layer : main_) all.push_back(layer.get());
  for (const auto& layer : shortcut_) all.push_back(layer.get());
  return all;
}

void Residual::set_pool(ThreadPool* pool) {
  pool_ = pool;
  for (Layer* layer : children()) layer->set_pool(pool);
}

void Residual::reseed(std::uint64_t seed) {
  // A stream per sub-layer, so that two dropouts in one block differ.
  const std::vector<Layer*> all = children();
  for (std::size_t i = 0; i < all.size(); ++i) all[i]->reseed(mix_seed(seed, i));
}

void Residual::forward(ConstTensorView x, Tensor& y) {
  auto run = [&](std::vector<std::unique_ptr<Layer>>& path, std::vector<Tensor>& acts) -> ConstTensorView {
    ConstTensorView in = x;
    for (std::size_t i = 0; i < path.size(); ++i) {
      path[i]->forward(in, acts[i]);
      in = view(acts[i]);
    }
    return in;
  };
  const ConstTensorView main_out = run(main_, main_acts_);
  const ConstTensorView short_out = run(shortcut_, shortcut_acts_);
  assert(main_out.shape == short_out.shape);
  y.resize(main_out.shape);
  add_batch(pool_, y.dim(0), per_sample(y.shape()), main_out.data, short_out.data, y.data());
}

void Residual::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  // Backpropagates dy through one path, ping-ponging between grad_a_ and
  // grad_b_; the path's input gradient lands in `out` (skipped when null).
  auto run = [&](std::vector<std::unique_ptr<Layer>>& path, std::vector<Tensor>& acts, Tensor* out) {
    if (path.empty()) {
      if (out) *out = dy;
      return;
    }
    const Tensor* g = &dy;
    for (std::size_t i = path.size(); i-- > 0;) {
      const ConstTensorView in = i == 0 ? x : view(acts[i - 1]);
      Tensor* target = i == 0 ? out : (g == &grad_a_ ? &grad_b_ : &grad_a_);
      path[i]->backward(in, acts[i], *g, target);
      g = target;
    }
  };
  run(main_, main_acts_, dx);
  if (!dx) {
    run(shortcut_, shortcut_acts_, nullptr);
    return;
  }
  const Tensor* other = &dy;  // an identity shortcut passes dy through
  if (!shortcut_.empty()) {
    run(shortcut_, shortcut_acts_, &grad_short_);
    other = &grad_short_;
  }
  assert(other->size() == dx->size());
  add_batch(pool_, dx->dim(0), per_sample(dx->shape()), nullptr, other->data(), dx->data());
}

}  // namespace asgd
