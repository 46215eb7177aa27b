#include "actors/key_range.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace asgd {
namespace {

TEST(KeyRanges, AreDisjointAndCoverEveryKeyExactlyOnce) {
  for (std::size_t n : {1u, 2u, 7u, 100u, 235146u}) {
    for (std::size_t m = 1; m <= std::min<std::size_t>(n, 9); ++m) {
      const auto ranges = partition_keys(n, m);
      ASSERT_EQ(ranges.size(), m);
      std::vector<int> owners(n, 0);
      for (const auto& r : ranges)
        for (std::size_t k = r.begin; k < r.end; ++k) ++owners[k];
      for (std::size_t k = 0; k < n; ++k) ASSERT_EQ(owners[k], 1) << "key " << k << " n=" << n << " m=" << m;
    }
  }
}

TEST(KeyRanges, AreBalancedBySizeWithinOneKey) {
  const auto ranges = partition_keys(235146, 7);
  std::size_t lo = ranges[0].size(), hi = ranges[0].size();
  for (const auto& r : ranges) {
    lo = std::min(lo, r.size());
    hi = std::max(hi, r.size());
  }
  EXPECT_LE(hi - lo, 1u);
}

TEST(KeyRanges, OwnerOfFindsTheRangeHoldingEachKey) {
  const auto ranges = partition_keys(1000, 3);
  for (std::size_t k = 0; k < 1000; ++k) EXPECT_TRUE(ranges[owner_of(ranges, k)].contains(k)) << k;
  EXPECT_EQ(owner_of(ranges, 0), 0u);
  EXPECT_EQ(owner_of(ranges, 999), 2u);
}

}  // namespace
}  // namespace asgd
