#include <gtest/gtest.h>

#include <stdexcept>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
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
#include "base/random.hpp"
#include "compute/tensor.hpp"
#include "compute/model.hpp"
#include "asgd/model_spec.hpp"
#include "compute/thread_pool.hpp"
#include "gradcheck.hpp"

namespace asgd {
namespace {

using namespace gradcheck;

// A layer with its own parameter and gradient storage laid out as a model
// would; gradients start as NaN so that a gradient the layer fails to write
// shows up. Every parameter is random (BatchNorm's weight near 1, so that a
// wrong dgamma is not hidden by gamma = 1).
struct Bound {
  Bound(Layer& l, Rng& rng) : layer(l) {
    for (const ParamSpec& spec : layer.param_specs()) {
      const std::size_t n = numel(spec.shape);
      offsets.push_back(params.size());
      for (std::size_t i = 0; i < n; ++i) {
        switch (spec.init) {
          case Init::he_uniform: {
            const float bound = std::sqrt(6.0f / static_cast<float>(spec.fan_in));
            params.push_back(rng.uniform(-bound, bound));
            break;
          }
          case Init::ones: params.push_back(rng.uniform(0.5f, 1.5f)); break;
          case Init::zeros: params.push_back(rng.uniform(-0.5f, 0.5f)); break;
        }
      }
    }
    offsets.push_back(params.size());
    grads.assign(params.size(), kNaN);
    layer.bind(params, grads);
  }
  std::span<float> param(std::size_t spec) {
    return std::span(params).subspan(offsets[spec], offsets[spec + 1] - offsets[spec]);
  }
  std::span<const float> grad(std::size_t spec) const {
    return std::span(grads).subspan(offsets[spec], offsets[spec + 1] - offsets[spec]);
  }

  Layer& layer;
  std::vector<float> params;
  std::vector<float> grads;
  std::vector<std::size_t> offsets;  // per spec: first index, then the end
};

// Backpropagates a random dL/dy and compares every parameter gradient and dx
// with central differences of sum(y * r), each within `tol`.
void expect_gradients_match(Bound& bound, Tensor& x, Rng& rng, double tol) {
  Tensor y, dx;
  bound.layer.forward(view(x), y);
  const Tensor r = normal_tensor(rng, y.shape());
  bound.layer.backward(view(x), y, r, &dx);
  ASSERT_EQ(dx.shape(), x.shape());

  Tensor scratch;
  auto loss = [&] {
    bound.layer.forward(view(x), scratch);
    return probe_loss(scratch, r);
  };
  const auto specs = bound.layer.param_specs();
  for (std::size_t s = 0; s < specs.size(); ++s) {
    const std::vector<double> numeric = central_differences(bound.param(s), loss);
    EXPECT_GT(max_abs(numeric), 0.1) << specs[s].name << ": a vacuous check";
    EXPECT_LT(max_scaled_error(bound.grad(s), numeric), tol) << specs[s].name;
  }
  const std::vector<double> numeric_dx = central_differences(x.span(), loss);
  EXPECT_GT(max_abs(numeric_dx), 0.1) << "dx: a vacuous check";
  EXPECT_LT(max_scaled_error(dx.span(), numeric_dx), tol) << "dx";
}

// The parameter gradients a backward pass leaves, for comparisons.
std::vector<float> grads_after_backward(Bound& bound, const Tensor& x, const Tensor& dy, Tensor* dx) {
  Tensor y;
  bound.layer.forward(view(x), y);
  std::fill(bound.grads.begin(), bound.grads.end(), kNaN);
  bound.layer.backward(view(x), y, dy, dx);
  return bound.grads;
}

// ---- Conv2D ---------------------------------------------------------------

struct ConvCase {
  std::size_t batch, in, out, k, stride, pad, h, w;
  bool bias;
};

std::ostream& operator<<(std::ostream& os, const ConvCase& c) {
  return os << "B" << c.batch << " C" << c.in << " O" << c.out << " k" << c.k << " s" << c.stride << " p" << c.pad
            << " " << c.h << "x" << c.w << (c.bias ? " bias" : " no bias");
}

// Every shape the models use, at small sizes, plus odd ones.
const ConvCase kConvCases[] = {
    {2, 1, 3, 5, 1, 0, 8, 8, true},     // lenet's first layer
    {2, 3, 4, 3, 1, 1, 5, 5, false},    // same padding
    {2, 3, 4, 3, 2, 1, 7, 6, false},    // resnet's downsampling conv, odd sizes
    {3, 4, 5, 1, 2, 0, 6, 6, false},    // projection shortcut
    {1, 2, 3, 1, 1, 0, 4, 3, true},     // 1x1, stride 1
    {2, 2, 2, 3, 3, 2, 5, 5, true},     // stride larger than a tight fit
    {2, 2, 3, 3, 2, 1, 4, 37, false},   // output rows longer than one vector (19), stride 2
    {1, 2, 2, 3, 1, 1, 3, 20, true},    // the same at stride 1
    {1, 1, 2, 3, 1, 1, 2, 70, false},   // rows too long for the vector path
};

// y in double, straight from the definition of cross-correlation.
std::vector<double> conv_reference(const Tensor& x, const ConvCase& c, Bound& bound) {
  const std::size_t oh = (c.h + 2 * c.pad - c.k) / c.stride + 1, ow = (c.w + 2 * c.pad - c.k) / c.stride + 1;
  const std::span<float> w = bound.param(0);
  std::vector<double> y(c.batch * c.out * oh * ow);
  for (std::size_t b = 0; b < c.batch; ++b)
    for (std::size_t o = 0; o < c.out; ++o)
      for (std::size_t oy = 0; oy < oh; ++oy)
        for (std::size_t ox = 0; ox < ow; ++ox) {
          double sum = c.bias ? bound.param(1)[o] : 0.0;
          for (std::size_t ch = 0; ch < c.in; ++ch)
            for (std::size_t i = 0; i < c.k; ++i)
              for (std::size_t j = 0; j < c.k; ++j) {
                const auto iy = static_cast<std::ptrdiff_t>(oy * c.stride + i) - static_cast<std::ptrdiff_t>(c.pad);
                const auto ix = static_cast<std::ptrdiff_t>(ox * c.stride + j) - static_cast<std::ptrdiff_t>(c.pad);
                if (iy < 0 || ix < 0 || iy >= static_cast<std::ptrdiff_t>(c.h) ||
                    ix >= static_cast<std::ptrdiff_t>(c.w))
                  continue;
                const double xv = x[((b * c.in + ch) * c.h + static_cast<std::size_t>(iy)) * c.w +
                                    static_cast<std::size_t>(ix)];
                sum += xv * w[((o * c.in + ch) * c.k + i) * c.k + j];
              }
          y[((b * c.out + o) * oh + oy) * ow + ox] = sum;
        }
  return y;
}

TEST(Conv2D, DescribesItsParametersInTorchLayout) {
  Conv2D conv(3, 8, 5, 2, 1);
  const auto specs = conv.param_specs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "weight");
  EXPECT_EQ(specs[0].shape, (Shape{8, 3, 5, 5}));
  EXPECT_EQ(specs[0].init, Init::he_uniform);
  EXPECT_EQ(specs[0].fan_in, 75u);
  EXPECT_EQ(specs[1].name, "bias");
  EXPECT_EQ(specs[1].shape, (Shape{8}));
  EXPECT_EQ(specs[1].init, Init::zeros);
  EXPECT_EQ(conv.output_shape({3, 28, 28}), (Shape{8, 13, 13}));  // (28 + 2 - 5) / 2 + 1

  Conv2D no_bias(16, 32, 1, 2, 0, false);
  ASSERT_EQ(no_bias.param_specs().size(), 1u);
  EXPECT_FALSE(no_bias.has_bias());
  EXPECT_EQ(no_bias.output_shape({16, 14, 14}), (Shape{32, 7, 7}));
}

TEST(Conv2D, ForwardMatchesTheDefinition) {
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(testing::Message() << c);
    Rng rng(11);
    Conv2D conv(c.in, c.out, c.k, c.stride, c.pad, c.bias);
    Bound bound(conv, rng);
    const Tensor x = uniform_tensor(rng, {c.batch, c.in, c.h, c.w}, -1.0f, 1.0f);
    Tensor y;
    conv.forward(view(x), y);
    Shape expected = {c.batch};
    for (std::size_t d : conv.output_shape({c.in, c.h, c.w})) expected.push_back(d);
    ASSERT_EQ(y.shape(), expected);
    const std::vector<double> ref = conv_reference(x, c, bound);
    for (std::size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0, std::abs(ref[i]))) << "element " << i;
  }
}

TEST(Conv2D, GradientsMatchFiniteDifferences) {
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(testing::Message() << c);
    Rng rng(12);
    Conv2D conv(c.in, c.out, c.k, c.stride, c.pad, c.bias);
    Bound bound(conv, rng);
    Tensor x = uniform_tensor(rng, {c.batch, c.in, c.h, c.w}, -1.0f, 1.0f);
    // Linear in each of W, b and x: only float rounding separates the two.
    expect_gradients_match(bound, x, rng, 1e-4);
  }
}

TEST(Conv2D, BackwardWithoutDxWritesTheSameParameterGradients) {
  Rng rng(13);
  Conv2D conv(3, 4, 3, 2, 1, true);
  Bound bound(conv, rng);
  const Tensor x = uniform_tensor(rng, {2, 3, 7, 7}, -1.0f, 1.0f);
  const Tensor dy = normal_tensor(rng, {2, 4, 4, 4});
  Tensor dx;
  const std::vector<float> with_dx = grads_after_backward(bound, x, dy, &dx);
  const std::vector<float> without_dx = grads_after_backward(bound, x, dy, nullptr);
  EXPECT_EQ(with_dx, without_dx);
  for (float g : without_dx) ASSERT_FALSE(std::isnan(g));
}

TEST(Conv2D, BackwardOverwritesRatherThanAccumulates) {
  Rng rng(14);
  Conv2D conv(2, 3, 3, 1, 1, true);
  Bound bound(conv, rng);
  const Tensor x = uniform_tensor(rng, {2, 2, 5, 5}, -1.0f, 1.0f);
  const Tensor dy = normal_tensor(rng, {2, 3, 5, 5});
  Tensor y, dx;
  conv.forward(view(x), y);
  conv.backward(view(x), y, dy, &dx);
  const std::vector<float> once = bound.grads;
  const Tensor dx_once = dx;
  conv.backward(view(x), y, dy, &dx);
  EXPECT_EQ(bound.grads, once);
  EXPECT_EQ(std::vector<float>(dx.span().begin(), dx.span().end()),
            std::vector<float>(dx_once.span().begin(), dx_once.span().end()));
}

TEST(Conv2D, RunsWithADifferentBatchSizeAfterTheFirst) {
  const ConvCase base = {0, 3, 4, 3, 2, 1, 7, 6, true};
  Rng rng(15);
  Conv2D conv(base.in, base.out, base.k, base.stride, base.pad, base.bias);
  Bound bound(conv, rng);
  Tensor y, dx;
  for (std::size_t batch : {3u, 1u, 5u}) {
    SCOPED_TRACE(testing::Message() << "batch " << batch);
    ConvCase c = base;
    c.batch = batch;
    const Tensor x = uniform_tensor(rng, {batch, c.in, c.h, c.w}, -1.0f, 1.0f);
    conv.forward(view(x), y);
    const std::vector<double> ref = conv_reference(x, c, bound);
    ASSERT_EQ(y.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0, std::abs(ref[i])));
    const Tensor dy = normal_tensor(rng, y.shape());
    conv.backward(view(x), y, dy, &dx);
    ASSERT_EQ(dx.shape(), x.shape());
    for (float g : bound.grads) ASSERT_TRUE(std::isfinite(g));
  }
}

struct Outputs {
  std::vector<float> y, dx, grads;
};

// One forward and backward pass of `layer` on a pool of `threads` threads.
Outputs run_with_threads(Bound& bound, const Tensor& x, const Tensor& dy, std::size_t threads) {
  ThreadPool pool(threads);
  bound.layer.set_pool(&pool);
  Tensor y, dx;
  bound.layer.forward(view(x), y);
  bound.layer.backward(view(x), y, dy, &dx);
  bound.layer.set_pool(nullptr);
  EXPECT_EQ(pool.widest_loop(), threads) << "the layer did not split its work across the pool";
  return {{y.span().begin(), y.span().end()}, {dx.span().begin(), dx.span().end()}, bound.grads};
}

// The layers cut a batch into chunks that do not depend on the thread
// count (up to 4) and add partial sums in chunk order, so the results are
// bitwise the same.
void expect_same(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.grads, b.grads);
}

TEST(Conv2D, TwoThreadsGiveBitwiseTheResultOfOne) {
  // Odd batch sizes leave the threads unequal shares; the cases take each
  // way to dW (dot products for one input channel, else a product) and to
  // dx (col2im, or a convolution with the flipped kernel for 16 channels),
  // and the 7x7 one groups several samples per product.
  for (const ConvCase& c : {ConvCase{6, 1, 4, 3, 1, 1, 9, 9, true}, ConvCase{5, 3, 4, 3, 1, 1, 6, 6, true},
                            ConvCase{7, 8, 16, 3, 2, 1, 14, 14, false}, ConvCase{9, 16, 16, 3, 1, 1, 7, 7, false}}) {
    SCOPED_TRACE(testing::Message() << c);
    Rng rng(16);
    Conv2D conv(c.in, c.out, c.k, c.stride, c.pad, c.bias);
    Bound bound(conv, rng);
    const Tensor x = uniform_tensor(rng, {c.batch, c.in, c.h, c.w}, -1.0f, 1.0f);
    Tensor y;
    conv.forward(view(x), y);
    const Tensor dy = normal_tensor(rng, y.shape());
    expect_same(run_with_threads(bound, x, dy, 1), run_with_threads(bound, x, dy, 2));
  }
}

// ---- MaxPool2D ------------------------------------------------------------

// Distinct values at least 0.05 apart in random order, so that no finite
// difference step of 0.01 changes which element of a window is the maximum.
Tensor distinct_values(Rng& rng, Shape shape) {
  Tensor t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.05f * static_cast<float>(i) - 1.0f;
  for (std::size_t i = t.size(); i > 1; --i) std::swap(t[i - 1], t[rng.below(i)]);
  return t;
}

TEST(MaxPool2D, ForwardTakesEachWindowsMaximum) {
  MaxPool2D pool(2);
  EXPECT_EQ(pool.stride(), 2u);
  EXPECT_EQ(pool.output_shape({3, 5, 4}), (Shape{3, 2, 2}));  // floor, as torch
  Tensor x({1, 1, 4, 4});
  const float values[] = {1, 2, 0, -1,  //
                          3, 4, 5, 6,   //
                          -2, -3, 9, 9, //
                          -4, -1, 8, 7};
  std::copy(std::begin(values), std::end(values), x.data());
  Tensor y;
  pool.forward(view(x), y);
  ASSERT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y[0], 4.0f);
  EXPECT_EQ(y[1], 6.0f);
  EXPECT_EQ(y[2], -1.0f);
  EXPECT_EQ(y[3], 9.0f);
}

TEST(MaxPool2D, TiesSendTheGradientToTheFirstMaximumInRowMajorOrder) {
  MaxPool2D pool(2);
  Tensor x({1, 2, 2, 2});
  const float values[] = {3, 3, 3, 3,   // all tied: the top-left wins
                          0, 1, 1, 1};  // three tied: the top-right wins
  std::copy(std::begin(values), std::end(values), x.data());
  Tensor y, dx;
  pool.forward(view(x), y);
  const Tensor dy({1, 2, 1, 1}, 1.0f);
  pool.backward(view(x), y, dy, &dx);
  const float expected[] = {1, 0, 0, 0, 0, 1, 0, 0};
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(dx[i], expected[i]) << "element " << i;
}

// A NaN anywhere in a window wins it, as in torch's max_pool2d (a strict >
// lost it unless it came first): on the 2x2 fast path and the general one.
TEST(MaxPool2D, ANaNWinsItsWindowOnBothPaths) {
  for (const std::size_t k : {std::size_t{2}, std::size_t{3}}) {
    MaxPool2D pool(k);
    Tensor x({1, 1, k, k}, 1.0f);
    x[k * k - 1] = std::nanf("");  // last in its window
    Tensor y;
    pool.forward(view(x), y);
    ASSERT_EQ(y.size(), 1u);
    EXPECT_TRUE(std::isnan(y[0])) << "window " << k;
  }
}

// A max_pool written in JSON without "stride" takes the kernel, as
// max_pool(k) and torch's MaxPool2d(k) do (it read conv2d's default, 1).
TEST(MaxPool2D, AJsonSpecWithoutAStrideTakesTheKernel) {
  auto spec = ModelSpec::from_json(
      R"({"name": "p", "layers": [{"kind": "max_pool", "kernel": 2}, {"kind": "flatten"}, {"kind": "dense", "units": 10}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto model = Model::build(*spec, {1, 8, 8}, 10);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->num_params(), 4u * 4u * 10u + 10u);  // a 4x4 output, not 7x7
}

TEST(MaxPool2D, GradientsMatchFiniteDifferences) {
  Rng rng(21);
  for (const auto& [k, s] : {std::pair<std::size_t, std::size_t>{2, 2}, {3, 2}, {2, 1}}) {
    SCOPED_TRACE(testing::Message() << "kernel " << k << ", stride " << s);
    MaxPool2D pool(k, s);
    Bound bound(pool, rng);
    Tensor x = distinct_values(rng, {2, 2, 5, 5});
    // Overlapping windows (stride < kernel) add up at a shared maximum.
    expect_gradients_match(bound, x, rng, 1e-4);
  }
}

TEST(MaxPool2D, RunsWithADifferentBatchSizeAfterTheFirst) {
  Rng rng(22);
  MaxPool2D pool(2);
  Tensor y, dx;
  for (std::size_t batch : {3u, 1u, 4u}) {
    const Tensor x = distinct_values(rng, {batch, 2, 4, 4});
    pool.forward(view(x), y);
    ASSERT_EQ(y.shape(), (Shape{batch, 2, 2, 2}));
    const Tensor dy = normal_tensor(rng, y.shape());
    pool.backward(view(x), y, dy, &dx);
    ASSERT_EQ(dx.shape(), x.shape());
    // Each window passes its gradient to exactly one input, the maximum.
    double sum_dx = 0.0, sum_dy = 0.0;
    for (std::size_t i = 0; i < dx.size(); ++i) sum_dx += dx[i];
    for (std::size_t i = 0; i < dy.size(); ++i) sum_dy += dy[i];
    EXPECT_NEAR(sum_dx, sum_dy, 1e-5);
  }
}

// ---- GlobalAvgPool --------------------------------------------------------

TEST(GlobalAvgPool, AveragesEachChannelPlane) {
  GlobalAvgPool pool;
  EXPECT_EQ(pool.output_shape({64, 7, 7}), (Shape{64}));
  Tensor x({2, 3, 2, 2});
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  Tensor y;
  pool.forward(view(x), y);
  ASSERT_EQ(y.shape(), (Shape{2, 3}));
  for (std::size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y[i], 4.0f * static_cast<float>(i) + 1.5f);
}

TEST(GlobalAvgPool, GradientsMatchFiniteDifferences) {
  Rng rng(31);
  GlobalAvgPool pool;
  Tensor x = uniform_tensor(rng, {2, 3, 3, 2}, -1.0f, 1.0f);
  // The gradient is 1/6 of dy: scale dy up so that the check is not vacuous.
  Tensor y, dx;
  pool.forward(view(x), y);
  const Tensor r = normal_tensor(rng, y.shape(), 6.0f);
  pool.backward(view(x), y, r, &dx);
  Tensor scratch;
  auto loss = [&] {
    pool.forward(view(x), scratch);
    return probe_loss(scratch, r);
  };
  const std::vector<double> numeric = central_differences(x.span(), loss);
  EXPECT_GT(max_abs(numeric), 0.5);
  EXPECT_LT(max_scaled_error(dx.span(), numeric), 1e-4);
}

// ---- BatchNorm2D ----------------------------------------------------------

// Per-channel mean and variances (biased and unbiased) of x (B, C, H, W), in
// double.
struct ChannelStats {
  std::vector<double> mean, var, unbiased;
};
ChannelStats channel_stats(const Tensor& x) {
  const std::size_t batch = x.dim(0), channels = x.dim(1), plane = x.dim(2) * x.dim(3);
  const double n = static_cast<double>(batch * plane);
  ChannelStats s{std::vector<double>(channels), std::vector<double>(channels), std::vector<double>(channels)};
  for (std::size_t c = 0; c < channels; ++c) {
    double sum = 0.0;
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < plane; ++i) sum += x[(b * channels + c) * plane + i];
    s.mean[c] = sum / n;
    double sq = 0.0;
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < plane; ++i) {
        const double d = x[(b * channels + c) * plane + i] - s.mean[c];
        sq += d * d;
      }
    s.var[c] = sq / n;
    s.unbiased[c] = sq / (n - 1.0);
  }
  return s;
}

// (x - mean) / sqrt(var + eps) * gamma + beta, per channel, in double.
void expect_normalised(const Tensor& x, const Tensor& y, const std::vector<double>& mean,
                       const std::vector<double>& var, Bound& bound, double eps = 1e-5) {
  const std::size_t batch = x.dim(0), channels = x.dim(1), plane = x.dim(2) * x.dim(3);
  ASSERT_EQ(y.shape(), x.shape());
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t c = 0; c < channels; ++c)
      for (std::size_t i = 0; i < plane; ++i) {
        const std::size_t at = (b * channels + c) * plane + i;
        const double expected =
            (x[at] - mean[c]) / std::sqrt(var[c] + eps) * bound.param(0)[c] + bound.param(1)[c];
        ASSERT_NEAR(y[at], expected, 1e-5 * std::max(1.0, std::abs(expected))) << "element " << at;
      }
}

TEST(BatchNorm2D, DescribesItsParametersAndBuffersAsTorch) {
  BatchNorm2D bn(4);
  EXPECT_EQ(bn.eps(), 1e-5f);
  EXPECT_EQ(bn.momentum(), 0.1f);
  EXPECT_TRUE(bn.training());
  const auto specs = bn.param_specs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "weight");
  EXPECT_EQ(specs[0].init, Init::ones);
  EXPECT_EQ(specs[0].shape, (Shape{4}));
  EXPECT_EQ(specs[1].name, "bias");
  EXPECT_EQ(specs[1].init, Init::zeros);
  const auto buffers = bn.buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].name, "running_mean");
  EXPECT_EQ(buffers[1].name, "running_var");
  EXPECT_EQ(buffers[0].values.data(), bn.running_mean().data());
  for (float v : bn.running_mean()) EXPECT_EQ(v, 0.0f);
  for (float v : bn.running_var()) EXPECT_EQ(v, 1.0f);
  EXPECT_EQ(bn.output_shape({4, 7, 7}), (Shape{4, 7, 7}));
}

TEST(BatchNorm2D, TrainingForwardNormalisesWithTheBiasedBatchVariance) {
  Rng rng(41);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  const Tensor x = uniform_tensor(rng, {4, 3, 3, 2}, -2.0f, 3.0f);
  Tensor y;
  bn.forward(view(x), y);
  const ChannelStats s = channel_stats(x);
  expect_normalised(x, y, s.mean, s.var, bound);
}

TEST(BatchNorm2D, TrainingOnOneValuePerChannelIsRefusedSayingWhyAndInferenceIsNot) {
  Rng rng(43);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  const Tensor one = uniform_tensor(rng, {1, 3, 1, 1}, -2.0f, 3.0f);  // a batch of 1 on 1x1 maps
  Tensor y;
  try {
    bn.forward(view(one), y);
    FAIL() << "a training forward on one value per channel went through";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than one value per channel"), std::string::npos) << e.what();
  }
  for (const float v : bn.running_var()) EXPECT_EQ(v, 1.0f);  // untouched
  const Tensor two = uniform_tensor(rng, {2, 3, 1, 1}, -2.0f, 3.0f);
  EXPECT_NO_THROW(bn.forward(view(two), y));
  bn.set_training(false);
  EXPECT_NO_THROW(bn.forward(view(one), y));
  EXPECT_NO_THROW(BatchNorm2D::check_values_per_channel(2));
  EXPECT_THROW(BatchNorm2D::check_values_per_channel(1), std::invalid_argument);
}

TEST(BatchNorm2D, RunningStatisticsMoveAsPyTorchs) {
  Rng rng(42);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  // running = 0.9 running + 0.1 batch, with the unbiased variance.
  std::vector<double> mean(3, 0.0), var(3, 1.0);
  Tensor y;
  for (int step = 0; step < 3; ++step) {
    const Tensor x = uniform_tensor(rng, {2, 3, 2, 3}, -1.0f, 4.0f);
    bn.forward(view(x), y);
    const ChannelStats s = channel_stats(x);
    for (std::size_t c = 0; c < 3; ++c) {
      mean[c] = 0.9 * mean[c] + 0.1 * s.mean[c];
      var[c] = 0.9 * var[c] + 0.1 * s.unbiased[c];
      EXPECT_NEAR(bn.running_mean()[c], mean[c], 1e-6) << "step " << step << ", channel " << c;
      EXPECT_NEAR(bn.running_var()[c], var[c], 1e-6) << "step " << step << ", channel " << c;
    }
  }
}

TEST(BatchNorm2D, InferenceForwardUsesTheRunningStatisticsAndKeepsThem) {
  Rng rng(43);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  const float rm[] = {0.5f, -1.0f, 2.0f}, rv[] = {0.25f, 4.0f, 1.5f};
  std::copy(std::begin(rm), std::end(rm), bn.running_mean().begin());
  std::copy(std::begin(rv), std::end(rv), bn.running_var().begin());
  bn.set_training(false);
  EXPECT_FALSE(bn.training());
  const Tensor x = uniform_tensor(rng, {2, 3, 2, 2}, -2.0f, 2.0f);
  Tensor y;
  bn.forward(view(x), y);
  expect_normalised(x, y, {rm[0], rm[1], rm[2]}, {rv[0], rv[1], rv[2]}, bound);
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(bn.running_mean()[c], rm[c]);
    EXPECT_EQ(bn.running_var()[c], rv[c]);
  }
}

TEST(BatchNorm2D, TrainingGradientsMatchFiniteDifferences) {
  Rng rng(44);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  Tensor x = uniform_tensor(rng, {2, 3, 3, 3}, -2.0f, 2.0f);
  // Not linear in x: central differences carry an O(eps^2) truncation error.
  expect_gradients_match(bound, x, rng, 5e-4);
}

TEST(BatchNorm2D, InferenceGradientsMatchFiniteDifferences) {
  Rng rng(45);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  const float rm[] = {0.5f, -1.0f, 0.0f}, rv[] = {0.25f, 2.0f, 1.5f};
  std::copy(std::begin(rm), std::end(rm), bn.running_mean().begin());
  std::copy(std::begin(rv), std::end(rv), bn.running_var().begin());
  bn.set_training(false);
  Tensor x = uniform_tensor(rng, {2, 3, 2, 2}, -2.0f, 2.0f);
  expect_gradients_match(bound, x, rng, 1e-4);
}

TEST(BatchNorm2D, RecalibrationKeepsTheEqualWeightAverageOfTheBatches) {
  Rng rng(46);
  BatchNorm2D bn(2);
  Bound bound(bn, rng);
  Tensor y;
  const Tensor warmup = uniform_tensor(rng, {2, 2, 3, 3}, -1.0f, 1.0f);
  bn.forward(view(warmup), y);  // leaves some moving-average state behind

  bn.begin_recalibration();
  std::vector<double> mean(2, 0.0), var(2, 0.0);
  constexpr int kBatches = 3;
  for (int i = 0; i < kBatches; ++i) {
    const Tensor x = uniform_tensor(rng, {3, 2, 2, 2}, -1.0f + static_cast<float>(i), 2.0f * static_cast<float>(i + 1));
    bn.forward(view(x), y);
    const ChannelStats s = channel_stats(x);
    for (std::size_t c = 0; c < 2; ++c) {
      mean[c] += s.mean[c] / kBatches;
      var[c] += s.unbiased[c] / kBatches;
    }
  }
  for (std::size_t c = 0; c < 2; ++c) {
    EXPECT_NEAR(bn.running_mean()[c], mean[c], 1e-5) << "channel " << c;
    EXPECT_NEAR(bn.running_var()[c], var[c], 1e-5) << "channel " << c;
  }

  // Back to the moving average with momentum 0.1.
  bn.end_recalibration();
  const Tensor x = uniform_tensor(rng, {2, 2, 3, 3}, 0.0f, 1.0f);
  bn.forward(view(x), y);
  const ChannelStats s = channel_stats(x);
  for (std::size_t c = 0; c < 2; ++c) {
    EXPECT_NEAR(bn.running_mean()[c], 0.9 * mean[c] + 0.1 * s.mean[c], 1e-5);
    EXPECT_NEAR(bn.running_var()[c], 0.9 * var[c] + 0.1 * s.unbiased[c], 1e-5);
  }
}

TEST(BatchNorm2D, RunsWithADifferentBatchSizeAfterTheFirst) {
  Rng rng(47);
  BatchNorm2D bn(3);
  Bound bound(bn, rng);
  Tensor y, dx;
  for (std::size_t batch : {4u, 2u, 5u}) {
    SCOPED_TRACE(testing::Message() << "batch " << batch);
    const Tensor x = uniform_tensor(rng, {batch, 3, 2, 2}, -1.0f, 1.0f);
    bn.forward(view(x), y);
    const ChannelStats s = channel_stats(x);
    expect_normalised(x, y, s.mean, s.var, bound);
    bn.backward(view(x), y, normal_tensor(rng, y.shape()), &dx);
    ASSERT_EQ(dx.shape(), x.shape());
  }
}

TEST(BatchNorm2D, TwoThreadsGiveBitwiseTheResultOfOne) {
  Rng rng(48);
  BatchNorm2D bn(5);
  Bound bound(bn, rng);
  const Tensor x = uniform_tensor(rng, {3, 5, 4, 4}, -1.0f, 2.0f);
  const Tensor dy = normal_tensor(rng, x.shape());
  const Outputs one = run_with_threads(bound, x, dy, 1);
  const std::vector<float> running_after_one(bn.running_mean().begin(), bn.running_mean().end());
  expect_same(one, run_with_threads(bound, x, dy, 2));
  // Both passes moved the running mean towards the same batch mean.
  const ChannelStats s = channel_stats(x);
  for (std::size_t c = 0; c < 5; ++c)
    EXPECT_NEAR(bn.running_mean()[c], 0.9 * running_after_one[c] + 0.1 * s.mean[c], 1e-6);
}

// ---- Flatten --------------------------------------------------------------

TEST(Flatten, KeepsTheValuesInOrderBothWays) {
  Flatten flatten;
  EXPECT_EQ(flatten.output_shape({32, 4, 4}), (Shape{512}));
  Rng rng(51);
  const Tensor x = uniform_tensor(rng, {2, 3, 2, 2}, -1.0f, 1.0f);
  Tensor y, dx;
  flatten.forward(view(x), y);
  ASSERT_EQ(y.shape(), (Shape{2, 12}));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i]);
  const Tensor dy = normal_tensor(rng, y.shape());
  flatten.backward(view(x), y, dy, &dx);
  ASSERT_EQ(dx.shape(), x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(dx[i], dy[i]);
}

// ---- Dropout --------------------------------------------------------------

TEST(Dropout, DropsAboutPAndScalesTheRestByOneOverOneMinusP) {
  constexpr float kP = 0.3f;
  constexpr std::size_t kUnits = 200000;
  Dropout dropout(kP, 7);
  Tensor x({4, kUnits / 4}, 2.0f);
  Tensor y, dx;
  dropout.forward(view(x), y);
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0.0f) {
      ++dropped;
    } else {
      ASSERT_FLOAT_EQ(y[i], 2.0f / (1.0f - kP)) << "element " << i;
    }
  }
  // Binomial: the standard deviation of the fraction is about 0.001.
  EXPECT_NEAR(static_cast<double>(dropped) / kUnits, kP, 0.005);

  // The gradient goes through the same mask with the same scale.
  Rng rng(52);
  const Tensor dy = normal_tensor(rng, y.shape());
  dropout.backward(view(x), y, dy, &dx);
  for (std::size_t i = 0; i < y.size(); ++i)
    ASSERT_FLOAT_EQ(dx[i], y[i] == 0.0f ? 0.0f : dy[i] / (1.0f - kP)) << "element " << i;
}

TEST(Dropout, InferenceModeIsTheIdentity) {
  Dropout dropout(0.5f, 1);
  dropout.set_training(false);
  Rng rng(53);
  const Tensor x = uniform_tensor(rng, {3, 10}, -1.0f, 1.0f);
  const Tensor dy = normal_tensor(rng, {3, 10});
  Tensor y, dx;
  dropout.forward(view(x), y);
  dropout.backward(view(x), y, dy, &dx);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], x[i]);
    EXPECT_EQ(dx[i], dy[i]);
  }
}

TEST(Dropout, TheSameSeedDrawsTheSameMasks) {
  Rng rng(54);
  const Tensor x = uniform_tensor(rng, {2, 50}, 1.0f, 2.0f);
  Dropout a(0.5f, 9), b(0.5f, 9);
  Tensor ya, yb;
  a.forward(view(x), ya);
  b.forward(view(x), yb);
  EXPECT_EQ(std::vector<float>(ya.span().begin(), ya.span().end()),
            std::vector<float>(yb.span().begin(), yb.span().end()));
  a.forward(view(x), ya);  // a new mask for the next batch
  EXPECT_NE(std::vector<float>(ya.span().begin(), ya.span().end()),
            std::vector<float>(yb.span().begin(), yb.span().end()));
  a.reseed(9);
  a.forward(view(x), ya);
  EXPECT_EQ(std::vector<float>(ya.span().begin(), ya.span().end()),
            std::vector<float>(yb.span().begin(), yb.span().end()));
}

// ---- Residual -------------------------------------------------------------

using Path = std::vector<std::unique_ptr<Layer>>;

template <class... L>
Path path(std::unique_ptr<L>... layers) {
  Path p;
  (p.push_back(std::move(layers)), ...);
  return p;
}

// The resnet-mini block: main = conv(s) BN ReLU conv BN, shortcut = 1x1
// conv(s) BN.
Residual projection_block(std::size_t in, std::size_t out, std::size_t stride, bool relu = true) {
  Path main;
  main.push_back(std::make_unique<Conv2D>(in, out, 3, stride, 1, false));
  main.push_back(std::make_unique<BatchNorm2D>(out));
  if (relu) main.push_back(std::make_unique<ReLU>());
  main.push_back(std::make_unique<Conv2D>(out, out, 3, 1, 1, false));
  main.push_back(std::make_unique<BatchNorm2D>(out));
  return Residual(std::move(main),
                  path(std::make_unique<Conv2D>(in, out, 1, stride, 0, false), std::make_unique<BatchNorm2D>(out)));
}

TEST(Residual, NamesItsParametersAndBuffersByPath) {
  Residual block = projection_block(2, 4, 2);
  EXPECT_EQ(block.output_shape({2, 7, 7}), (Shape{4, 4, 4}));
  std::vector<std::string> names;
  for (const ParamSpec& spec : block.param_specs()) names.push_back(spec.name);
  const std::vector<std::string> expected = {"main.0.weight", "main.1.weight",     "main.1.bias",
                                             "main.3.weight", "main.4.weight",     "main.4.bias",
                                             "shortcut.0.weight", "shortcut.1.weight", "shortcut.1.bias"};
  EXPECT_EQ(names, expected);
  std::vector<std::string> buffer_names;
  for (const LayerBuffer& b : block.buffers()) buffer_names.push_back(b.name);
  const std::vector<std::string> expected_buffers = {"main.1.running_mean",     "main.1.running_var",
                                                     "main.4.running_mean",     "main.4.running_var",
                                                     "shortcut.1.running_mean", "shortcut.1.running_var"};
  EXPECT_EQ(buffer_names, expected_buffers);
  const std::vector<Layer*> children = block.children();
  ASSERT_EQ(children.size(), 7u);
  EXPECT_EQ(children[0], block.main_path()[0].get());
  EXPECT_EQ(children[5], block.shortcut_path()[0].get());
}

TEST(Residual, BindsEachSubLayerToItsSliceInOrder) {
  Rng rng(61);
  Residual block = projection_block(2, 3, 1, false);
  Bound bound(block, rng);
  // Running the sub-layers by hand on the same slices gives the same output.
  const Tensor x = uniform_tensor(rng, {2, 2, 4, 4}, -1.0f, 1.0f);
  Tensor y;
  block.forward(view(x), y);
  auto run = [&](const Path& p) {
    Tensor a = x, b;
    for (const auto& layer : p) {
      layer->forward(view(a), b);
      std::swap(a, b);
    }
    return a;
  };
  const Tensor m = run(block.main_path()), s = run(block.shortcut_path());
  ASSERT_EQ(y.shape(), m.shape());
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], m[i] + s[i], 1e-6) << "element " << i;
}

TEST(Residual, GradientsMatchFiniteDifferencesWithAnIdentityShortcut) {
  Rng rng(62);
  // A bias right before BatchNorm has no effect (a zero gradient), so the
  // bias sits on the last conv.
  Residual block(path(std::make_unique<Conv2D>(3, 3, 3, 1, 1, false), std::make_unique<BatchNorm2D>(3),
                      std::make_unique<Conv2D>(3, 3, 3, 1, 1, true)),
                 Path{});
  Bound bound(block, rng);
  Tensor x = uniform_tensor(rng, {2, 3, 4, 4}, -1.0f, 1.0f);
  expect_gradients_match(bound, x, rng, 1e-3);
}

TEST(Residual, GradientsMatchFiniteDifferencesWithAProjectionShortcut) {
  Rng rng(63);
  // No ReLU: a finite difference step across its kink would spoil the check.
  Residual block = projection_block(2, 3, 2, false);
  Bound bound(block, rng);
  Tensor x = uniform_tensor(rng, {3, 2, 5, 5}, -1.0f, 1.0f);
  expect_gradients_match(bound, x, rng, 1e-3);
}

TEST(Residual, BackwardWithoutDxWritesTheSameParameterGradients) {
  Rng rng(64);
  Residual block = projection_block(2, 4, 2);
  Bound bound(block, rng);
  const Tensor x = uniform_tensor(rng, {2, 2, 6, 6}, -1.0f, 1.0f);
  const Tensor dy = normal_tensor(rng, {2, 4, 3, 3});
  Tensor dx;
  const std::vector<float> with_dx = grads_after_backward(bound, x, dy, &dx);
  const std::vector<float> without_dx = grads_after_backward(bound, x, dy, nullptr);
  EXPECT_EQ(with_dx, without_dx);
  for (float g : without_dx) ASSERT_FALSE(std::isnan(g));
}

TEST(Residual, TwoThreadsGiveBitwiseTheResultOfOne) {
  for (const bool identity : {false, true}) {
    SCOPED_TRACE(identity ? "identity shortcut" : "projection shortcut");
    Rng rng(66);
    Residual block = identity ? Residual(path(std::make_unique<Conv2D>(4, 4, 3, 1, 1, false),
                                              std::make_unique<BatchNorm2D>(4)),
                                         Path{})
                              : projection_block(4, 8, 2);
    Bound bound(block, rng);
    const Tensor x = uniform_tensor(rng, {5, 4, 6, 6}, -1.0f, 1.0f);
    Tensor y;
    block.forward(view(x), y);
    const Tensor dy = normal_tensor(rng, y.shape());
    expect_same(run_with_threads(bound, x, dy, 1), run_with_threads(bound, x, dy, 2));
  }
}

TEST(Residual, TrainingModeAndReseedingReachTheSubLayers) {
  Rng rng(65);
  Residual block(path(std::make_unique<BatchNorm2D>(2), std::make_unique<Dropout>(0.5f)), Path{});
  Bound bound(block, rng);
  const Tensor x = uniform_tensor(rng, {2, 2, 3, 3}, 1.0f, 2.0f);
  Tensor y1, y2;
  block.reseed(5);
  block.forward(view(x), y1);
  block.reseed(5);
  block.forward(view(x), y2);
  EXPECT_EQ(std::vector<float>(y1.span().begin(), y1.span().end()),
            std::vector<float>(y2.span().begin(), y2.span().end()));

  block.set_training(false);
  const auto* bn = dynamic_cast<BatchNorm2D*>(block.main_path()[0].get());
  ASSERT_NE(bn, nullptr);
  EXPECT_FALSE(bn->training());
  const std::vector<LayerBuffer> buffers = block.buffers();
  const std::vector<float> before(buffers[0].values.begin(), buffers[0].values.end());
  block.forward(view(x), y1);
  block.forward(view(x), y2);  // no dropout, no moving statistics
  EXPECT_EQ(std::vector<float>(buffers[0].values.begin(), buffers[0].values.end()), before);
  EXPECT_EQ(std::vector<float>(y1.span().begin(), y1.span().end()),
            std::vector<float>(y2.span().begin(), y2.span().end()));
}

}  // namespace
}  // namespace asgd
