#include "asgd/predictor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "compute/model.hpp"
#include "actors/checkpoint.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

constexpr std::size_t kPixels = 28 * 28;

// mlp parameters that make its answer readable: hidden units 0..9 copy
// (normalised, then ReLU'd) pixels 0..9 through both hidden layers, so the
// predicted class is the brightest of the first ten pixels.
std::vector<float> brightest_pixel_mlp() {
  auto model = Model::build("mlp", {1, 28, 28}, 10);
  EXPECT_TRUE(model.ok());
  std::vector<float> params(model->num_params(), 0.0f);
  for (const ParamEntry& e : model->layout()) {
    if (!e.name.ends_with(".weight")) continue;
    const std::size_t in = e.shape.at(1);  // W is (out, in)
    for (std::size_t j = 0; j < 10; ++j) params[e.offset + j * in + j] = 1.0f;
  }
  return params;
}

std::vector<float> random_pixels(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(n * kPixels);
  for (float& v : x) v = u(rng);
  return x;
}

TEST(Predictor, AnMlpWhoseWeightsPickTheBrightestPixelPredictsIt) {
  const auto params = brightest_pixel_mlp();
  // mean 0.5: only pixels brighter than 0.5 stay positive after the ReLU.
  auto p = Predictor::from_params("mlp", {1, 28, 28}, 10, params, 0.5f, 0.25f);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->model(), "mlp");
  EXPECT_EQ(p->classes(), 10u);
  EXPECT_EQ(p->sample_size(), kPixels);

  std::vector<float> x(3 * kPixels, 0.0f);
  x[0 * kPixels + 7] = 1.0f;
  x[1 * kPixels + 2] = 0.9f;
  x[1 * kPixels + 4] = 0.8f;
  x[2 * kPixels + 9] = 0.6f;
  x[2 * kPixels + 200] = 1.0f;  // beyond the first ten: ignored
  auto classes = p->predict(x);
  ASSERT_TRUE(classes.ok()) << classes.status().to_string();
  EXPECT_EQ(*classes, (std::vector<int>{7, 2, 9}));
}

TEST(Predictor, NormalisesRawPixelsWithTheTrainingStatistics) {
  const auto params = brightest_pixel_mlp();
  std::vector<float> x(kPixels, 0.0f);
  x[3] = 0.4f;
  x[6] = 0.3f;
  // Unnormalised, pixel 3 wins; with mean 0.35 only pixel 3 is above it.
  auto plain = Predictor::from_params("mlp", {1, 28, 28}, 10, params);
  auto shifted = Predictor::from_params("mlp", {1, 28, 28}, 10, params, 0.35f, 1.0f);
  ASSERT_TRUE(plain.ok() && shifted.ok());
  EXPECT_EQ(plain->predict(x).value(), std::vector<int>{3});
  EXPECT_EQ(shifted->predict(x).value(), std::vector<int>{3});
  // With mean 0.45 nothing survives the ReLU: every score ties at 0 and the
  // first class wins, which shows the shift was applied.
  auto dark = Predictor::from_params("mlp", {1, 28, 28}, 10, params, 0.45f, 1.0f);
  ASSERT_TRUE(dark.ok());
  EXPECT_EQ(dark->predict(x).value(), std::vector<int>{0});
}

TEST(Predictor, FromACheckpointAgreesWithTheModelThatWroteIt) {
  const asgd_test::TempDir dir;
  auto model = Model::build("resnet-mini", {1, 28, 28}, 10);
  ASSERT_TRUE(model.ok());
  model->init_params(11);
  // Non-trivial BatchNorm statistics, which the predictor must carry over.
  for (const LayerBuffer& b : model->buffers())
    for (std::size_t i = 0; i < b.values.size(); ++i)
      b.values[i] = b.name.ends_with("running_var") ? 0.5f + 0.01f * static_cast<float>(i % 7)
                                                     : 0.1f * static_cast<float>(i % 5);
  Checkpoint c = Checkpoint::of(*model);
  c.sample_shape = {1, 28, 28};
  c.classes = 10;
  c.dataset = "mnist";
  c.input_mean = {0.1307f};
  c.input_stddev = {0.3081f};
  ASSERT_TRUE(write_checkpoint(dir.path().string(), c).ok());

  auto p = Predictor::from_checkpoint(dir.path().string());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->model(), "resnet-mini");
  const std::size_t n = 8;
  const auto x = random_pixels(n, 5);
  auto classes = p->predict(x);
  ASSERT_TRUE(classes.ok()) << classes.status().to_string();
  ASSERT_EQ(classes->size(), n);

  // The model itself, fed the same inputs normalised by hand, scores every
  // predicted class as its argmax.
  std::vector<float> normalised(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) normalised[i] = (x[i] - c.input_mean[0]) / c.input_stddev[0];
  std::vector<std::int32_t> labels(classes->begin(), classes->end());
  EXPECT_DOUBLE_EQ(model->evaluate(normalised, labels).accuracy, 1.0);
}

TEST(Predictor, IsMovable) {
  const auto params = brightest_pixel_mlp();
  auto p = Predictor::from_params("mlp", {1, 28, 28}, 10, params);
  ASSERT_TRUE(p.ok());
  Predictor moved = std::move(p).value();
  std::vector<float> x(kPixels, 0.0f);
  x[5] = 1.0f;
  EXPECT_EQ(moved.predict(x).value(), std::vector<int>{5});
  // The one moved from answers, emptily (it crashed: SIGSEGV).
  Predictor again = std::move(moved);
  EXPECT_EQ(moved.predict(x).status().message(), "this Predictor was moved from: use the one it was moved to");
  EXPECT_EQ(moved.model(), "");
  EXPECT_EQ(moved.classes(), 0u);
  EXPECT_EQ(moved.sample_size(), 0u);
  EXPECT_TRUE(moved.sample_shape().empty());
  EXPECT_EQ(again.predict(x).value(), std::vector<int>{5});
}

TEST(Predictor, RejectsSamplesThatAreNotAWholeNumberOfImages) {
  auto p = Predictor::from_params("mlp", {1, 28, 28}, 10, brightest_pixel_mlp());
  ASSERT_TRUE(p.ok());
  auto r = p->predict(std::vector<float>(kPixels + 1, 0.0f));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(p->predict({}).value().empty());
  std::vector<float> nan(kPixels, 0.0f);
  nan[3] = std::nanf("");
  EXPECT_EQ(p->predict(nan).status().code(), StatusCode::invalid_argument);
}

TEST(Predictor, RejectsParametersThatDoNotFitTheModel) {
  const auto params = brightest_pixel_mlp();
  EXPECT_EQ(Predictor::from_params("mlp", {1, 28, 28}, 10, std::span(params).first(100)).status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(Predictor::from_params("transformer", {1, 28, 28}, 10, params).status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(Predictor::from_params("mlp", {784}, 10, params).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(Predictor::from_params("mlp", {1, 28, 28}, 10, params, 0.0f, 0.0f).status().code(),
            StatusCode::invalid_argument);
  // A NaN mean made every prediction one class, silently; a NaN parameter
  // the same; a shape whose size wraps around to 0 was called "a zero
  // dimension".
  EXPECT_EQ(Predictor::from_params("mlp", {1, 28, 28}, 10, params, std::nanf(""), 1.0f).status().message(),
            "input mean must be a finite number, got nan");
  std::vector<float> diverged = params;
  diverged[7] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Predictor::from_params("mlp", {1, 28, 28}, 10, diverged).status().message(),
            "parameter 7 of mlp is not finite (NaN or infinity): the training it came from diverged?");
  EXPECT_EQ(Predictor::from_params("mlp", {std::size_t{1} << 62, 4, 4}, 10, params).status().message(),
            "sample shape (4611686018427387904, 4, 4) has more than 2147483648 values per sample");
}

TEST(Predictor, ReportsAMissingCheckpointAsNotFound) {
  const asgd_test::TempDir dir;
  const auto r = Predictor::from_checkpoint((dir.path() / "nothing-here").string());
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
}

}  // namespace
}  // namespace asgd
