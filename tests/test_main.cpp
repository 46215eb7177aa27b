#include <gtest/gtest.h>

#include "compute/blas.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Tests run in parallel under ctest; keep each one to one BLAS thread.
  asgd::blas::set_threads(1);
  return RUN_ALL_TESTS();
}
