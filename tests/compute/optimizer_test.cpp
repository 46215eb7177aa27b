#include "compute/optimizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/random.hpp"

namespace asgd {
namespace {

using Vec3 = std::array<float, 3>;

// The three gradients every hand-computed test below feeds in, and the
// parameters it starts from.
constexpr Vec3 kStart = {1.0f, -2.0f, 0.5f};
constexpr std::array<Vec3, 3> kGrads = {{{0.5f, -1.0f, 2.0f}, {0.25f, 0.5f, -1.0f}, {-1.0f, 0.0f, 0.5f}}};

// Float arithmetic on values of order 1: a few ulps.
constexpr float kTol = 1e-6f;

std::unique_ptr<Optimizer> make(const OptimizerConfig& config, std::size_t size) {
  auto made = make_optimizer(config, size);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

// Runs three steps from kStart with kGrads and checks the parameters after
// each one against `expected`.
void expect_three_steps(const OptimizerConfig& config, const std::array<Vec3, 3>& expected) {
  auto opt = make(config, 3);
  ASSERT_NE(opt, nullptr);
  Vec3 p = kStart;
  for (std::size_t s = 0; s < 3; ++s) {
    opt->step(p, kGrads[s]);
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(p[i], expected[s][i], kTol) << "step " << s + 1 << ", index " << i;
  }
}

OptimizerConfig config(std::string kind, float lr, float momentum = 0.9f, float weight_decay = 0.0f) {
  OptimizerConfig c;
  c.kind = std::move(kind);
  c.lr = lr;
  c.momentum = momentum;
  c.weight_decay = weight_decay;
  return c;
}

std::vector<float> random_vector(Rng& rng, std::size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal();
  return v;
}

TEST(OptimizerSgd, MatchesHandComputedStepsWithoutWeightDecay) {
  // p -= 0.1 * g
  expect_three_steps(config("sgd", 0.1f),
                     {{{0.95f, -1.9f, 0.3f}, {0.925f, -1.95f, 0.4f}, {1.025f, -1.95f, 0.35f}}});
}

TEST(OptimizerSgd, MatchesHandComputedStepsWithWeightDecay) {
  // p -= 0.1 * (g + 0.1 * p)
  expect_three_steps(config("sgd", 0.1f, 0.9f, 0.1f), {{{0.94f, -1.88f, 0.295f},
                                                        {0.9056f, -1.9112f, 0.39205f},
                                                        {0.996544f, -1.892088f, 0.3381295f}}});
}

TEST(OptimizerMomentum, MatchesHandComputedStepsInPyTorchsConvention) {
  // v = 0.9 v + g; p -= 0.1 v. Step 2: v = (0.7, -0.4, 0.8); step 3:
  // v = (-0.37, -0.36, 1.22).
  expect_three_steps(config("momentum", 0.1f, 0.9f),
                     {{{0.95f, -1.9f, 0.3f}, {0.88f, -1.86f, 0.22f}, {0.917f, -1.824f, 0.098f}}});
}

TEST(OptimizerMomentum, AddsWeightDecayToTheGradientBeforeTheVelocity) {
  // g' = g + 0.1 p; v = 0.9 v + g'; p -= 0.1 v. Step 2: v = (0.884, -0.768,
  // 0.8745); step 3: v = (-0.11924, -0.87152, 1.307805).
  expect_three_steps(config("momentum", 0.1f, 0.9f, 0.1f), {{{0.94f, -1.88f, 0.295f},
                                                             {0.8516f, -1.8032f, 0.20755f},
                                                             {0.863524f, -1.716048f, 0.0767695f}}});
}

TEST(OptimizerMomentum, WithZeroMomentumEqualsSgd) {
  auto momentum = make(config("momentum", 0.1f, 0.0f), 3);
  auto sgd = make(config("sgd", 0.1f), 3);
  ASSERT_NE(momentum, nullptr);
  ASSERT_NE(sgd, nullptr);
  Vec3 a = kStart, b = kStart;
  for (const Vec3& g : kGrads) {
    momentum->step(a, g);
    sgd->step(b, g);
  }
  EXPECT_EQ(a, b);
}

TEST(OptimizerMomentum, KeepsItsVelocityPerInstance) {
  // A second optimizer starts from zero velocity, whatever the first has seen.
  auto first = make(config("momentum", 0.1f), 3);
  ASSERT_NE(first, nullptr);
  Vec3 p = kStart;
  first->step(p, kGrads[0]);
  first->step(p, kGrads[1]);
  auto second = make(config("momentum", 0.1f), 3);
  ASSERT_NE(second, nullptr);
  Vec3 q = kStart;
  second->step(q, kGrads[0]);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(q[i], kStart[i] - 0.1f * kGrads[0][i], kTol);
}

TEST(Optimizer, LrScaleScalesTheStep) {
  for (const std::string kind : {"sgd", "momentum"}) {
    SCOPED_TRACE(kind);
    auto opt = make(config(kind, 0.1f, 0.9f), 3);
    ASSERT_NE(opt, nullptr);
    Vec3 p = kStart;
    opt->step(p, kGrads[0], 0.5f);
    // First step: v = g for both kinds, so p = p0 - 0.05 g.
    for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(p[i], kStart[i] - 0.05f * kGrads[0][i], kTol);
    const Vec3 before = p;
    opt->step(p, kGrads[1], 2.0f);
    // The scale touches the step only: momentum's velocity still sums raw
    // gradients, v = 0.9 g1 + g2.
    for (std::size_t i = 0; i < 3; ++i) {
      const float v = kind == "sgd" ? kGrads[1][i] : 0.9f * kGrads[0][i] + kGrads[1][i];
      EXPECT_NEAR(p[i], before[i] - 0.2f * v, kTol) << "index " << i;
    }
  }
}

TEST(Optimizer, ZeroLrScaleLeavesParametersUnchanged) {
  for (const std::string kind : {"sgd", "momentum"}) {
    SCOPED_TRACE(kind);
    auto opt = make(config(kind, 0.1f, 0.9f, 0.1f), 3);
    ASSERT_NE(opt, nullptr);
    Vec3 p = kStart;
    opt->step(p, kGrads[0], 0.0f);
    EXPECT_EQ(p, kStart);
  }
}

TEST(Optimizer, CopyReceivesExactlyTheUpdatedParameters) {
  // 37 is not a multiple of any vector width, so remainder loops run too.
  constexpr std::size_t kSize = 37;
  for (const std::string kind : {"sgd", "momentum"}) {
    SCOPED_TRACE(kind);
    Rng rng(1);
    auto plain = make(config(kind, 0.05f, 0.9f, 0.01f), kSize);
    auto copying = make(config(kind, 0.05f, 0.9f, 0.01f), kSize);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(copying, nullptr);
    std::vector<float> p = random_vector(rng, kSize);
    std::vector<float> q = p;
    std::vector<float> copy(kSize, std::numeric_limits<float>::quiet_NaN());
    for (int s = 0; s < 3; ++s) {
      const std::vector<float> g = random_vector(rng, kSize);
      plain->step(p, g);
      copying->step(q, g, 1.0f, copy);
      EXPECT_EQ(q, p) << "step " << s;     // writing a copy changes nothing else
      EXPECT_EQ(copy, q) << "step " << s;  // and the copy is the result, bit for bit
    }
  }
}

TEST(Optimizer, CopyMayAliasTheGradients) {
  // A shard reuses its gradient buffer for the reply: grads and copy are
  // then the same memory, and each gradient must be read before it is
  // overwritten.
  constexpr std::size_t kSize = 37;
  for (const std::string kind : {"sgd", "momentum"}) {
    SCOPED_TRACE(kind);
    Rng rng(2);
    auto plain = make(config(kind, 0.05f, 0.9f, 0.01f), kSize);
    auto aliased = make(config(kind, 0.05f, 0.9f, 0.01f), kSize);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(aliased, nullptr);
    std::vector<float> p = random_vector(rng, kSize);
    std::vector<float> q = p;
    for (int s = 0; s < 3; ++s) {
      const std::vector<float> g = random_vector(rng, kSize);
      std::vector<float> buffer = g;
      plain->step(p, g);
      aliased->step(q, buffer, 1.0f, buffer);
      EXPECT_EQ(q, p) << "step " << s;
      EXPECT_EQ(buffer, q) << "step " << s;
    }
  }
}

TEST(Optimizer, InvalidConfigsAreRejected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::string, OptimizerConfig>> cases = {
      {"zero lr", config("sgd", 0.0f)},
      {"negative lr", config("momentum", -0.1f)},
      {"NaN lr", config("sgd", nan)},
      {"infinite lr", config("momentum", inf)},
      {"momentum 1", config("momentum", 0.1f, 1.0f)},
      {"negative momentum", config("momentum", 0.1f, -0.1f)},
      {"NaN momentum", config("momentum", 0.1f, nan)},
      {"negative weight decay", config("sgd", 0.1f, 0.9f, -0.01f)},
      {"NaN weight decay", config("momentum", 0.1f, 0.9f, nan)},
      {"unknown kind", config("rmsprop", 0.1f)},
      {"empty kind", config("", 0.1f)},
  };
  for (const auto& [what, c] : cases) {
    auto made = make_optimizer(c, 3);
    EXPECT_FALSE(made.ok()) << what;
    EXPECT_EQ(made.status().code(), StatusCode::invalid_argument) << what;
  }
}

TEST(Optimizer, DefaultConfigIsValid) {
  auto made = make_optimizer(OptimizerConfig{}, 3);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
}

TEST(Optimizer, KnownOptimizersListsAllFourAndEachCanBeMade) {
  const auto& names = known_optimizers();
  for (const char* want : {"sgd", "momentum", "adagrad", "adam"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const std::string& name : names) {
    auto made = make_optimizer(config(name, 0.1f), 3);
    EXPECT_TRUE(made.ok()) << name << ": " << made.status().to_string();
  }
}

// Expected values from torch.optim.Adagrad / torch.optim.Adam (float64,
// lr 0.1), the same three gradients, with and without weight decay.
struct TorchCase {
  const char* kind;
  float weight_decay;
  std::vector<float> expected;
};

TEST(Optimizer, AdagradAndAdamMatchTorchOptimOverThreeSteps) {
  const std::vector<std::vector<float>> grads = {{0.5f, -1.0f}, {0.1f, 0.3f}, {-0.2f, 0.05f}};
  const std::vector<TorchCase> cases = {
      {"adagrad", 0.0f, {0.916903224f, -1.933518437f}},
      {"adagrad", 0.01f, {0.913522677f, -1.929463314f}},
      {"adam", 0.0f, {0.785260532f, -1.827239043f}},
      {"adam", 0.01f, {0.782165847f, -1.822442349f}},
  };
  for (const auto& c : cases) {
    auto opt = make_optimizer(config(c.kind, 0.1f, 0.9f, c.weight_decay), 2);
    ASSERT_TRUE(opt.ok()) << c.kind;
    std::vector<float> p = {1.0f, -2.0f};
    for (const auto& g : grads) (*opt)->step(p, g);
    EXPECT_NEAR(p[0], c.expected[0], 2e-6) << c.kind << " wd " << c.weight_decay;
    EXPECT_NEAR(p[1], c.expected[1], 2e-6) << c.kind << " wd " << c.weight_decay;
  }
}

TEST(Optimizer, AdagradAndAdamWriteTheUpdatedParametersIntoAnAliasedCopy) {
  for (const char* kind : {"adagrad", "adam"}) {
    auto a = make_optimizer(config(kind, 0.1f), 3);
    auto b = make_optimizer(config(kind, 0.1f), 3);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<float> pa = {1.0f, 2.0f, 3.0f}, pb = pa;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = {0.3f, -0.2f, 0.1f * static_cast<float>(step)};
      (*a)->step(pa, g);
      (*b)->step(pb, g, 1.0f, g);  // the shard's use: the gradient buffer becomes the reply
      EXPECT_EQ(pa, pb) << kind;
      EXPECT_EQ(g, pb) << kind;
    }
  }
}

}  // namespace
}  // namespace asgd
