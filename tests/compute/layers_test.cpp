#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "compute/layers/dense.hpp"
#include "compute/layers/relu.hpp"
#include "compute/loss.hpp"
#include "base/random.hpp"
#include "compute/tensor.hpp"
#include "gradcheck.hpp"

namespace asgd {
namespace {

using namespace gradcheck;

// A Dense layer with its own parameter and gradient storage; gradients start
// as NaN so that a gradient the layer fails to write shows up.
struct DenseUnderTest {
  DenseUnderTest(std::size_t in, std::size_t out, Rng& rng)
      : layer(in, out), params(out * in + out), grads(params.size(), kNaN) {
    for (float& p : params) p = rng.uniform(-1.0f, 1.0f);
    layer.bind(params, grads);
  }
  std::size_t weight_size() const { return layer.out() * layer.in(); }
  std::span<float> weight() { return std::span(params).first(weight_size()); }
  std::span<float> bias() { return std::span(params).subspan(weight_size()); }
  std::span<const float> dweight() const { return std::span(grads).first(weight_size()); }
  std::span<const float> dbias() const { return std::span(grads).subspan(weight_size()); }

  Dense layer;
  std::vector<float> params;  // W (out, in) then b (out,)
  std::vector<float> grads;   // dW (out, in) then db (out,)
};

// y = x W^T + b in double, the obvious way.
std::vector<double> dense_reference(const Tensor& x, const DenseUnderTest& d) {
  const std::size_t batch = x.dim(0), in = d.layer.in(), out = d.layer.out();
  std::vector<double> y(batch * out);
  for (std::size_t r = 0; r < batch; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double sum = d.params[d.weight_size() + o];
      for (std::size_t i = 0; i < in; ++i)
        sum += static_cast<double>(x[r * in + i]) * static_cast<double>(d.params[o * in + i]);
      y[r * out + o] = sum;
    }
  return y;
}

// dW = dy^T x and db = sum over rows of dy, in double.
void expect_dense_param_grads(const Tensor& x, const Tensor& dy, const DenseUnderTest& d) {
  const std::size_t batch = x.dim(0), in = d.layer.in(), out = d.layer.out();
  for (std::size_t o = 0; o < out; ++o) {
    double db = 0.0;
    for (std::size_t r = 0; r < batch; ++r) db += dy[r * out + o];
    EXPECT_NEAR(d.dbias()[o], db, 1e-5 * std::max(1.0, std::abs(db))) << "db[" << o << "]";
    for (std::size_t i = 0; i < in; ++i) {
      double dw = 0.0;
      for (std::size_t r = 0; r < batch; ++r)
        dw += static_cast<double>(dy[r * out + o]) * static_cast<double>(x[r * in + i]);
      EXPECT_NEAR(d.dweight()[o * in + i], dw, 1e-5 * std::max(1.0, std::abs(dw)))
          << "dW[" << o << ", " << i << "]";
    }
  }
}

// ---- Dense ----------------------------------------------------------------

TEST(Dense, DescribesItsParametersInTorchLayout) {
  Dense layer(7, 3);
  const auto specs = layer.param_specs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "weight");
  EXPECT_EQ(specs[0].shape, (Shape{3, 7}));
  EXPECT_EQ(specs[0].init, Init::he_uniform);
  EXPECT_EQ(specs[0].fan_in, 7u);
  EXPECT_EQ(specs[1].name, "bias");
  EXPECT_EQ(specs[1].shape, (Shape{3}));
  EXPECT_EQ(specs[1].init, Init::zeros);
  EXPECT_EQ(layer.output_shape({7}), (Shape{3}));
}

TEST(Dense, ForwardMatchesANaiveTripleLoop) {
  struct Case {
    std::size_t batch, in, out;
  };
  // The second case is big enough for BLAS to block and pack.
  for (const Case c : {Case{5, 33, 17}, Case{20, 300, 70}}) {
    SCOPED_TRACE(testing::Message() << "batch " << c.batch << ", in " << c.in << ", out " << c.out);
    Rng rng(1);
    DenseUnderTest d(c.in, c.out, rng);
    const Tensor x = uniform_tensor(rng, {c.batch, c.in}, -1.0f, 1.0f);
    Tensor y;
    d.layer.forward(view(x), y);
    ASSERT_EQ(y.shape(), (Shape{c.batch, c.out}));
    const std::vector<double> ref = dense_reference(x, d);
    for (std::size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0, std::abs(ref[i]))) << "element " << i;
  }
}

TEST(Dense, GradientsMatchFiniteDifferences) {
  Rng rng(2);
  DenseUnderTest d(6, 4, rng);
  Tensor x = uniform_tensor(rng, {3, 6}, -1.0f, 1.0f);  // (B, in)
  const Tensor r = normal_tensor(rng, {3, 4});           // (B, out) = dL/dy
  Tensor y, dx;
  d.layer.forward(view(x), y);
  d.layer.backward(view(x), y, r, &dx);
  ASSERT_EQ(dx.shape(), x.shape());

  Tensor scratch;
  auto loss = [&] {
    d.layer.forward(view(x), scratch);
    return probe_loss(scratch, r);
  };
  const std::vector<double> num_dw = central_differences(d.weight(), loss);
  const std::vector<double> num_db = central_differences(d.bias(), loss);
  const std::vector<double> num_dx = central_differences(x.span(), loss);

  // The layer is linear in each of W, b and x, so only float rounding
  // separates the two; 1e-4 leaves a wide margin over what is observed.
  constexpr double kTol = 1e-4;
  EXPECT_GT(max_abs(num_dw), 0.5);
  EXPECT_LT(max_scaled_error(d.dweight(), num_dw), kTol);
  EXPECT_LT(max_scaled_error(d.dbias(), num_db), kTol);
  EXPECT_LT(max_scaled_error(dx.span(), num_dx), kTol);
}

TEST(Dense, BackwardWithoutDxStillWritesParameterGradients) {
  Rng rng(3);
  DenseUnderTest d(5, 4, rng);
  const Tensor x = uniform_tensor(rng, {3, 5}, -1.0f, 1.0f);
  const Tensor dy = normal_tensor(rng, {3, 4});
  Tensor y;
  d.layer.forward(view(x), y);
  d.layer.backward(view(x), y, dy, nullptr);  // the grads start as NaN
  expect_dense_param_grads(x, dy, d);
}

TEST(Dense, BackwardOverwritesRatherThanAccumulates) {
  Rng rng(4);
  DenseUnderTest d(5, 4, rng);
  const Tensor x = uniform_tensor(rng, {3, 5}, -1.0f, 1.0f);
  const Tensor dy = normal_tensor(rng, {3, 4});
  Tensor y, dx;
  d.layer.forward(view(x), y);
  d.layer.backward(view(x), y, dy, &dx);
  d.layer.backward(view(x), y, dy, &dx);
  expect_dense_param_grads(x, dy, d);
}

TEST(Dense, RunsWithADifferentBatchSizeAfterTheFirst) {
  Rng rng(5);
  DenseUnderTest d(6, 4, rng);
  Tensor y, dx;  // reused across batch sizes, as a worker does
  for (std::size_t batch : {5u, 2u, 7u}) {
    SCOPED_TRACE(testing::Message() << "batch " << batch);
    const Tensor x = uniform_tensor(rng, {batch, 6}, -1.0f, 1.0f);
    const Tensor dy = normal_tensor(rng, {batch, 4});
    d.layer.forward(view(x), y);
    ASSERT_EQ(y.shape(), (Shape{batch, 4}));
    const std::vector<double> ref = dense_reference(x, d);
    for (std::size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0, std::abs(ref[i])));
    d.layer.backward(view(x), y, dy, &dx);
    ASSERT_EQ(dx.shape(), (Shape{batch, 6}));
    expect_dense_param_grads(x, dy, d);
  }
}

// ---- ReLU -----------------------------------------------------------------

// Values at least 0.1 away from the kink at 0, of either sign.
Tensor away_from_zero(Rng& rng, Shape shape) {
  Tensor t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = (rng.below(2) ? 1.0f : -1.0f) * rng.uniform(0.1f, 2.0f);
  return t;
}

TEST(ReLU, ForwardClampsNegativesToZero) {
  ReLU relu;
  Tensor x({1, 5});
  const float values[] = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f};
  std::copy(std::begin(values), std::end(values), x.data());
  Tensor y;
  relu.forward(view(x), y);
  ASSERT_EQ(y.shape(), x.shape());
  const float expected[] = {0.0f, 0.0f, 0.0f, 0.5f, 3.0f};
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(y[i], expected[i]) << "element " << i;
}

// A NaN made inside the model stays one, as torch.relu keeps it: it became
// 0, and the batch trained on with a finite loss past the NaN guard.
TEST(ReLU, KeepsANaN) {
  ReLU relu;
  Tensor x({1, 3});
  x[0] = std::nanf("");
  x[1] = -1.0f;
  x[2] = 2.0f;
  Tensor y;
  relu.forward(view(x), y);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 2.0f);
}

TEST(ReLU, GradientsMatchFiniteDifferences) {
  Rng rng(6);
  ReLU relu;
  Tensor x = away_from_zero(rng, {4, 5});
  const Tensor r = normal_tensor(rng, {4, 5});
  Tensor y, dx;
  relu.forward(view(x), y);
  relu.backward(view(x), y, r, &dx);
  ASSERT_EQ(dx.shape(), x.shape());

  Tensor scratch;
  auto loss = [&] {
    relu.forward(view(x), scratch);
    return probe_loss(scratch, r);
  };
  const std::vector<double> num_dx = central_differences(x.span(), loss);
  // Piecewise linear and no input within eps of the kink: rounding only.
  EXPECT_GT(max_abs(num_dx), 0.5);
  EXPECT_LT(max_scaled_error(dx.span(), num_dx), 1e-4);
}

TEST(ReLU, RunsWithADifferentBatchSizeAfterTheFirst) {
  Rng rng(7);
  ReLU relu;
  Tensor y, dx;
  for (std::size_t batch : {4u, 1u, 6u}) {
    SCOPED_TRACE(testing::Message() << "batch " << batch);
    const Tensor x = away_from_zero(rng, {batch, 3});
    const Tensor dy = normal_tensor(rng, {batch, 3});
    relu.forward(view(x), y);
    ASSERT_EQ(y.shape(), x.shape());
    relu.backward(view(x), y, dy, &dx);
    ASSERT_EQ(dx.shape(), x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(y[i], x[i] > 0.0f ? x[i] : 0.0f);
      EXPECT_EQ(dx[i], x[i] > 0.0f ? dy[i] : 0.0f);
    }
  }
}

// ---- SoftmaxCrossEntropy --------------------------------------------------

std::vector<std::int32_t> random_labels(Rng& rng, std::size_t batch, std::size_t classes) {
  std::vector<std::int32_t> labels(batch);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(classes));
  return labels;
}

// Mean over rows of logsumexp(z) - z[label], in double.
double cross_entropy_reference(const Tensor& logits, const std::vector<std::int32_t>& labels) {
  const std::size_t batch = logits.dim(0), classes = logits.dim(1);
  double total = 0.0;
  for (std::size_t r = 0; r < batch; ++r) {
    const float* z = logits.data() + r * classes;
    const double zmax = *std::max_element(z, z + classes);
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(z[c] - zmax);
    total += zmax + std::log(sum) - z[labels[r]];
  }
  return total / static_cast<double>(batch);
}

TEST(SoftmaxCrossEntropy, LossMatchesADoublePrecisionReference) {
  Rng rng(8);
  const Tensor logits = normal_tensor(rng, {6, 7}, 3.0f);
  const auto labels = random_labels(rng, 6, 7);
  SoftmaxCrossEntropy ce;
  const double ref = cross_entropy_reference(logits, labels);
  EXPECT_NEAR(ce.forward(view(logits), labels), ref, 1e-5 * std::max(1.0, ref));
}

TEST(SoftmaxCrossEntropy, GradientsMatchFiniteDifferences) {
  Rng rng(9);
  Tensor logits = normal_tensor(rng, {4, 5}, 2.0f);
  const auto labels = random_labels(rng, 4, 5);
  SoftmaxCrossEntropy ce;
  ce.forward(view(logits), labels);
  Tensor dlogits;
  ce.backward(labels, dlogits);
  ASSERT_EQ(dlogits.shape(), logits.shape());

  SoftmaxCrossEntropy probe;
  auto loss = [&] { return static_cast<double>(probe.forward(view(logits), labels)); };
  const std::vector<double> numeric = central_differences(logits.span(), loss);
  // dL/dz is at most 1/B = 0.25 here, so the tolerance is an absolute one:
  // float rounding of the loss (~1e-5 after dividing by 2 eps) plus the
  // O(eps^2) truncation error of central differences.
  EXPECT_GT(max_abs(numeric), 0.1);
  EXPECT_LT(max_scaled_error(dlogits.span(), numeric), 1e-3);
}

TEST(SoftmaxCrossEntropy, AllZeroLogitsGiveLogOfTheClassCount) {
  constexpr std::size_t kBatch = 3, kClasses = 10;
  const Tensor logits({kBatch, kClasses}, 0.0f);
  const std::vector<std::int32_t> labels = {0, 4, 9};
  SoftmaxCrossEntropy ce;
  EXPECT_NEAR(ce.forward(view(logits), labels), std::log(10.0), 1e-6);
  Tensor dlogits;
  ce.backward(labels, dlogits);
  for (std::size_t r = 0; r < kBatch; ++r)
    for (std::size_t c = 0; c < kClasses; ++c) {
      const double expected = (0.1 - (static_cast<std::int32_t>(c) == labels[r] ? 1.0 : 0.0)) / kBatch;
      EXPECT_NEAR(dlogits[r * kClasses + c], expected, 1e-7) << "row " << r << ", class " << c;
    }
}

TEST(SoftmaxCrossEntropy, HugeLogitsGiveAFiniteLoss) {
  // Row 0 is confidently right (loss ~0), row 1 confidently wrong by 2e4.
  const Tensor logits = [] {
    Tensor t({2, 3});
    const float values[] = {1e4f, 0.0f, -1e4f, 1e4f, 0.0f, -1e4f};
    std::copy(std::begin(values), std::end(values), t.data());
    return t;
  }();
  const std::vector<std::int32_t> labels = {0, 2};
  SoftmaxCrossEntropy ce;
  const float loss = ce.forward(view(logits), labels);
  ASSERT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 1e4, 1e-2);  // (0 + 2e4) / 2
  Tensor dlogits;
  ce.backward(labels, dlogits);
  for (std::size_t r = 0; r < 2; ++r) {
    double row_sum = 0.0;
    for (std::size_t c = 0; c < 3; ++c) {
      ASSERT_TRUE(std::isfinite(dlogits[r * 3 + c]));
      row_sum += dlogits[r * 3 + c];
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-6);  // softmax sums to 1, the one-hot too
  }
  EXPECT_NEAR(dlogits[3 + 0], 0.5, 1e-6);   // p = 1 on the wrong class, / B
  EXPECT_NEAR(dlogits[3 + 2], -0.5, 1e-6);  // p = 0 on the label, minus 1, / B
}

TEST(SoftmaxCrossEntropy, CorrectCountsArgmaxHits) {
  Tensor logits({4, 3});
  const float values[] = {
      5.0f, 1.0f,  2.0f,   // argmax 0, label 0: hit
      0.0f, -1.0f, 3.0f,   // argmax 2, label 1: miss
      -4.0f, 2.0f, -3.0f,  // argmax 1, label 1: hit
      0.1f, 0.2f,  0.3f,   // argmax 2, label 2: hit
  };
  std::copy(std::begin(values), std::end(values), logits.data());
  const std::vector<std::int32_t> labels = {0, 1, 1, 2};
  SoftmaxCrossEntropy ce;
  ce.forward(view(logits), labels);
  EXPECT_EQ(ce.correct(labels), 3u);
  const std::vector<std::int32_t> all_wrong = {1, 0, 0, 0};
  EXPECT_EQ(ce.correct(all_wrong), 0u);
}

TEST(SoftmaxCrossEntropy, RunsWithADifferentBatchSizeAfterTheFirst) {
  Rng rng(10);
  SoftmaxCrossEntropy ce;
  Tensor dlogits;
  for (std::size_t batch : {5u, 2u, 8u}) {
    SCOPED_TRACE(testing::Message() << "batch " << batch);
    const Tensor logits = normal_tensor(rng, {batch, 4});
    const auto labels = random_labels(rng, batch, 4);
    const double ref = cross_entropy_reference(logits, labels);
    EXPECT_NEAR(ce.forward(view(logits), labels), ref, 1e-5 * std::max(1.0, ref));
    ce.backward(labels, dlogits);
    ASSERT_EQ(dlogits.shape(), (Shape{batch, 4}));
    EXPECT_LE(ce.correct(labels), batch);
    for (std::size_t r = 0; r < batch; ++r) {
      double row_sum = 0.0;
      for (std::size_t c = 0; c < 4; ++c) row_sum += dlogits[r * 4 + c];
      EXPECT_NEAR(row_sum, 0.0, 1e-6);
    }
  }
}

}  // namespace
}  // namespace asgd
