#include "base/random.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>

namespace asgd {
namespace {

TEST(Rng, TheSameSeedGivesTheSameStream) {
  Rng a(42), b(42);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.next(), b.next()) << "draw " << i;
}

TEST(Rng, DifferentSeedsGiveDifferentStreams) {
  Rng a(42), b(43);
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += a.next() == b.next();
  EXPECT_EQ(equal, 0);
}

TEST(Rng, AZeroSeedStillGivesAVaryingStream) {
  // xoshiro's all-zero state is a fixed point; seeding through SplitMix64
  // must avoid it.
  Rng rng(0);
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 100; ++i) seen.insert(rng.next());
  EXPECT_EQ(seen.size(), 100u);
}

TEST(Rng, UniformLiesInTheHalfOpenUnitInterval) {
  Rng rng(7);
  float lo = 1.0f, hi = 0.0f;
  double sum = 0.0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const float u = rng.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
  }
  // The draws cover the interval rather than sitting in one corner of it.
  EXPECT_LT(lo, 1e-3f);
  EXPECT_GT(hi, 1.0f - 1e-3f);
  EXPECT_NEAR(sum / kDraws, 0.5, 0.01);
}

TEST(Rng, UniformWithBoundsStaysWithinThem) {
  // Inclusive at the top: float rounding in lo + (hi - lo) * u can land on
  // hi when |lo| is large next to hi - lo (uniform(1, 1.5) can return 1.5).
  Rng rng(8);
  for (int i = 0; i < 10000; ++i) {
    const float u = rng.uniform(-3.0f, 5.0f);
    ASSERT_GE(u, -3.0f);
    ASSERT_LE(u, 5.0f);
  }
}

TEST(Rng, BelowStaysUnderItsBound) {
  Rng rng(9);
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{1000},
                        std::size_t{1} << 40}) {
    for (int i = 0; i < 10000; ++i) ASSERT_LT(rng.below(n), n) << "n = " << n;
  }
}

TEST(Rng, BelowIsRoughlyUniformOverTenBins) {
  Rng rng(10);
  constexpr std::size_t kBins = 10;
  constexpr int kDraws = 100000;
  std::array<int, kBins> counts{};
  for (int i = 0; i < kDraws; ++i) ++counts[rng.below(kBins)];
  const double expected = static_cast<double>(kDraws) / kBins;
  double chi2 = 0.0;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  // Chi-square with 9 degrees of freedom has mean 9; 40 is beyond p = 1e-5.
  EXPECT_LT(chi2, 40.0);
}

TEST(Rng, NormalHasZeroMeanAndUnitStandardDeviation) {
  Rng rng(11);
  constexpr int kDraws = 100000;
  double sum = 0.0, sum_sq = 0.0;
  int beyond_two_sigma = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double z = rng.normal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
    beyond_two_sigma += std::abs(z) > 2.0;
  }
  const double mean = sum / kDraws;
  const double stddev = std::sqrt(sum_sq / kDraws - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(stddev, 1.0, 0.02);
  // A Gaussian puts 4.55% of its mass beyond two sigma; a uniform of the
  // same variance puts none there.
  EXPECT_NEAR(static_cast<double>(beyond_two_sigma) / kDraws, 0.0455, 0.005);
}

TEST(RngMixSeed, ChangesWhenAnyArgumentChanges) {
  const std::uint64_t base = mix_seed(1, 2, 3);
  EXPECT_NE(mix_seed(4, 2, 3), base);
  EXPECT_NE(mix_seed(1, 4, 3), base);
  EXPECT_NE(mix_seed(1, 2, 4), base);
  EXPECT_NE(mix_seed(2, 1, 3), base);
  EXPECT_NE(mix_seed(3, 2, 1), base);
}

TEST(RngMixSeed, GivesDistinctSeedsOverASmallGrid) {
  // seed x worker x epoch, the way the runtime derives its streams.
  std::set<std::uint64_t> seeds;
  constexpr std::uint64_t kSide = 16;
  for (std::uint64_t a = 0; a < kSide; ++a)
    for (std::uint64_t b = 0; b < kSide; ++b)
      for (std::uint64_t c = 0; c < kSide; ++c) seeds.insert(mix_seed(a, b, c));
  EXPECT_EQ(seeds.size(), kSide * kSide * kSide);
}

TEST(RngMixSeed, IsDeterministicAndDefaultsTheThirdArgumentToZero) {
  EXPECT_EQ(mix_seed(5, 6, 7), mix_seed(5, 6, 7));
  EXPECT_EQ(mix_seed(5, 6), mix_seed(5, 6, 0));
}

}  // namespace
}  // namespace asgd
