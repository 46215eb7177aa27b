// The convolutional models as wholes: layouts that match torch.nn, wiring
// checked by directional derivatives, training and inference modes, and
// BatchNorm recalibration. Each layer's own gradient check is in
// conv_layers_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "compute/layers/batch_norm2d.hpp"
#include "compute/layers/conv2d.hpp"
#include "compute/layers/dense.hpp"
#include "compute/layers/dropout.hpp"
#include "compute/layers/flatten.hpp"
#include "compute/layers/global_avg_pool.hpp"
#include "compute/layers/max_pool2d.hpp"
#include "compute/layers/relu.hpp"
#include "compute/layers/residual.hpp"
#include "compute/device.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "base/random.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

constexpr std::size_t kClasses = 10;
const Shape kMnist = {1, 28, 28};

struct Batch {
  std::vector<float> x;  // (B, 1, 28, 28)
  std::vector<std::int32_t> y;  // (B,)
};

// Pixel-like inputs, normalised roughly as the datasets are.
Batch random_batch(Rng& rng, std::size_t batch, const Shape& sample = kMnist) {
  Batch b{std::vector<float>(batch * numel(sample)), std::vector<std::int32_t>(batch)};
  for (float& v : b.x) v = rng.uniform(-0.5f, 2.5f);
  for (auto& l : b.y) l = static_cast<std::int32_t>(rng.below(kClasses));
  return b;
}

Model build(const std::string& name, const Shape& sample = kMnist) {
  auto built = Model::build(name, sample, kClasses);
  EXPECT_TRUE(built.ok()) << built.status().to_string();
  Model model = std::move(built).value();
  model.init_params(11);
  return model;
}

struct Expected {
  std::string name;
  Shape shape;
};

void expect_layout(const Model& model, const std::vector<Expected>& expected) {
  const auto& layout = model.layout();
  ASSERT_EQ(layout.size(), expected.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(layout[i].name, expected[i].name);
    EXPECT_EQ(layout[i].shape, expected[i].shape);
    EXPECT_EQ(layout[i].offset, offset);
    offset += layout[i].size;
  }
  EXPECT_EQ(offset, model.num_params());
}

TEST(ConvModels, LenetHasTheDocumentedParameterCountAndTorchLayout) {
  Model model = build("lenet");
  EXPECT_EQ(model.num_params(), 80202u);
  expect_layout(model, {{"0.weight", {16, 1, 5, 5}},
                        {"0.bias", {16}},
                        {"3.weight", {32, 16, 5, 5}},
                        {"3.bias", {32}},
                        {"7.weight", {128, 512}},
                        {"7.bias", {128}},
                        {"9.weight", {10, 128}},
                        {"9.bias", {10}}});
  EXPECT_FALSE(model.has_batchnorm());
  EXPECT_TRUE(model.buffers().empty());
}

TEST(ConvModels, ResnetMiniHasTheDocumentedParameterCountTorchLayoutAndBuffers) {
  Model model = build("resnet-mini");
  EXPECT_EQ(model.num_params(), 73082u);
  std::vector<Expected> expected = {{"0.weight", {16, 1, 3, 3}}, {"1.weight", {16}}, {"1.bias", {16}}};
  auto block = [&](const std::string& at, std::size_t in, std::size_t out) {
    expected.push_back({at + ".main.0.weight", {out, in, 3, 3}});
    expected.push_back({at + ".main.1.weight", {out}});
    expected.push_back({at + ".main.1.bias", {out}});
    expected.push_back({at + ".main.3.weight", {out, out, 3, 3}});
    expected.push_back({at + ".main.4.weight", {out}});
    expected.push_back({at + ".main.4.bias", {out}});
    expected.push_back({at + ".shortcut.0.weight", {out, in, 1, 1}});
    expected.push_back({at + ".shortcut.1.weight", {out}});
    expected.push_back({at + ".shortcut.1.bias", {out}});
  };
  block("3", 16, 32);
  block("5", 32, 64);
  expected.push_back({"8.weight", {10, 64}});
  expected.push_back({"8.bias", {10}});
  expect_layout(model, expected);

  EXPECT_TRUE(model.has_batchnorm());
  const auto buffers = model.buffers();
  std::size_t values = 0;
  for (const auto& b : buffers) values += b.values.size();
  EXPECT_EQ(values, 608u);
  ASSERT_FALSE(buffers.empty());
  EXPECT_EQ(buffers.front().name, "1.running_mean");
  EXPECT_EQ(buffers.back().name, "5.shortcut.1.running_var");
}

TEST(ConvModels, Resnet18IsTheCifarVariantWithItsParameterCountAndTorchLayout) {
  Model model = build("resnet18", {3, 32, 32});
  EXPECT_EQ(model.num_params(), 11173962u);  // torchvision-style CIFAR ResNet-18, 10 classes
  std::vector<Expected> expected = {{"0.weight", {64, 3, 3, 3}}, {"1.weight", {64}}, {"1.bias", {64}}};
  auto block = [&](std::size_t at, std::size_t in, std::size_t out, std::size_t stride) {
    const std::string p = std::to_string(at);
    expected.push_back({p + ".main.0.weight", {out, in, 3, 3}});
    expected.push_back({p + ".main.1.weight", {out}});
    expected.push_back({p + ".main.1.bias", {out}});
    expected.push_back({p + ".main.3.weight", {out, out, 3, 3}});
    expected.push_back({p + ".main.4.weight", {out}});
    expected.push_back({p + ".main.4.bias", {out}});
    if (stride == 1 && in == out) return;  // the identity shortcut has no parameters
    expected.push_back({p + ".shortcut.0.weight", {out, in, 1, 1}});
    expected.push_back({p + ".shortcut.1.weight", {out}});
    expected.push_back({p + ".shortcut.1.bias", {out}});
  };
  block(3, 64, 64, 1);
  block(5, 64, 64, 1);
  block(7, 64, 128, 2);
  block(9, 128, 128, 1);
  block(11, 128, 256, 2);
  block(13, 256, 256, 1);
  block(15, 256, 512, 2);
  block(17, 512, 512, 1);
  expected.push_back({"20.weight", {10, 512}});
  expected.push_back({"20.bias", {10}});
  expect_layout(model, expected);
  EXPECT_FALSE(Model::build("resnet18", {3, 4, 4}, kClasses).ok());
}

TEST(ConvModels, InitGivesBatchNormScalesOfOneAndShiftsOfZero) {
  Model model = build("resnet-mini");
  for (const ParamEntry& e : model.layout()) {
    if (e.shape.size() != 1 || e.name.rfind("8.", 0) == 0) continue;  // BatchNorm weight/bias only
    const bool scale = e.name.ends_with(".weight");
    for (std::size_t i = 0; i < e.size; ++i) ASSERT_EQ(model.params()[e.offset + i], scale ? 1.0f : 0.0f) << e.name;
  }
}

TEST(ConvModels, TooSmallOrFlatInputsAreRefusedWithTheShape) {
  auto flat = Model::build("lenet", {784}, kClasses);
  ASSERT_FALSE(flat.ok());
  EXPECT_EQ(flat.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(flat.status().message().find("(784)"), std::string::npos) << flat.status().message();
  EXPECT_FALSE(Model::build("lenet", {1, 8, 8}, kClasses).ok());
  EXPECT_FALSE(Model::build("resnet-mini", {1, 2, 2}, kClasses).ok());
  EXPECT_TRUE(Model::build("resnet-mini", {3, 32, 32}, kClasses).ok());
}

// g . d against (L(p + h d) - L(p - h d)) / 2h along random unit directions
// d over all parameters: this checks the whole model's wiring (which slice
// each layer reads and writes); each layer's exact gradient is checked on
// its own in conv_layers_test.cpp.
void check_directional_derivatives(const std::string& name, const Shape& sample = kMnist, double h = 2e-3) {
  SCOPED_TRACE(name);
  Model model = build(name, sample);
  Rng rng(5);
  const Batch batch = random_batch(rng, 8, sample);
  model.compute_gradients(batch.x, batch.y);
  const std::vector<float> grad(model.grads().begin(), model.grads().end());
  const std::vector<float> saved(model.params().begin(), model.params().end());
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<double> d(saved.size());
    double norm = 0.0;
    for (double& v : d) {
      v = rng.normal();
      norm += v * v;
    }
    double analytic = 0.0;
    for (std::size_t i = 0; i < d.size(); ++i) {
      d[i] /= std::sqrt(norm);
      analytic += d[i] * grad[i];
    }
    auto loss_at = [&](double t) {
      for (std::size_t i = 0; i < d.size(); ++i) model.params()[i] = static_cast<float>(saved[i] + t * d[i]);
      return static_cast<double>(model.compute_gradients(batch.x, batch.y));
    };
    const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
    // A wiring mistake is off by O(1); kinks crossed inside +-h and the
    // float32 loss (resolution ~2.4e-7 / 2h = 6e-5) account for far less.
    EXPECT_NEAR(analytic, numeric, 3e-3 + 0.05 * std::abs(numeric)) << "direction " << trial;
  }
  std::copy(saved.begin(), saved.end(), model.params().begin());
}

TEST(ConvModels, LenetGradientsMatchDirectionalDerivatives) { check_directional_derivatives("lenet"); }
TEST(ConvModels, ResnetMiniGradientsMatchDirectionalDerivatives) { check_directional_derivatives("resnet-mini"); }
// A small input (3x8x8: 8, 4, 2 and 1 pixels through the stages) keeps
// resnet18's check to a second.
TEST(ConvModels, Resnet18GradientsMatchDirectionalDerivatives) {
  check_directional_derivatives("resnet18", {3, 16, 16}, 2e-3);
}

TEST(ConvModels, EachModelFitsOneBatchWithMomentumSgd) {
  for (const std::string name : {"lenet", "resnet-mini"}) {
    SCOPED_TRACE(name);
    Model model = build(name);
    Rng rng(9);
    const Batch batch = random_batch(rng, 32);
    auto opt = make_optimizer({"momentum", 0.01f, 0.9f, 0.0f}, model.num_params());
    ASSERT_TRUE(opt.ok());
    const float first = model.compute_gradients(batch.x, batch.y);
    float last = first;
    for (int step = 0; step < 100; ++step) {
      (*opt)->step(model.params(), model.grads());
      last = model.compute_gradients(batch.x, batch.y);
    }
    EXPECT_LT(last, 0.5f * first) << "loss " << first << " -> " << last;
  }
}

TEST(ConvModels, EvaluationUsesRunningStatisticsAndLeavesThemAlone) {
  Model model = build("resnet-mini");
  Rng rng(3);
  const Batch batch = random_batch(rng, 16);
  const auto running = [&] {
    std::vector<float> all;
    for (const auto& b : model.buffers()) all.insert(all.end(), b.values.begin(), b.values.end());
    return all;
  };
  const std::vector<float> fresh = running();
  const EvalResult a = model.evaluate(batch.x, batch.y);
  const EvalResult b = model.evaluate(batch.x, batch.y, 5);  // chunking does not matter in inference mode
  EXPECT_EQ(running(), fresh);
  EXPECT_NEAR(a.loss, b.loss, 1e-5);
  model.compute_gradients(batch.x, batch.y);  // a training step moves them
  EXPECT_NE(running(), fresh);
}

TEST(ConvModels, AnEvaluationHoldsAboutAQuarterGigabyteOfActivationsNotAThousandSamplesWorth) {
  // The activations stay allocated after the pass (a steady size never
  // reallocates): in 1000-sample chunks resnet18 kept some 6 GB for 1000
  // samples of 28x28, 1 GB for these 150 (recalibrating, it takes 64 at a
  // time or, for resnet18, as few as inference holds at once).
  Model model = build("resnet18");
  EXPECT_LT(model.inference_chunk(), 100u);
  // Small models still run 1000 samples at a time.
  EXPECT_EQ(build("mlp").inference_chunk(), 1000u);
  EXPECT_EQ(build("lenet").inference_chunk(), 1000u);
  // A sanitizer's shadow memory counts in the resident size (ThreadSanitizer
  // made 343 MiB look like 1719), and its resnet18 takes minutes.
  if (asgd_test::kSanitized) GTEST_SKIP() << "resident memory means something else under a sanitizer";
  Rng rng(5);
  const Batch batch = random_batch(rng, 150);
  const std::size_t before = asgd_test::resident_bytes();
  model.recalibrate_batchnorm(batch.x);  // as the coordinator does first
  const EvalResult r = model.evaluate(batch.x, batch.y);
  const std::size_t held = asgd_test::resident_bytes() - std::min(before, asgd_test::resident_bytes());
  EXPECT_EQ(r.samples, 150u);
  std::printf("resnet18: %zu samples at a time, %zu MiB held after recalibrating and evaluating 150\n",
              model.inference_chunk(), held >> 20);
  EXPECT_LT(held, std::size_t{500} << 20) << "the evaluation holds " << (held >> 20) << " MiB";
}

TEST(ConvModels, RecalibratedStatisticsMakeInferenceMatchTrainingModeOnTheSameData) {
  Model model = build("resnet-mini");
  Rng rng(4);
  const Batch batch = random_batch(rng, 64);
  const double training_loss = model.compute_gradients(batch.x, batch.y);  // batch statistics
  const EvalResult stale = model.evaluate(batch.x, batch.y, 64);          // running stats after one step
  model.recalibrate_batchnorm(batch.x, 64);
  const EvalResult recalibrated = model.evaluate(batch.x, batch.y, 64);
  // Equal up to running_var holding the unbiased variance (a factor of
  // n / (n - 1) with n >= 64 * 49 values per channel).
  EXPECT_NEAR(recalibrated.loss, training_loss, 2e-3 * std::max(1.0, training_loss));
  EXPECT_GT(std::abs(stale.loss - training_loss), 10 * std::abs(recalibrated.loss - training_loss));

  // The cumulative average does not depend on how the samples are chunked
  // when the chunks are equal.
  const std::vector<float> whole = [&] {
    std::vector<float> all;
    for (const auto& b : model.buffers()) all.insert(all.end(), b.values.begin(), b.values.end());
    return all;
  }();
  model.recalibrate_batchnorm(batch.x, 64);
  std::size_t k = 0;
  for (const auto& b : model.buffers())
    for (float v : b.values) EXPECT_FLOAT_EQ(v, whole[k++]) << b.name;
}

TEST(ConvModels, RecalibrationAveragesWholeChunksOnlyAndTakesTheSameChunkOnEveryDevice) {
  Model model = build("resnet-mini");
  Rng rng(7);
  const Batch batch = random_batch(rng, 64 + 5);
  const auto buffers = [&] {
    std::vector<float> all;
    for (const auto& b : model.buffers()) all.insert(all.end(), b.values.begin(), b.values.end());
    return all;
  };
  model.recalibrate_batchnorm(std::span<const float>(batch.x).first(64 * 28 * 28), 64);
  const std::vector<float> first_chunk = buffers();
  model.recalibrate_batchnorm(batch.x, 64);
  EXPECT_EQ(buffers(), first_chunk) << "the 5 samples after the first 64 weighed as much as the 64";
  model.recalibrate_batchnorm(batch.x);  // the default chunk, whatever inference_chunk() is on this device
  EXPECT_EQ(Model::kRecalibrationChunk, 64u);
  EXPECT_EQ(buffers(), first_chunk);
  // Fewer samples than a chunk: all of them, as one.
  model.recalibrate_batchnorm(std::span<const float>(batch.x).first(5 * 28 * 28), 64);
  EXPECT_NE(buffers(), first_chunk);
  // A model whose activations would pass 256 MiB in a chunk takes fewer at a time, on every device alike.
  EXPECT_LT(build("resnet18").host_chunk(), 64u);
}

TEST(ConvModels, RecalibrationIsANoOpWithoutBatchNorm) {
  Model model = build("lenet");
  Rng rng(6);
  const Batch batch = random_batch(rng, 8);
  const EvalResult before = model.evaluate(batch.x, batch.y);
  model.recalibrate_batchnorm(batch.x);
  EXPECT_EQ(model.evaluate(batch.x, batch.y).loss, before.loss);
}

TEST(Device, ParsesCpuCudaAndCudaIndex) {
  EXPECT_EQ(Device::parse("cpu")->kind, Device::Kind::cpu);
  EXPECT_EQ(Device::parse("cuda")->str(), "cuda:0");
  EXPECT_EQ(Device::parse("cuda:3")->index, 3);
  for (const std::string bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""}) {
    auto d = Device::parse(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::invalid_argument);
    }
  }
}

TEST(Device, AModelAskedForAMissingGpuSaysWhyAndStaysOnTheCpu) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "this machine has a GPU";
  Model model = build("lenet");
  const Status s = model.set_device(Device{Device::Kind::cuda, 0});
  EXPECT_EQ(s.code(), StatusCode::unavailable);
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(model.device().kind, Device::Kind::cpu);
  Rng rng(1);
  const Batch batch = random_batch(rng, 4);
  EXPECT_TRUE(std::isfinite(model.compute_gradients(batch.x, batch.y)));
}

}  // namespace
}  // namespace asgd
