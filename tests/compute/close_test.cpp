// The comparisons the GPU tests use (close.hpp), on the CPU: a NaN or an
// infinity anywhere fails them, whatever else the tensor holds.

#include "tests/compute/close.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace asgd {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string message(const ::testing::AssertionResult& r) { return r.message(); }

TEST(CloseComparison, ANaNAtTheFirstAMiddleOrTheLastPositionFails) {
  const std::vector<float> want(9, 1.0f);
  for (const std::size_t at : {std::size_t{0}, std::size_t{4}, std::size_t{8}}) {
    std::vector<float> got = want;
    got[at] = kNaN;
    SCOPED_TRACE("NaN at " + std::to_string(at));
    const auto element = all_close(got, want, 1e-4);
    EXPECT_FALSE(element);
    EXPECT_NE(message(element).find("1 of 9 elements are not finite, the first at " + std::to_string(at)),
              std::string::npos)
        << message(element);
    EXPECT_FALSE(close_in_norm(got, want, 1e-3, 1e-4));
  }
}

TEST(CloseComparison, CountsEveryNonFiniteElementAndNamesTheFirst) {
  const std::vector<float> want(6, 0.5f);
  const std::vector<float> got = {0.5f, kNaN, 0.5f, kInf, -kInf, 0.5f};
  const auto r = all_close(got, want, 1e-4);
  EXPECT_FALSE(r);
  EXPECT_NE(message(r).find("3 of 6 elements are not finite, the first at 1"), std::string::npos) << message(r);
}

TEST(CloseComparison, EqualTensorsAndDifferencesWithinTheTolerancePass) {
  const std::vector<float> want = {1.0f, -2.0f, 4.0f, 0.0f};
  EXPECT_TRUE(all_close(want, want, 1e-6));
  const std::vector<float> got = {1.0f + 3e-4f, -2.0f, 4.0f, 0.0f};  // 3e-4 < 1e-4 x 4
  EXPECT_TRUE(all_close(got, want, 1e-4));
  EXPECT_FALSE(all_close(got, want, 1e-5));
}

TEST(CloseComparison, TheNormComparisonForgivesOneOutlierButNotAWholeTensorOff) {
  std::vector<float> want(1000);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>((i % 7) + 1);
  std::vector<float> one_off = want;
  one_off[500] += 1.0f;  // one gradient sent elsewhere by a near-tie
  EXPECT_FALSE(all_close(one_off, want, 1e-3));
  EXPECT_TRUE(close_in_norm(one_off, want, 1e-2, 1e-5));
  std::vector<float> all_off = want;
  for (float& v : all_off) v *= 1.001f;  // every element 0.1% off: the median shows it
  EXPECT_FALSE(close_in_norm(all_off, want, 1e-2, 1e-5));
}

TEST(CloseComparison, ASizeMismatchFails) {
  EXPECT_FALSE(all_close(std::vector<float>{1.0f}, std::vector<float>{1.0f, 2.0f}, 1e-3));
  EXPECT_FALSE(close_in_norm(std::vector<float>{1.0f}, std::vector<float>{1.0f, 2.0f}, 1e-3, 1e-3));
}

}  // namespace
}  // namespace asgd
