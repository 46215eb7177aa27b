#pragma once
// Comparisons of a computed tensor against its reference (the GPU against
// the CPU) that no NaN or infinity can slip through: every non-finite
// element where the reference is finite fails the comparison, and the
// message says how many there were and where the first was.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace asgd {

namespace close_detail {

// Counts the elements of `got` that are not finite where `want` is, and
// says so; empty when there are none.
inline std::string nonfinite(std::span<const float> got, std::span<const float> want) {
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) {
      if (count++ == 0) first = i;
    }
  }
  if (count == 0) return "";
  std::ostringstream out;
  out << count << " of " << got.size() << " elements are not finite, the first at " << first << " (" << got[first]
      << " where the reference has " << want[first] << ")";
  return out.str();
}

inline double largest_magnitude(std::span<const float> v) {
  double scale = 0.0;
  for (const float x : v) scale = std::max(scale, std::abs(static_cast<double>(x)));
  return scale;
}

}  // namespace close_detail

/// Every element of `got` within tol x (the largest |want| element) + floor
/// of `want`, and finite wherever `want` is.
inline ::testing::AssertionResult all_close(std::span<const float> got, std::span<const float> want, double tol,
                                            double floor = 1e-7) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements where the reference has " << want.size();
  if (const std::string bad = close_detail::nonfinite(got, want); !bad.empty()) return ::testing::AssertionFailure() << bad;
  const double scale = close_detail::largest_magnitude(want);
  const double bound = tol * scale + floor;
  std::size_t over = 0, worst_at = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (d > bound) ++over;
    if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  if (over == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << over << " of " << want.size() << " elements differ by more than " << bound
                                       << " (tol " << tol << " x tensor scale " << scale << " + " << floor
                                       << "); the worst at " << worst_at << ": " << got[worst_at] << " against "
                                       << want[worst_at];
}

/// For whole models, where one near-tie (a max-pool window, a ReLU input
/// near zero) sends one upstream gradient elsewhere: ||got - want|| within
/// `norm_tol` x ||want|| (+ floor), and the median element's difference
/// within `median_tol` x (the largest |want| element) + floor; finite
/// wherever `want` is.
inline ::testing::AssertionResult close_in_norm(std::span<const float> got, std::span<const float> want,
                                                double norm_tol, double median_tol, double floor = 1e-7) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements where the reference has " << want.size();
  if (const std::string bad = close_detail::nonfinite(got, want); !bad.empty()) return ::testing::AssertionFailure() << bad;
  if (want.empty()) return ::testing::AssertionSuccess();
  double diff2 = 0.0, want2 = 0.0;
  std::vector<double> d(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    d[i] = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    diff2 += d[i] * d[i];
    want2 += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  const double norm = std::sqrt(diff2), want_norm = std::sqrt(want2);
  if (norm > norm_tol * want_norm + floor)
    return ::testing::AssertionFailure() << "||difference|| " << norm << " exceeds " << norm_tol << " x ||reference|| "
                                         << want_norm << " + " << floor;
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
  const double median = d[d.size() / 2];
  const double bound = median_tol * close_detail::largest_magnitude(want) + floor;
  if (median > bound)
    return ::testing::AssertionFailure() << "the median element differs by " << median << ", more than " << bound;
  return ::testing::AssertionSuccess();
}

}  // namespace asgd
