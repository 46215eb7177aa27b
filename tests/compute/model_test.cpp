#include "compute/model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compute/optimizer.hpp"
#include "base/random.hpp"

namespace asgd {
namespace {

constexpr std::size_t kPixels = 784;
constexpr std::size_t kClasses = 10;
const Shape kMnist = {1, 28, 28};

// A batch of samples (B, 784) and its labels (B,).
struct Batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

// Pixel-like inputs in [0, 1) with random labels.
Batch random_batch(Rng& rng, std::size_t batch) {
  Batch b{std::vector<float>(batch * kPixels), std::vector<std::int32_t>(batch)};
  for (float& v : b.x) v = rng.uniform();
  for (auto& l : b.y) l = static_cast<std::int32_t>(rng.below(kClasses));
  return b;
}

bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const ParamEntry& entry(const Model& model, const std::string& name) {
  for (const ParamEntry& e : model.layout())
    if (e.name == name) return e;
  ADD_FAILURE() << "no parameter named " << name;
  return model.layout().front();
}

TEST(Model, MlpHasTheDocumentedParameterCountAndTorchLayout) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  const Model& model = built.value();
  EXPECT_EQ(model.name(), "mlp");
  EXPECT_EQ(model.num_params(), 235146u);
  EXPECT_EQ(model.params().size(), 235146u);
  EXPECT_EQ(model.grads().size(), 235146u);

  struct Expected {
    std::string name;
    Shape shape;
  };
  const std::vector<Expected> expected = {{"0.weight", {256, 784}}, {"0.bias", {256}},
                                          {"2.weight", {128, 256}}, {"2.bias", {128}},
                                          {"4.weight", {10, 128}},  {"4.bias", {10}}};
  const auto& layout = model.layout();
  ASSERT_EQ(layout.size(), expected.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(layout[i].name, expected[i].name);
    EXPECT_EQ(layout[i].shape, expected[i].shape);
    EXPECT_EQ(layout[i].size, numel(expected[i].shape));
    EXPECT_EQ(layout[i].offset, offset);  // back to back, no gaps
    offset += layout[i].size;
  }
  EXPECT_EQ(offset, model.num_params());
}

TEST(Model, MlpSizesItsFirstAndLastLayerFromTheSampleShapeAndClasses) {
  auto built = Model::build("mlp", {3, 4, 5}, 7);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  const Model& model = built.value();
  EXPECT_EQ(entry(model, "0.weight").shape, (Shape{256, 60}));
  EXPECT_EQ(entry(model, "4.weight").shape, (Shape{7, 128}));
  EXPECT_EQ(entry(model, "4.bias").shape, (Shape{7}));
  EXPECT_EQ(model.num_params(), 60u * 256 + 256 + 256 * 128 + 128 + 128 * 7 + 7);
}

TEST(Model, AnUnknownNameIsAnInvalidArgument) {
  for (const std::string name : {"resnet", "", "MLP"}) {
    auto built = Model::build(name, kMnist, kClasses);
    EXPECT_FALSE(built.ok()) << name;
    EXPECT_EQ(built.status().code(), StatusCode::invalid_argument) << name;
  }
}

TEST(Model, KnownModelsCanAllBeBuilt) {
  ASSERT_FALSE(known_models().empty());
  for (const std::string& name : known_models()) {
    auto built = Model::build(name, kMnist, kClasses);
    EXPECT_TRUE(built.ok()) << name << ": " << built.status().to_string();
  }
}

TEST(Model, InitParamsIsBitwiseReproduciblePerSeed) {
  auto a = Model::build("mlp", kMnist, kClasses);
  auto b = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(a.ok() && b.ok());
  a->init_params(123);
  b->init_params(123);
  EXPECT_TRUE(bitwise_equal(a->params(), b->params()));
  for (std::uint64_t other : {0u, 122u, 124u}) {
    b->init_params(other);
    EXPECT_FALSE(bitwise_equal(a->params(), b->params())) << "seed " << other;
  }
  // Re-initialising overwrites everything: back to the first seed's values.
  b->init_params(123);
  EXPECT_TRUE(bitwise_equal(a->params(), b->params()));
}

TEST(Model, InitParamsGivesZeroBiasesAndHeUniformWeights) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  std::fill(model.params().begin(), model.params().end(), 1.0f);  // something init must overwrite
  model.init_params(7);
  const auto params = std::as_const(model).params();
  for (const ParamEntry& e : model.layout()) {
    SCOPED_TRACE(e.name);
    const auto values = params.subspan(e.offset, e.size);
    if (e.shape.size() == 1) {
      EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
      continue;
    }
    const double fan_in = static_cast<double>(e.shape[1]);
    const double bound = std::sqrt(6.0 / fan_in);
    double sum = 0.0, sum_sq = 0.0, largest = 0.0;
    for (float v : values) {
      ASSERT_LE(std::abs(v), bound * (1.0 + 1e-6));
      sum += v;
      sum_sq += static_cast<double>(v) * v;
      largest = std::max(largest, std::abs(static_cast<double>(v)));
    }
    const double n = static_cast<double>(values.size());
    // U(-b, b) has mean 0 and variance b^2 / 3, and fills the interval.
    EXPECT_NEAR(sum / n, 0.0, 0.05 * bound);
    EXPECT_NEAR(sum_sq / n, bound * bound / 3.0, 0.1 * bound * bound / 3.0);
    EXPECT_GT(largest, 0.9 * bound);
  }
}

// ---- finite differences over the whole model -------------------------------

// The mlp's hidden pre-activations, h1 = W1 x + b1 (B, 256) and
// h2 = W2 relu(h1) + b2 (B, 128), in double: used only to tell which
// parameters sit next to a ReLU kink, where central differences are wrong.
struct Preactivations {
  std::vector<double> h1, h2;
};

Preactivations mlp_preactivations(const Model& model, const Batch& batch) {
  const auto p = model.params();
  const ParamEntry &w1 = entry(model, "0.weight"), &b1 = entry(model, "0.bias");
  const ParamEntry &w2 = entry(model, "2.weight"), &b2 = entry(model, "2.bias");
  const std::size_t n = batch.y.size(), h1n = w1.shape[0], in = w1.shape[1], h2n = w2.shape[0];
  Preactivations out{std::vector<double>(n * h1n), std::vector<double>(n * h2n)};
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t u = 0; u < h1n; ++u) {
      double s = p[b1.offset + u];
      for (std::size_t j = 0; j < in; ++j)
        s += static_cast<double>(p[w1.offset + u * in + j]) * batch.x[r * in + j];
      out.h1[r * h1n + u] = s;
    }
    for (std::size_t v = 0; v < h2n; ++v) {
      double s = p[b2.offset + v];
      for (std::size_t u = 0; u < h1n; ++u)
        s += static_cast<double>(p[w2.offset + v * h1n + u]) * std::max(0.0, out.h1[r * h1n + u]);
      out.h2[r * h2n + v] = s;
    }
  }
  return out;
}

// Whether moving parameter `index` by up to `step` could move any hidden
// pre-activation across zero (with a factor-2 margin).
bool near_a_kink(const Model& model, const Batch& batch, const Preactivations& pre, std::size_t index,
                 double step) {
  const auto p = model.params();
  const ParamEntry &w1 = entry(model, "0.weight"), &b1 = entry(model, "0.bias");
  const ParamEntry &w2 = entry(model, "2.weight"), &b2 = entry(model, "2.bias");
  const std::size_t n = batch.y.size(), h1n = w1.shape[0], in = w1.shape[1], h2n = w2.shape[0];
  const double margin = 2.0 * step;
  for (std::size_t r = 0; r < n; ++r) {
    // How far a hidden unit u of layer 1 can move, then its effect on layer 2.
    auto layer1 = [&](std::size_t u, double scale) {
      const double move = margin * scale;
      if (std::abs(pre.h1[r * h1n + u]) <= move) return true;
      if (pre.h1[r * h1n + u] < 0.0) return false;  // stays off: layer 2 sees no change
      for (std::size_t v = 0; v < h2n; ++v)
        if (std::abs(pre.h2[r * h2n + v]) <= move * std::abs(p[w2.offset + v * h1n + u])) return true;
      return false;
    };
    if (index >= w1.offset && index < w1.offset + w1.size) {
      const std::size_t u = (index - w1.offset) / in, j = (index - w1.offset) % in;
      if (layer1(u, std::abs(batch.x[r * in + j]))) return true;
    } else if (index >= b1.offset && index < b1.offset + b1.size) {
      if (layer1(index - b1.offset, 1.0)) return true;
    } else if (index >= w2.offset && index < w2.offset + w2.size) {
      const std::size_t v = (index - w2.offset) / h1n, u = (index - w2.offset) % h1n;
      if (std::abs(pre.h2[r * h2n + v]) <= margin * std::max(0.0, pre.h1[r * h1n + u])) return true;
    } else if (index >= b2.offset && index < b2.offset + b2.size) {
      if (std::abs(pre.h2[r * h2n + index - b2.offset]) <= margin) return true;
    }
  }
  return false;
}

TEST(Model, ComputeGradientsMatchesFiniteDifferences) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(1);
  Rng rng(2);
  const Batch batch = random_batch(rng, 4);
  model.compute_gradients(batch.x, batch.y);
  const std::vector<float> analytic(model.grads().begin(), model.grads().end());
  const Preactivations pre = mlp_preactivations(model, batch);

  // The loss comes back as float32 (~2.4e-7 resolution at 2.3), so the
  // numeric gradient carries ~6e-5 of rounding at this step; kAbsTol is
  // three times that. Gradients here are up to ~0.3.
  constexpr float kStep = 2e-3f;
  constexpr double kAbsTol = 2e-4, kRelTol = 1e-2;
  constexpr int kPerTensor = 50;  // 300 indices in all
  int checked = 0, excused = 0, sizeable = 0;
  for (const ParamEntry& e : model.layout()) {
    for (int k = 0; k < kPerTensor; ++k) {
      const std::size_t i = e.offset + rng.below(e.size);
      const float saved = model.params()[i];
      const float up = saved + kStep, down = saved - kStep;
      model.params()[i] = up;
      const double loss_up = model.compute_gradients(batch.x, batch.y);
      model.params()[i] = down;
      const double loss_down = model.compute_gradients(batch.x, batch.y);
      model.params()[i] = saved;
      const double numeric = (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
      ++checked;
      sizeable += std::abs(numeric) > 10 * kAbsTol;
      const double tolerance = kAbsTol + kRelTol * std::abs(numeric);
      if (std::abs(analytic[i] - numeric) <= tolerance) continue;
      // A step that moves some ReLU input across zero averages two slopes:
      // the difference quotient is wrong there, not the gradient.
      if (near_a_kink(model, batch, pre, i, kStep)) {
        ++excused;
        continue;
      }
      ADD_FAILURE() << e.name << " at flat index " << i << ": analytic " << analytic[i] << ", numeric "
                    << numeric << ", tolerance " << tolerance;
    }
  }
  // The check means something only if few mismatches were put down to kinks
  // and many gradients stand well above the absolute tolerance.
  EXPECT_LE(excused, checked / 5) << excused << " of " << checked << " mismatches next to a ReLU kink";
  EXPECT_GT(sizeable, checked / 4) << sizeable << " of " << checked << " gradients above " << 10 * kAbsTol;
}

// ---- buffer swaps -----------------------------------------------------------

TEST(Model, SwappingInAnIdenticalParameterCopyGivesIdenticalResults) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(3);
  Rng rng(4);
  const Batch batch = random_batch(rng, 8);
  const float loss = model.compute_gradients(batch.x, batch.y);
  const std::vector<float> grads(model.grads().begin(), model.grads().end());

  std::vector<float> storage(model.params().begin(), model.params().end());
  const float* incoming = storage.data();
  model.swap_params(storage);
  EXPECT_EQ(model.params().data(), incoming);  // a swap, not a copy
  EXPECT_EQ(model.compute_gradients(batch.x, batch.y), loss);
  EXPECT_TRUE(bitwise_equal(model.grads(), grads));
}

TEST(Model, SwappedInParametersAreTheOnesUsed) {
  // Layers must be rebound: with every parameter zero the logits are zero
  // and the loss is log(10), whatever the old parameters were.
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(5);
  Rng rng(6);
  const Batch batch = random_batch(rng, 8);
  const float before = model.compute_gradients(batch.x, batch.y);
  std::vector<float> zeros(model.num_params(), 0.0f);
  model.swap_params(zeros);
  EXPECT_NEAR(model.compute_gradients(batch.x, batch.y), std::log(10.0), 1e-6);
  // And swapping back restores the original behaviour.
  model.swap_params(zeros);
  EXPECT_EQ(model.compute_gradients(batch.x, batch.y), before);
}

TEST(Model, SwappedInGradientStorageReceivesTheGradients) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(7);
  Rng rng(8);
  const Batch batch = random_batch(rng, 8);
  const float loss = model.compute_gradients(batch.x, batch.y);
  const std::vector<float> grads(model.grads().begin(), model.grads().end());

  std::vector<float> storage(model.num_params(), std::numeric_limits<float>::quiet_NaN());
  const float* incoming = storage.data();
  model.swap_grads(storage);
  EXPECT_EQ(model.grads().data(), incoming);
  // The old gradient buffer came back out untouched.
  EXPECT_TRUE(bitwise_equal(storage, grads));
  std::fill(storage.begin(), storage.end(), -1.0f);
  EXPECT_EQ(model.compute_gradients(batch.x, batch.y), loss);
  EXPECT_TRUE(bitwise_equal(model.grads(), grads));
  // Nothing was written to the buffer the model no longer owns.
  EXPECT_TRUE(std::all_of(storage.begin(), storage.end(), [](float v) { return v == -1.0f; }));
}

// ---- evaluate -------------------------------------------------------------

TEST(Model, EvaluateMatchesComputeGradientsOnOneChunk) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(9);
  Rng rng(10);
  const Batch batch = random_batch(rng, 7);
  const EvalResult r = model.evaluate(batch.x, batch.y);
  EXPECT_EQ(r.samples, 7u);
  EXPECT_GE(r.accuracy, 0.0);
  EXPECT_LE(r.accuracy, 1.0);
  // Accuracy is a count of 7: a multiple of 1/7.
  EXPECT_NEAR(r.accuracy * 7.0, std::round(r.accuracy * 7.0), 1e-9);
  const float loss = model.compute_gradients(batch.x, batch.y);
  EXPECT_NEAR(r.loss, loss, 1e-6 * loss);
}

TEST(Model, EvaluateInSmallChunksGivesTheSameResultAsOneChunk) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(11);
  Rng rng(12);
  const Batch batch = random_batch(rng, 10);
  const EvalResult whole = model.evaluate(batch.x, batch.y);
  const EvalResult chunked = model.evaluate(batch.x, batch.y, 3);  // 3 + 3 + 3 + 1
  EXPECT_EQ(chunked.samples, whole.samples);
  EXPECT_NEAR(chunked.loss, whole.loss, 1e-5 * whole.loss);
  EXPECT_EQ(chunked.accuracy, whole.accuracy);
}

// evaluate_from: what the coordinator evaluates a dataset held as bytes with: the samples
// written chunk by chunk, asked for in order, never past the end.
TEST(Model, EvaluateOverSamplesWrittenAChunkAtATimeIsTheSameBitForBit) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(13);
  Rng rng(14);
  const Batch batch = random_batch(rng, 10);
  const std::size_t per_sample = batch.x.size() / batch.y.size();
  std::vector<std::pair<std::size_t, std::size_t>> asked;
  const Model::SampleFill fill = [&](std::size_t first, std::size_t n, float* out) {
    asked.emplace_back(first, n);
    ASSERT_LE((first + n) * per_sample, batch.x.size());
    std::copy_n(batch.x.data() + first * per_sample, n * per_sample, out);
  };
  for (std::size_t chunk : {std::size_t{0}, std::size_t{4}}) {
    asked.clear();
    const EvalResult from_span = model.evaluate(batch.x, batch.y, chunk);
    const EvalResult filled = model.evaluate_from(fill, batch.y, chunk);
    EXPECT_EQ(filled.samples, from_span.samples);
    EXPECT_EQ(filled.loss, from_span.loss) << "chunk " << chunk;
    EXPECT_EQ(filled.accuracy, from_span.accuracy) << "chunk " << chunk;
    using Asked = std::vector<std::pair<std::size_t, std::size_t>>;
    EXPECT_EQ(asked, (chunk == 0 ? Asked{{0, 10}} : Asked{{0, 4}, {4, 4}, {8, 2}}));
  }
}

TEST(Model, EvaluateOnNoSamplesReportsZeroSamples) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  const EvalResult r = built->evaluate({}, {});
  EXPECT_EQ(r.samples, 0u);
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_EQ(r.accuracy, 0.0);
}

// ---- training -------------------------------------------------------------

// Ten Gaussian blobs in 784 dimensions: class c is centre c plus unit noise.
// Centres ~ N(0, 0.5^2) per coordinate lie ~20 apart, ten noise standard
// deviations along the line between two of them, so the classes are
// separable; yet 50 steps are not enough to reach 0.95, 200 are.
struct Blobs {
  explicit Blobs(std::uint64_t seed) : rng(seed), centres(kClasses * kPixels) {
    for (float& c : centres) c = 0.5f * rng.normal();
  }
  Batch sample(std::size_t n) {
    Batch b{std::vector<float>(n * kPixels), std::vector<std::int32_t>(n)};
    for (std::size_t r = 0; r < n; ++r) {
      const std::size_t c = rng.below(kClasses);
      b.y[r] = static_cast<std::int32_t>(c);
      for (std::size_t j = 0; j < kPixels; ++j)
        b.x[r * kPixels + j] = centres[c * kPixels + j] + rng.normal();
    }
    return b;
  }
  Rng rng;
  std::vector<float> centres;  // (10, 784)
};

TEST(Model, TwoHundredSgdStepsLearnSeparableBlobs) {
  auto built = Model::build("mlp", kMnist, kClasses);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(13);
  OptimizerConfig config;
  config.kind = "sgd";
  config.lr = 0.01f;
  auto made = make_optimizer(config, model.num_params());
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Optimizer& opt = *made.value();

  Blobs blobs(14);
  const Batch held_out = blobs.sample(500);
  const EvalResult before = model.evaluate(held_out.x, held_out.y);
  EXPECT_LT(before.accuracy, 0.5);  // so that passing below is the training's doing

  constexpr std::size_t kBatch = 16;
  for (int step = 0; step < 200; ++step) {
    const Batch b = blobs.sample(kBatch);
    const float loss = model.compute_gradients(b.x, b.y);
    ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
    opt.step(model.params(), model.grads());
  }
  const EvalResult after = model.evaluate(held_out.x, held_out.y);
  EXPECT_GT(after.accuracy, 0.95);
  EXPECT_LT(after.loss, 0.2);  // ~0.05 observed; above 3 before training
}

}  // namespace
}  // namespace asgd
