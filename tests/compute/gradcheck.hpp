#pragma once
// Helpers shared by the layer tests. Gradient checks run each layer in
// float32 and differentiate a scalar loss of its output by central
// differences in double. The error measure is
// max_i |analytic_i - numeric_i| / max(1, |numeric_i|); the inputs are scaled
// so that the gradients are of order 1 and the measure is not vacuous.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "base/random.hpp"
#include "compute/tensor.hpp"

namespace asgd::gradcheck {

inline constexpr float kEps = 1e-2f;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline ConstTensorView view(const Tensor& t) { return {t.data(), t.shape()}; }

inline Tensor uniform_tensor(Rng& rng, Shape shape, float lo, float hi) {
  Tensor t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = rng.uniform(lo, hi);
  return t;
}

inline Tensor normal_tensor(Rng& rng, Shape shape, float scale = 1.0f) {
  Tensor t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = scale * rng.normal();
  return t;
}

// sum(y * r) in double: a loss whose gradient with respect to y is r.
inline double probe_loss(const Tensor& y, const Tensor& r) {
  double sum = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * static_cast<double>(r[i]);
  return sum;
}

// dloss/dvalues by central differences, perturbing one element at a time in
// place and restoring it. Divides by the step actually taken in float.
inline std::vector<double> central_differences(std::span<float> values, const std::function<double()>& loss,
                                               float eps = kEps) {
  std::vector<double> numeric(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float saved = values[i];
    const float up = saved + eps;
    const float down = saved - eps;
    values[i] = up;
    const double loss_up = loss();
    values[i] = down;
    const double loss_down = loss();
    values[i] = saved;
    numeric[i] = (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
  }
  return numeric;
}

inline double max_scaled_error(std::span<const float> analytic, const std::vector<double>& numeric) {
  EXPECT_EQ(analytic.size(), numeric.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double err =
        std::abs(static_cast<double>(analytic[i]) - numeric[i]) / std::max(1.0, std::abs(numeric[i]));
    worst = std::max(worst, err);
  }
  return worst;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace asgd::gradcheck
