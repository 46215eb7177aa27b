// The elementwise activations beyond ReLU: gradients against central
// differences, values against the formula in double, and their place in
// model specs (built, and the same after a JSON round trip).

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "asgd/model_spec.hpp"
#include "compute/layers/leaky_relu.hpp"
#include "compute/layers/sigmoid.hpp"
#include "compute/layers/tanh.hpp"
#include "compute/model.hpp"
#include "base/random.hpp"
#include "compute/tensor.hpp"
#include "gradcheck.hpp"

namespace asgd {
namespace {

using namespace gradcheck;

// Backpropagates a random dL/dy through `layer` on x (4, 3, 5) in [-3, 3]
// and compares dx with central differences of sum(y * r).
void expect_gradients_match(Layer& layer, std::uint64_t seed, double tol) {
  Rng rng(seed);
  Tensor x = uniform_tensor(rng, {4, 3, 5}, -3.0f, 3.0f);
  const Tensor r = normal_tensor(rng, x.shape());
  Tensor y, dx, scratch;
  layer.forward(view(x), y);
  ASSERT_EQ(y.shape(), x.shape());
  layer.backward(view(x), y, r, &dx);
  ASSERT_EQ(dx.shape(), x.shape());
  auto loss = [&] {
    layer.forward(view(x), scratch);
    return probe_loss(scratch, r);
  };
  const std::vector<double> numeric = central_differences(x.span(), loss, 1e-3f);
  EXPECT_GT(max_abs(numeric), 0.1) << "a vacuous check";
  EXPECT_LT(max_scaled_error(dx.span(), numeric), tol);
}

// y against f in double, elementwise.
void expect_values(Layer& layer, const std::function<double(double)>& f) {
  Rng rng(1);
  const Tensor x = uniform_tensor(rng, {2, 50}, -20.0f, 20.0f);
  Tensor y;
  layer.forward(view(x), y);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], f(x[i]), 1e-6) << "x = " << x[i];
}

// The spec builds a model and comes back from its JSON form unchanged.
void expect_spec_round_trip(const ModelSpec& spec, const std::string& kind) {
  auto model = Model::build(spec, {1, 4, 4}, 3);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::string json = spec.to_json();
  EXPECT_NE(json.find("\"kind\":\"" + kind + "\""), std::string::npos) << json;
  auto back = ModelSpec::from_json(json);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->to_json(), json);
  ASSERT_EQ(back->layers().size(), spec.layers().size());
  EXPECT_EQ(back->layers()[1].kind, spec.layers()[1].kind);
}

// ---- Tanh -------------------------------------------------------------------

TEST(Tanh, ForwardIsTheHyperbolicTangent) {
  Tanh tanh_layer;
  expect_values(tanh_layer, [](double x) { return std::tanh(x); });
}

TEST(Tanh, GradientsMatchFiniteDifferences) {
  Tanh tanh_layer;
  expect_gradients_match(tanh_layer, 2, 1e-3);
}

TEST(Tanh, AModelSpecNamesIt) {
  expect_spec_round_trip(ModelSpec("t").dense(8).tanh().dense(3), "tanh");
}

// ---- Sigmoid ----------------------------------------------------------------

TEST(Sigmoid, ForwardIsTheLogisticFunctionAndStaysFiniteFarOut) {
  Sigmoid sigmoid;
  expect_values(sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
  Tensor far({1, 2});
  far[0] = -200.0f;
  far[1] = 200.0f;
  Tensor y;
  sigmoid.forward(view(far), y);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 1.0f);
}

TEST(Sigmoid, GradientsMatchFiniteDifferences) {
  Sigmoid sigmoid;
  expect_gradients_match(sigmoid, 3, 1e-3);
}

TEST(Sigmoid, AModelSpecNamesIt) {
  expect_spec_round_trip(ModelSpec("s").dense(8).sigmoid().dense(3), "sigmoid");
}

// ---- LeakyReLU --------------------------------------------------------------

TEST(LeakyReLU, ForwardScalesNegativesByTheSlopeWhichDefaultsToPyTorchs) {
  LeakyReLU default_slope;
  EXPECT_EQ(default_slope.negative_slope(), 0.01f);
  expect_values(default_slope, [](double x) { return x > 0 ? x : 0.01f * x; });
  LeakyReLU steep(0.2f);
  expect_values(steep, [](double x) { return x > 0 ? x : 0.2f * x; });
}

TEST(LeakyReLU, GradientsMatchFiniteDifferences) {
  // Inputs within the step of zero would straddle the kink: none here.
  for (const float slope : {0.01f, 0.3f, -0.5f}) {
    SCOPED_TRACE(testing::Message() << "slope " << slope);
    LeakyReLU leaky(slope);
    Rng rng(4);
    Tensor x = uniform_tensor(rng, {4, 3, 5}, -3.0f, 3.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = x[i] < 0 ? x[i] - 0.1f : x[i] + 0.1f;
    const Tensor r = normal_tensor(rng, x.shape());
    Tensor y, dx, scratch;
    leaky.forward(view(x), y);
    leaky.backward(view(x), y, r, &dx);
    auto loss = [&] {
      leaky.forward(view(x), scratch);
      return probe_loss(scratch, r);
    };
    const std::vector<double> numeric = central_differences(x.span(), loss, 1e-3f);
    EXPECT_GT(max_abs(numeric), 0.1) << "a vacuous check";
    EXPECT_LT(max_scaled_error(dx.span(), numeric), 1e-3);
  }
}

TEST(LeakyReLU, AModelSpecNamesItWithItsSlope) {
  const ModelSpec spec = ModelSpec("l").dense(8).leaky_relu(0.2).dense(3);
  expect_spec_round_trip(spec, "leaky_relu");
  EXPECT_EQ(ModelSpec::from_json(spec.to_json())->layers()[1].negative_slope, 0.2);
  EXPECT_EQ(ModelSpec().leaky_relu().layers()[0].negative_slope, 0.01);
  EXPECT_FALSE(Model::build(ModelSpec().dense(4).leaky_relu(std::nan("")).dense(3), {1, 4, 4}, 3).ok());
}

}  // namespace
}  // namespace asgd
