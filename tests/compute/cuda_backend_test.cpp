// The CUDA backend against the CPU layers. Every layer kind runs in a tiny
// model with a dense head, then the LeNet and ResNet-mini shapes whole: the
// loss, every gradient, BatchNorm's running statistics and inference logits
// must agree. Without a usable GPU these tests skip and say why; the tests of
// what happens exactly then (and of models the backend refuses) still run.
//
// Tolerance: both sides compute in fp32 (the backend keeps TF32 off in cuDNN
// and cuBLAS; with TF32 the differences would be ~1e-3 relative) but sum in
// different orders, so a tensor passes when every element is within
// tol * (largest |cpu element| of that tensor) + 1e-7 of the CPU value, and
// a gradient also within 0.01 * tol * (largest |cpu gradient| of the step):
// tol = 1e-4 for single layers. Whole models are judged per tensor by the
// norm of the difference (within tol of the CPU tensor's norm) and by its
// median element (within tol / 10 of its scale), with a larger tol, since
// differences grow through BatchNorm's division by the batch deviation and
// one near-tie moves a whole upstream gradient. No comparison lets a NaN or
// an infinity through (close.hpp), and every output the GPU writes is
// pre-filled with NaN, so an element it never wrote fails.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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
#include "compute/loss.hpp"
#include "compute/device.hpp"
#include "base/random.hpp"
#include "tests/compute/close.hpp"

namespace asgd {
namespace {

// Skips without a usable GPU, saying why; with ASGD_REQUIRE_GPU=1 (the GPU
// check script sets it) that is a failure instead, so a machine whose
// driver or libcuda cannot start CUDA never reports a green run.
#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    std::string why_no_gpu;                                                                        \
    if (cuda_device_count(&why_no_gpu) == 0) {                                                     \
      if (gpu_required()) FAIL() << "ASGD_REQUIRE_GPU=1, but CUDA could not start: " << why_no_gpu; \
      GTEST_SKIP() << why_no_gpu;                                                                  \
    }                                                                                              \
  } while (0)

bool gpu_required() {
  const char* v = std::getenv("ASGD_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

using Layers = std::vector<std::unique_ptr<Layer>>;
// Each check builds its model twice: once for the CPU reference and once for
// the layers the GPU model mirrors, so that BatchNorm running statistics
// advance exactly once on each side.
using MakeLayers = std::function<Layers()>;

template <class... L>
Layers seq(std::unique_ptr<L>... layers) {
  Layers out;
  (out.push_back(std::move(layers)), ...);
  return out;
}

std::size_t param_count(const Layer& layer) {
  std::size_t n = 0;
  for (const ParamSpec& spec : layer.param_specs()) n += numel(spec.shape);
  return n;
}

// A sequential CPU model made from layers directly, laid out as Model::add
// and Model::bind_layers do (one flat parameter and gradient vector, each
// layer's slice in order), so that these tests do not depend on which models
// Model::build knows.
class CpuNet {
 public:
  CpuNet(Layers layers, Shape sample) : layers_(std::move(layers)), sample_(std::move(sample)) {
    std::size_t total = 0;
    for (const auto& layer : layers_) total += param_count(*layer);
    params_.resize(total);
    grads_.assign(total, 0.0f);
    std::size_t offset = 0;
    for (const auto& layer : layers_) {
      const std::size_t n = param_count(*layer);
      layer->bind(std::span(params_).subspan(offset, n), std::span(grads_).subspan(offset, n));
      offset += n;
    }
    Shape shape = sample_;
    for (const auto& layer : layers_) shape = layer->output_shape(shape);
    classes_ = numel(shape);
    acts_.resize(layers_.size());
  }

  std::vector<Layer*> layer_ptrs() const {
    std::vector<Layer*> out;
    for (const auto& layer : layers_) out.push_back(layer.get());
    return out;
  }
  std::span<float> params() { return params_; }
  std::span<const float> grads() const { return grads_; }
  std::size_t classes() const { return classes_; }
  std::size_t sample_size() const { return numel(sample_); }
  const Shape& sample() const { return sample_; }

  /// Random parameters (He-uniform weights, BatchNorm scales near 1, small
  /// nonzero biases so that bias paths matter), the same for the same seed.
  void init(std::uint64_t seed) {
    Rng rng(seed);
    std::size_t offset = 0;
    for (const auto& layer : layers_)
      for (const ParamSpec& spec : layer->param_specs()) {
        const float bound = std::sqrt(6.0f / static_cast<float>(std::max<std::size_t>(spec.fan_in, 1)));
        for (std::size_t i = 0; i < numel(spec.shape); ++i) {
          float& p = params_[offset++];
          switch (spec.init) {
            case Init::he_uniform:
              p = rng.uniform(-bound, bound);
              break;
            case Init::ones:
              p = rng.uniform(0.5f, 1.5f);
              break;
            case Init::zeros:
              p = rng.uniform(-0.2f, 0.2f);
              break;
          }
        }
      }
  }

  /// Training-mode forward and backward, as Model::compute_gradients.
  float train_step(std::span<const float> x, std::span<const std::int32_t> y) {
    const float loss = forward(x, y.size(), &y);
    Tensor dy, dx;
    loss_.backward(y, dy);
    for (std::size_t i = layers_.size(); i-- > 0;) {
      layers_[i]->backward(input_of(i, x, y.size()), acts_[i], dy, i == 0 ? nullptr : &dx);
      std::swap(dy, dx);
    }
    return loss;
  }

  /// Inference-mode logits (batch, classes).
  std::vector<float> infer(std::span<const float> x, std::size_t batch) {
    for (const auto& layer : layers_) layer->set_training(false);
    forward(x, batch, nullptr);
    for (const auto& layer : layers_) layer->set_training(true);
    const Tensor& out = acts_.back();
    return {out.data(), out.data() + out.size()};
  }

  /// Every parameter tensor as (name, offset, size) in the flat vector.
  struct Entry {
    std::string name;
    std::size_t offset, size;
  };
  std::vector<Entry> entries() const {
    std::vector<Entry> out;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i)
      for (const ParamSpec& spec : layers_[i]->param_specs()) {
        out.push_back({std::to_string(i) + "." + spec.name, offset, numel(spec.shape)});
        offset += numel(spec.shape);
      }
    return out;
  }

  /// Every non-trained buffer (BatchNorm running statistics), by name.
  std::vector<LayerBuffer> buffers() {
    std::vector<LayerBuffer> out;
    for (std::size_t i = 0; i < layers_.size(); ++i)
      for (LayerBuffer& b : layers_[i]->buffers()) out.push_back({std::to_string(i) + "." + b.name, b.values});
    return out;
  }

 private:
  ConstTensorView input_of(std::size_t i, std::span<const float> x, std::size_t batch) const {
    if (i > 0) return {acts_[i - 1].data(), acts_[i - 1].shape()};
    Shape shape = {batch};
    shape.insert(shape.end(), sample_.begin(), sample_.end());
    return {x.data(), shape};
  }

  float forward(std::span<const float> x, std::size_t batch, const std::span<const std::int32_t>* y) {
    for (std::size_t i = 0; i < layers_.size(); ++i) layers_[i]->forward(input_of(i, x, batch), acts_[i]);
    const Tensor& out = acts_.back();
    return y ? loss_.forward({out.data(), out.shape()}, *y) : 0.0f;
  }

  Layers layers_;
  Shape sample_;
  std::size_t classes_ = 0;
  std::vector<float> params_, grads_;
  std::vector<Tensor> acts_;
  SoftmaxCrossEntropy loss_;
};

std::vector<float> random_inputs(Rng& rng, std::size_t n) {
  std::vector<float> x(n);
  for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
  return x;
}

std::vector<std::int32_t> random_labels(Rng& rng, std::size_t batch, std::size_t classes) {
  std::vector<std::int32_t> y(batch);
  for (auto& label : y) label = static_cast<std::int32_t>(rng.below(classes));
  return y;
}

// Every element within tol * (the CPU tensor's largest magnitude) + floor,
// and no NaN or infinity anywhere (close.hpp).
void expect_close(std::span<const float> gpu, std::span<const float> cpu, double tol, const std::string& what,
                  double floor = 1e-7) {
  EXPECT_TRUE(all_close(gpu, cpu, tol, floor)) << what;
}

// How a comparison judges a tensor: element by element for single layers;
// for whole models by its norm and its median element (a near-tie in one
// max-pool window or ReLU sends one upstream gradient elsewhere, which says
// nothing about the backend).
struct Judge {
  double tol = 1e-4;
  bool whole_model = false;
  void expect(std::span<const float> gpu, std::span<const float> cpu, const std::string& what, double floor) const {
    if (whole_model) {
      EXPECT_TRUE(close_in_norm(gpu, cpu, tol, tol / 10, floor)) << what;
    } else {
      EXPECT_TRUE(all_close(gpu, cpu, tol, floor)) << what;
    }
  }
};

// Trains one step per batch size on both sides (the same size twice reuses
// the GPU buffers, a larger one grows them, a smaller one reuses them), then
// compares inference on a batch size not seen before.
// The loss, the logits and BatchNorm's statistics are judged at forward_tol
// where it is given (a model whose gradients are looser than its forward pass).
void expect_gpu_matches_cpu(const MakeLayers& make, const Shape& sample, double tol,
                            const std::vector<std::size_t>& batches = {4, 4, 7, 2}, std::size_t infer_batch = 5,
                            bool whole_model = false, double forward_tol = 0.0) {
  const Judge judge{tol, whole_model};
  const Judge forward_judge{forward_tol > 0.0 ? forward_tol : tol, whole_model};
  CpuNet cpu(make(), sample);
  CpuNet host(make(), sample);  // the GPU model reads these layers and writes its running statistics back
  cpu.init(7);
  std::copy(cpu.params().begin(), cpu.params().end(), host.params().begin());
  auto made = make_cuda_model(host.layer_ptrs(), sample, host.params().size(), 0);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  DeviceModel& gpu = **made;

  Rng rng(11);
  std::vector<float> grads(cpu.params().size());
  for (std::size_t step = 0; step < batches.size(); ++step) {
    const std::size_t batch = batches[step];
    SCOPED_TRACE("step " + std::to_string(step) + ", batch " + std::to_string(batch));
    const auto x = random_inputs(rng, batch * cpu.sample_size());
    const auto y = random_labels(rng, batch, cpu.classes());
    std::fill(grads.begin(), grads.end(), std::numeric_limits<float>::quiet_NaN());  // unwritten shows
    const float gpu_loss = gpu.compute_gradients(cpu.params(), grads, x, y);
    const float cpu_loss = cpu.train_step(x, y);
    EXPECT_NEAR(gpu_loss, cpu_loss, forward_judge.tol * std::max(1.0f, std::abs(cpu_loss)));
    // A gradient that is zero but for rounding (a convolution's bias before
    // a BatchNorm, which removes it) sums terms of the model's gradient
    // scale that cancel: each side keeps a few float epsilons (1.2e-7) of
    // that scale, so its tensor scale says nothing (seen on an H100:
    // 3e-8 against -1.8e-7).
    double step_scale = 0.0;
    for (const float g : cpu.grads()) step_scale = std::max(step_scale, std::abs(static_cast<double>(g)));
    const double floor = 1e-7 + 0.01 * tol * step_scale;
    for (const auto& e : cpu.entries())
      judge.expect(std::span(grads).subspan(e.offset, e.size), cpu.grads().subspan(e.offset, e.size),
                   "gradient " + e.name, floor);
    const auto gpu_buffers = host.buffers();
    const auto cpu_buffers = cpu.buffers();
    ASSERT_EQ(gpu_buffers.size(), cpu_buffers.size());
    for (std::size_t i = 0; i < cpu_buffers.size(); ++i)
      forward_judge.expect(gpu_buffers[i].values, cpu_buffers[i].values, cpu_buffers[i].name, 1e-7);
  }

  SCOPED_TRACE("inference, batch " + std::to_string(infer_batch));
  const auto x = random_inputs(rng, infer_batch * cpu.sample_size());
  std::vector<float> logits(infer_batch * cpu.classes(), std::numeric_limits<float>::quiet_NaN());  // unwritten shows
  gpu.infer(cpu.params(), x, infer_batch, logits);
  forward_judge.expect(logits, cpu.infer(x, infer_batch), "logits", 1e-7);
}

// ---- One layer kind at a time, each followed by a dense head -------------------

constexpr double kLayerTol = 1e-4;

TEST(CudaBackend, DenseMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu([] { return seq(std::make_unique<Dense>(6, 5), std::make_unique<Dense>(5, 3)); }, {6},
                         kLayerTol);
}

TEST(CudaBackend, DenseOnImagesSeesThemFlattened) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu([] { return seq(std::make_unique<Dense>(18, 3)); }, {2, 3, 3}, kLayerTol);
}

TEST(CudaBackend, ReluMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu([] { return seq(std::make_unique<ReLU>(), std::make_unique<Dense>(6, 3)); }, {6}, kLayerTol);
}

TEST(CudaBackend, ReluOnImagesMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] { return seq(std::make_unique<ReLU>(), std::make_unique<Flatten>(), std::make_unique<Dense>(32, 3)); },
      {2, 4, 4}, kLayerTol);
}

TEST(CudaBackend, TanhMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] { return seq(std::make_unique<Tanh>(), std::make_unique<Flatten>(), std::make_unique<Dense>(32, 3)); },
      {2, 4, 4}, kLayerTol);
}

TEST(CudaBackend, SigmoidMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] { return seq(std::make_unique<Sigmoid>(), std::make_unique<Flatten>(), std::make_unique<Dense>(32, 3)); },
      {2, 4, 4}, kLayerTol);
}

TEST(CudaBackend, LeakyReluMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<LeakyReLU>(0.1f), std::make_unique<Flatten>(), std::make_unique<Dense>(32, 3));
      },
      {2, 4, 4}, kLayerTol);
}

TEST(CudaBackend, ConvWithBiasMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<Conv2D>(2, 3, 3), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(3 * 5 * 5, 4));
      },
      {2, 7, 7}, kLayerTol);
}

TEST(CudaBackend, ConvWithoutBiasMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<Conv2D>(2, 3, 3, 1, 0, false), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(3 * 5 * 5, 4));
      },
      {2, 7, 7}, kLayerTol);
}

TEST(CudaBackend, ConvWithPaddingMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<Conv2D>(2, 3, 3, 1, 1), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(3 * 6 * 6, 4));
      },
      {2, 6, 6}, kLayerTol);
}

TEST(CudaBackend, StridedPaddedConvMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  // 7x7, k3, s2, p1 -> 4x4
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<Conv2D>(2, 3, 3, 2, 1), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(3 * 4 * 4, 4));
      },
      {2, 7, 7}, kLayerTol);
}

TEST(CudaBackend, PointwiseConvMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<Conv2D>(3, 4, 1), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(4 * 5 * 5, 3));
      },
      {3, 5, 5}, kLayerTol);
}

TEST(CudaBackend, MaxPoolMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<MaxPool2D>(2), std::make_unique<Flatten>(), std::make_unique<Dense>(2 * 3 * 3, 3));
      },
      {2, 6, 6}, kLayerTol);
}

TEST(CudaBackend, OverlappingMaxPoolMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  // 7x7, window 3, stride 2 -> 3x3; neighbouring windows share a row and a column.
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<MaxPool2D>(3, 2), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(2 * 3 * 3, 3));
      },
      {2, 7, 7}, kLayerTol);
}

TEST(CudaBackend, GlobalAvgPoolMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu([] { return seq(std::make_unique<GlobalAvgPool>(), std::make_unique<Dense>(3, 4)); },
                         {3, 4, 4}, kLayerTol);
}

TEST(CudaBackend, BatchNormMatchesTheCpuInTrainingAndInference) {
  SKIP_WITHOUT_GPU();
  // Four training steps move the running statistics (compared after each),
  // then inference uses them.
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<BatchNorm2D>(3), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(3 * 4 * 4, 4));
      },
      {3, 4, 4}, kLayerTol);
}

TEST(CudaBackend, BatchNormWithOtherEpsAndMomentumMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        return seq(std::make_unique<Conv2D>(2, 3, 3, 1, 1), std::make_unique<BatchNorm2D>(3, 1e-3f, 0.3f),
                   std::make_unique<Flatten>(), std::make_unique<Dense>(3 * 4 * 4, 4));
      },
      {2, 4, 4}, kLayerTol);
}

TEST(CudaBackend, FlattenMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu([] { return seq(std::make_unique<Flatten>(), std::make_unique<Dense>(18, 3)); }, {2, 3, 3},
                         kLayerTol);
}

TEST(CudaBackend, DropoutWithPZeroIsTheIdentity) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu([] { return seq(std::make_unique<Dropout>(0.0f), std::make_unique<Dense>(6, 3)); }, {6},
                         kLayerTol);
}

TEST(CudaBackend, ResidualWithIdentityShortcutMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        Layers main = seq(std::make_unique<Conv2D>(3, 3, 3, 1, 1, false), std::make_unique<BatchNorm2D>(3),
                          std::make_unique<ReLU>(), std::make_unique<Conv2D>(3, 3, 3, 1, 1, false),
                          std::make_unique<BatchNorm2D>(3));
        return seq(std::make_unique<Residual>(std::move(main), Layers{}), std::make_unique<ReLU>(),
                   std::make_unique<Flatten>(), std::make_unique<Dense>(3 * 5 * 5, 4));
      },
      {3, 5, 5}, kLayerTol);
}

TEST(CudaBackend, ResidualWithProjectionShortcutMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(
      [] {
        Layers main = seq(std::make_unique<Conv2D>(3, 4, 3, 2, 1, false), std::make_unique<BatchNorm2D>(4),
                          std::make_unique<ReLU>(), std::make_unique<Conv2D>(4, 4, 3, 1, 1, false),
                          std::make_unique<BatchNorm2D>(4));
        Layers shortcut = seq(std::make_unique<Conv2D>(3, 4, 1, 2, 0, false), std::make_unique<BatchNorm2D>(4));
        return seq(std::make_unique<Residual>(std::move(main), std::move(shortcut)), std::make_unique<ReLU>(),
                   std::make_unique<GlobalAvgPool>(), std::make_unique<Dense>(4, 3));
      },
      {3, 6, 6}, kLayerTol);
}

TEST(CudaBackend, ResidualAsTheFirstLayerNeedsNoInputGradient) {
  SKIP_WITHOUT_GPU();
  // The backend skips dL/dx for the model's first layer; a Residual there
  // passes that on to both paths, and a BatchNorm first in a path still
  // gets somewhere to write it.
  expect_gpu_matches_cpu(
      [] {
        Layers main = seq(std::make_unique<BatchNorm2D>(2), std::make_unique<Conv2D>(2, 2, 3, 1, 1));
        Layers shortcut = seq(std::make_unique<BatchNorm2D>(2));
        return seq(std::make_unique<Residual>(std::move(main), std::move(shortcut)), std::make_unique<Flatten>(),
                   std::make_unique<Dense>(2 * 4 * 4, 3));
      },
      {2, 4, 4}, kLayerTol);
}

// ---- Dropout with p > 0: checked through what the masks must satisfy -----------

TEST(CudaBackend, DropoutDropsAboutPOfTheUnitsAndScalesTheRest) {
  SKIP_WITHOUT_GPU();
  // Dropout(p) then Dense(n, k) on one sample: dW[k][i] = db[k] * x[i] * m[i]
  // with m[i] either 0 or 1 / (1 - p), the same for every k. So the mask can
  // be read back from the gradients and the loss recomputed from it.
  constexpr std::size_t n = 256, k = 3;
  constexpr float p = 0.5f;
  CpuNet host(seq(std::make_unique<Dropout>(p), std::make_unique<Dense>(n, k)), {n});
  host.init(3);
  auto made = make_cuda_model(host.layer_ptrs(), {n}, host.params().size(), 0);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  DeviceModel& gpu = **made;
  const std::span<const float> w = host.params().first(k * n), b = host.params().subspan(k * n, k);

  Rng rng(5);
  std::vector<float> x(n);
  for (float& v : x) v = rng.uniform(0.5f, 1.5f) * (rng.uniform() < 0.5f ? -1.0f : 1.0f);  // no zeros
  const std::vector<std::int32_t> y = {1};
  std::vector<float> grads(host.params().size());
  std::vector<float> previous_mask;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const float loss = gpu.compute_gradients(host.params(), grads, x, y);
    const std::span<const float> dw = std::span(grads).first(k * n), db = std::span(grads).subspan(k * n, k);
    std::size_t top = 0;  // the class with the largest bias gradient divides best
    for (std::size_t c = 1; c < k; ++c)
      if (std::abs(db[c]) > std::abs(db[top])) top = c;
    ASSERT_GT(std::abs(db[top]), 1e-3f);

    std::vector<float> mask(n);
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float m = dw[top * n + i] / (db[top] * x[i]);
      ASSERT_TRUE(std::abs(m) < 1e-4f || std::abs(m - 1.0f / (1.0f - p)) < 1e-4f) << "unit " << i << ": " << m;
      mask[i] = std::abs(m) < 1e-4f ? 0.0f : 1.0f / (1.0f - p);
      dropped += mask[i] == 0.0f;
      for (std::size_t c = 0; c < k; ++c)
        EXPECT_NEAR(dw[c * n + i], db[c] * x[i] * mask[i], 1e-5f) << "dW[" << c << ", " << i << "]";
    }
    // 128 expected, standard deviation 8.
    EXPECT_GT(dropped, 64u);
    EXPECT_LT(dropped, 192u);

    // The loss of the dense head applied to the masked input.
    std::vector<double> logits(k);
    for (std::size_t c = 0; c < k; ++c) {
      logits[c] = b[c];
      for (std::size_t i = 0; i < n; ++i) logits[c] += static_cast<double>(w[c * n + i]) * x[i] * mask[i];
    }
    const double zmax = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (const double z : logits) sum += std::exp(z - zmax);
    EXPECT_NEAR(loss, std::log(sum) + zmax - logits[1], 1e-4);

    if (!previous_mask.empty()) {
      EXPECT_NE(mask, previous_mask) << "each step draws a new mask";
    }
    previous_mask = mask;
  }

  // Inference drops nothing.
  std::vector<float> logits(k);
  gpu.infer(host.params(), x, 1, logits);
  for (std::size_t c = 0; c < k; ++c) {
    double z = b[c];
    for (std::size_t i = 0; i < n; ++i) z += static_cast<double>(w[c * n + i]) * x[i];
    EXPECT_NEAR(logits[c], z, 1e-4 * std::max(1.0, std::abs(z)));
  }
}

// ---- Whole models ------------------------------------------------------------------

Layers lenet() {
  return seq(std::make_unique<Conv2D>(1, 16, 5), std::make_unique<ReLU>(), std::make_unique<MaxPool2D>(2),
             std::make_unique<Conv2D>(16, 32, 5), std::make_unique<ReLU>(), std::make_unique<MaxPool2D>(2),
             std::make_unique<Flatten>(), std::make_unique<Dense>(512, 128), std::make_unique<ReLU>(),
             std::make_unique<Dense>(128, 10));
}

std::unique_ptr<Layer> basic_block(std::size_t in, std::size_t out) {
  Layers main = seq(std::make_unique<Conv2D>(in, out, 3, 2, 1, false), std::make_unique<BatchNorm2D>(out),
                    std::make_unique<ReLU>(), std::make_unique<Conv2D>(out, out, 3, 1, 1, false),
                    std::make_unique<BatchNorm2D>(out));
  Layers shortcut = seq(std::make_unique<Conv2D>(in, out, 1, 2, 0, false), std::make_unique<BatchNorm2D>(out));
  return std::make_unique<Residual>(std::move(main), std::move(shortcut));
}

Layers resnet_mini() {
  return seq(std::make_unique<Conv2D>(1, 16, 3, 1, 1, false), std::make_unique<BatchNorm2D>(16),
             std::make_unique<ReLU>(), basic_block(16, 32), std::make_unique<ReLU>(), basic_block(32, 64),
             std::make_unique<ReLU>(), std::make_unique<GlobalAvgPool>(), std::make_unique<Dense>(64, 10));
}

// The CIFAR ResNet-18 as compute/model.cpp builds it: a 3x3 stem, four
// stages of two basic blocks (identity shortcuts where the shape stays).
template <class Activation>
std::unique_ptr<Layer> resnet_block(std::size_t in, std::size_t out, std::size_t stride) {
  Layers main = seq(std::make_unique<Conv2D>(in, out, 3, stride, 1, false), std::make_unique<BatchNorm2D>(out),
                    std::make_unique<Activation>(), std::make_unique<Conv2D>(out, out, 3, 1, 1, false),
                    std::make_unique<BatchNorm2D>(out));
  Layers shortcut;
  if (stride != 1 || in != out)
    shortcut = seq(std::make_unique<Conv2D>(in, out, 1, stride, 0, false), std::make_unique<BatchNorm2D>(out));
  return std::make_unique<Residual>(std::move(main), std::move(shortcut));
}

template <class Activation = ReLU>
Layers resnet18() {
  Layers layers = seq(std::make_unique<Conv2D>(3, 64, 3, 1, 1, false), std::make_unique<BatchNorm2D>(64),
                      std::make_unique<Activation>());
  std::size_t width = 64;
  for (const std::size_t stage : {64, 128, 256, 512}) {
    for (int b = 0; b < 2; ++b) {
      layers.push_back(resnet_block<Activation>(width, stage, b == 0 && stage != 64 ? 2 : 1));
      layers.push_back(std::make_unique<Activation>());
      width = stage;
    }
  }
  layers.push_back(std::make_unique<GlobalAvgPool>());
  layers.push_back(std::make_unique<Dense>(512, 10));
  return layers;
}

TEST(CudaBackend, LenetMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(lenet, {1, 28, 28}, 2e-4, {8, 8, 16, 3}, 10, true);
}

TEST(CudaBackend, ResnetMiniMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(resnet_mini, {1, 28, 28}, 1e-3, {8, 8, 16, 3}, 10, true);
}

// A ReLU ResNet-18's gradients at batch 4 hang on which units sit a rounding
// error either side of zero: on the CPU alone, parameters moved by 1e-6 of
// themselves moved gradients by up to 0.6% in norm (1e-5: 3%), and the
// GPU's differed from the CPU's by 0.5% (H100, 2026-11-26). With tanh, which
// has no kink, the same 1e-6 moved them by 3e-5: that model judges the
// arithmetic of every layer at ResNet-18's shapes at 1e-3, and the ReLU
// model its forward pass (the loss, the logits and BatchNorm's statistics,
// which have no kink either) at 1e-4 and its gradients at 5e-2, which a
// wrong layer would exceed many times over.
TEST(CudaBackend, Resnet18WithTanhMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(resnet18<Tanh>, {3, 32, 32}, 1e-3, {4, 3}, 4, true);
}

TEST(CudaBackend, Resnet18MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(resnet18<ReLU>, {3, 32, 32}, 5e-2, {4, 3}, 4, true, 1e-4);
}

// ---- Batches: prefetching, empty batches, bad labels --------------------------

Layers small_convnet() {
  return seq(std::make_unique<Conv2D>(1, 4, 3), std::make_unique<ReLU>(), std::make_unique<Flatten>(),
             std::make_unique<Dense>(4 * 4 * 4, 5));
}

// A model on the CPU and the same model on a GPU, from the same parameters.
struct Mirrored {
  Mirrored(const MakeLayers& make, const Shape& sample, std::uint64_t seed, int device = 0)
      : cpu(make(), sample), host(make(), sample), made([&] {
          cpu.init(seed);
          std::copy(cpu.params().begin(), cpu.params().end(), host.params().begin());
          return make_cuda_model(host.layer_ptrs(), sample, host.params().size(), device);
        }()),
        grads(cpu.params().size()) {}

  DeviceModel& gpu() { return **made; }

  // One training step on both sides: the losses and every gradient agree
  // (the GPU's gradients pre-filled with NaN, so an unwritten one fails).
  void expect_step(std::span<const float> x, std::span<const std::int32_t> y, const std::string& what) {
    std::fill(grads.begin(), grads.end(), std::numeric_limits<float>::quiet_NaN());
    const float gpu_loss = gpu().compute_gradients(cpu.params(), grads, x, y);
    EXPECT_NEAR(gpu_loss, cpu.train_step(x, y), kLayerTol) << what;
    expect_close(grads, cpu.grads(), kLayerTol, what);
  }

  CpuNet cpu;
  CpuNet host;  // the GPU model reads these layers
  Result<std::unique_ptr<DeviceModel>> made;
  std::vector<float> grads;
};

TEST(CudaBackend, PrefetchedBatchesGiveTheSameGradients) {
  SKIP_WITHOUT_GPU();
  Mirrored m(small_convnet, {1, 6, 6}, 2);
  ASSERT_TRUE(m.made.ok()) << m.made.status().to_string();
  DeviceModel& gpu = m.gpu();

  Rng rng(9);
  constexpr std::size_t batch = 6;
  const auto batch_of = [&] { return std::make_pair(random_inputs(rng, batch * 36), random_labels(rng, batch, 5)); };

  // Two batches in flight at once, used in order.
  const auto [x1, y1] = batch_of();
  const auto [x2, y2] = batch_of();
  gpu.prefetch(x1, y1);
  gpu.prefetch(x2, y2);
  m.expect_step(x1, y1, "first prefetched batch");
  m.expect_step(x2, y2, "second prefetched batch");

  // The usual loop: prefetch the next batch, then compute the current one.
  auto [x3, y3] = batch_of();
  gpu.prefetch(x3, y3);
  m.expect_step(x2, y2, "a batch computed while the next one uploads");
  m.expect_step(x3, y3, "that next batch");

  // A caller that refills one buffer after prefetching it gets its new data.
  auto [x4, y4] = batch_of();
  gpu.prefetch(x4, y4);
  const auto refill = random_inputs(rng, batch * 36);
  std::copy(refill.begin(), refill.end(), x4.begin());
  m.expect_step(x4, y4, "a refilled buffer");

  // A prefetched batch that is never used does no harm.
  const auto [x5, y5] = batch_of();
  gpu.prefetch(x5, y5);
  m.expect_step(x3, y3, "a batch other than the prefetched one");
}

// ---- Paths a first GPU run must see (issue: GPU tests that can fail) -------------

// One model on `device` against the CPU over the given steps; each step is
// ("train", batch) or ("infer", batch).
void expect_steps_match(const MakeLayers& make, const Shape& sample, int device,
                        const std::vector<std::pair<std::string, std::size_t>>& steps, std::uint64_t seed) {
  Mirrored m(make, sample, seed, device);
  ASSERT_TRUE(m.made.ok()) << m.made.status().to_string();
  Rng rng(seed + 1);
  for (const auto& [what, batch] : steps) {
    SCOPED_TRACE(what + " at batch " + std::to_string(batch));
    const auto x = random_inputs(rng, batch * m.cpu.sample_size());
    if (what == "infer") {
      std::vector<float> logits(batch * m.cpu.classes(), std::numeric_limits<float>::quiet_NaN());
      m.gpu().infer(m.cpu.params(), x, batch, logits);
      expect_close(logits, m.cpu.infer(x, batch), kLayerTol, "logits");
      continue;
    }
    m.expect_step(x, random_labels(rng, batch, m.cpu.classes()), "gradients");
  }
}

TEST(CudaBackend, TrainInferAndTrainAgainAtOneBatchSize) {
  SKIP_WITHOUT_GPU();
  expect_steps_match(small_convnet, {1, 6, 6}, 0, {{"train", 4}, {"infer", 4}, {"train", 4}, {"infer", 4}}, 3);
}

TEST(CudaBackend, ASecondGpuComputesWhatTheFirstDoes) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "this machine has one GPU; cuda:1 needs a second";
  expect_steps_match(small_convnet, {1, 6, 6}, 1, {{"train", 4}, {"infer", 5}, {"train", 7}}, 4);
}

TEST(CudaBackend, TwoModelsOnOneGpuFromTwoThreadsEachMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  // Failures inside the threads are recorded by gtest, which is thread-safe
  // on this platform.
  std::thread a([] { expect_steps_match(small_convnet, {1, 6, 6}, 0, {{"train", 6}, {"train", 6}, {"infer", 6}}, 5); });
  std::thread b([] { expect_steps_match(small_convnet, {1, 6, 6}, 0, {{"train", 3}, {"infer", 2}, {"train", 8}}, 6); });
  a.join();
  b.join();
}

TEST(CudaBackend, APrefetchFollowedByAnotherBatchSizeGivesTheSameGradients) {
  SKIP_WITHOUT_GPU();
  Mirrored m(small_convnet, {1, 6, 6}, 8);
  ASSERT_TRUE(m.made.ok()) << m.made.status().to_string();
  Rng rng(12);
  const auto big_x = random_inputs(rng, 9 * 36);
  const auto big_y = random_labels(rng, 9, 5);
  const auto small_x = random_inputs(rng, 3 * 36);
  const auto small_y = random_labels(rng, 3, 5);
  m.gpu().prefetch(big_x, big_y);  // a batch of 9 on its way ...
  m.expect_step(small_x, small_y, "a batch of 3 computed first");
  m.expect_step(big_x, big_y, "then the prefetched batch of 9");
}

// Parameter counts that are not multiples of four: the second convolution's
// weights and every bias start at offsets that are not 16-byte aligned in
// the flat parameter vector.
Layers unaligned_convnet() {
  return seq(std::make_unique<Conv2D>(1, 3, 3), std::make_unique<ReLU>(), std::make_unique<Conv2D>(3, 5, 3),
             std::make_unique<Flatten>(), std::make_unique<Dense>(5 * 4 * 4, 3));
}

TEST(CudaBackend, ParametersAtOffsetsThatAreNot16ByteAlignedMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(unaligned_convnet, {1, 8, 8}, kLayerTol);
}

TEST(CudaBackend, AnEmptyBatchGivesZeroLossAndZeroGradients) {
  SKIP_WITHOUT_GPU();
  CpuNet host(small_convnet(), {1, 6, 6});
  host.init(1);
  auto made = make_cuda_model(host.layer_ptrs(), {1, 6, 6}, host.params().size(), 0);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::vector<float> grads(host.params().size(), 1.0f);
  EXPECT_EQ((*made)->compute_gradients(host.params(), grads, {}, {}), 0.0f);
  EXPECT_EQ(std::count(grads.begin(), grads.end(), 0.0f), static_cast<std::ptrdiff_t>(grads.size()));
}

TEST(CudaBackend, ABadLabelThrowsAndLeavesTheModelUsable) {
  SKIP_WITHOUT_GPU();
  CpuNet host(small_convnet(), {1, 6, 6});
  host.init(1);
  auto made = make_cuda_model(host.layer_ptrs(), {1, 6, 6}, host.params().size(), 0);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Rng rng(4);
  const auto x = random_inputs(rng, 2 * 36);
  std::vector<float> grads(host.params().size());
  // The per-step calls report failures as std::runtime_error (asgd::cuda::Error).
  EXPECT_THROW((*made)->compute_gradients(host.params(), grads, x, std::vector<std::int32_t>{0, 5}),
               std::runtime_error);
  EXPECT_THROW(
      (*made)->compute_gradients(host.params(), grads, std::span(x).first(36), std::vector<std::int32_t>{0, 1}),
      std::runtime_error);
  EXPECT_TRUE(std::isfinite((*made)->compute_gradients(host.params(), grads, x, std::vector<std::int32_t>{0, 4})));
}

// The masks follow the Dropout layer's seed (a job's --seed, through
// Model::init_params): they were a hash of the node and the step alone,
// the same for every seed. (From a reading review; not yet run on a GPU.)
TEST(CudaBackend, DropoutMasksFollowTheLayersSeed) {
  SKIP_WITHOUT_GPU();
  constexpr std::size_t n = 256;
  const auto gradients_with_seed = [&](std::uint64_t seed) {
    CpuNet host(seq(std::make_unique<Dropout>(0.5f, seed), std::make_unique<Dense>(n, 3)), {n});
    host.init(3);  // the same weights on both sides
    host.layer_ptrs()[0]->reseed(seed);
    auto made = make_cuda_model(host.layer_ptrs(), {n}, host.params().size(), 0);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    std::vector<float> x(n, 1.0f), grads(host.params().size());
    if (made.ok()) (*made)->compute_gradients(host.params(), grads, x, std::vector<std::int32_t>{1});
    return grads;
  };
  EXPECT_EQ(gradients_with_seed(1), gradients_with_seed(1));
  EXPECT_NE(gradients_with_seed(1), gradients_with_seed(2));
}

// A NaN inside the model reaches the loss, as on the CPU (ReLU.KeepsANaN,
// MaxPool2D.ANaNWinsItsWindowOnBothPaths): cuDNN's activations and pooling
// were told not to propagate it (ReLU gave max(NaN, 0) = 0, max-pool skipped
// it), and dropout wrote 0 for a dropped NaN, so the worker's check of the
// loss never saw it. (From a reading review, 2026-11-29; not yet run on a GPU.)
TEST(CudaBackend, ANaNInTheInputReachesTheLossThroughReluMaxPoolAndDropout) {
  SKIP_WITHOUT_GPU();
  const auto loss_of = [](Layers layers, const Shape& sample, std::size_t values) {
    CpuNet host(std::move(layers), sample);
    host.init(1);
    auto made = make_cuda_model(host.layer_ptrs(), sample, host.params().size(), 0);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (!made.ok()) return 0.0f;
    std::vector<float> x(2 * values, 0.5f), grads(host.params().size());
    x[1] = std::numeric_limits<float>::quiet_NaN();  // one value of the first sample
    return (*made)->compute_gradients(host.params(), grads, x, std::vector<std::int32_t>{0, 1});
  };
  EXPECT_TRUE(std::isnan(loss_of(seq(std::make_unique<ReLU>(), std::make_unique<Dense>(6, 3)), {6}, 6))) << "relu";
  EXPECT_TRUE(std::isnan(loss_of(seq(std::make_unique<MaxPool2D>(2), std::make_unique<Flatten>(),
                                     std::make_unique<Dense>(4, 3)),
                                 {1, 4, 4}, 16)))
      << "max-pool";
  EXPECT_TRUE(std::isnan(loss_of(seq(std::make_unique<Dropout>(1.0f), std::make_unique<Dense>(6, 3)), {6}, 6)))
      << "dropout dropping every unit";
}

// ---- Refusals ------------------------------------------------------------------------

// A layer the CUDA backend has never heard of.
class Square final : public Layer {
 public:
  std::string kind() const override { return "square"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(ConstTensorView x, Tensor& y) override {
    y.resize(x.shape);
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x.data[i] * x.data[i];
  }
  void backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) override {
    if (!dx) return;
    dx->resize(x.shape);
    for (std::size_t i = 0; i < x.size(); ++i) (*dx)[i] = 2.0f * x.data[i] * dy[i];
  }
};

std::vector<Layer*> ptrs(const Layers& layers) {
  std::vector<Layer*> out;
  for (const auto& l : layers) out.push_back(l.get());
  return out;
}

TEST(CudaBackend, RefusesModelsItCannotRunWithInvalidArgument) {
#ifndef ASGD_CUDA_BACKEND
  GTEST_SKIP() << "this build has no CUDA backend";
#endif
  // The model is checked before any device is touched, so this runs
  // without a GPU too.
  const auto refusal = [](const Layers& layers, const Shape& sample, std::size_t params) {
    auto made = make_cuda_model(ptrs(layers), sample, params, 0);
    EXPECT_FALSE(made.ok());
    return made.ok() ? Status() : made.status();
  };

  const Layers unknown = seq(std::make_unique<Dense>(4, 4), std::make_unique<Square>(), std::make_unique<Dense>(4, 2));
  Status s = refusal(unknown, {4}, 30);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("square"), std::string::npos) << s.to_string();

  const Layers dense = seq(std::make_unique<Dense>(4, 2));
  s = refusal(dense, {4}, 11);  // it holds 10
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();

  s = refusal(dense, {5}, 10);  // shapes that do not chain
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();

  const Layers conv_on_vectors = seq(std::make_unique<Conv2D>(1, 2, 3), std::make_unique<Dense>(2, 2));
  s = refusal(conv_on_vectors, {9}, 20 + 6);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();

  const Layers ends_in_image = seq(std::make_unique<Conv2D>(1, 2, 3));
  s = refusal(ends_in_image, {1, 5, 5}, 20);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
}

TEST(CudaBackend, WithoutAUsableGpuMakeCudaModelSaysWhy) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a usable GPU is present";
  EXPECT_FALSE(why.empty());
  const Layers dense = seq(std::make_unique<Dense>(4, 2));
  auto made = make_cuda_model(ptrs(dense), {4}, 10, 0);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::unavailable);
  EXPECT_NE(made.status().message().find(why), std::string::npos) << made.status().to_string();
}

}  // namespace
}  // namespace asgd

