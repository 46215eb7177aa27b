#include "compute/denormals.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace asgd {
namespace {

float halve(float x) {
  volatile float v = x;  // computed at run time, not folded by the compiler
  return v * 0.5f;
}

TEST(FlushDenormals, FlushesDenormalResultsOnlyWhileAlive) {
  const float tiny = std::numeric_limits<float>::min();  // smallest normal
  EXPECT_GT(halve(tiny), 0.0f);                          // a denormal, not flushed
  {
    const FlushDenormals flush;
    EXPECT_EQ(halve(tiny), 0.0f);
  }
  EXPECT_GT(halve(tiny), 0.0f);  // the thread's previous mode is restored
}

}  // namespace
}  // namespace asgd
