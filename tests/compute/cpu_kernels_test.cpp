// Each AVX-512 kernel against its plain reference, on shapes with partial
// tiles and vectors. They skip on a CPU without AVX-512, where the
// references are what runs.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "compute/cpu_kernels.hpp"
#include "compute/im2col.hpp"
#include "base/random.hpp"

namespace asgd::cpu {
namespace {

#define SKIP_WITHOUT_AVX512() \
  if (!have_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: the references are what runs"

std::vector<float> random_values(Rng& rng, std::size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

// Within float rounding of a sum of k products of values in [-1, 1].
void expect_close(const std::vector<float>& a, const std::vector<float>& b, std::size_t k) {
  ASSERT_EQ(a.size(), b.size());
  const float tol = 1e-6f * static_cast<float>(k) + 1e-6f;
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << "element " << i;
}

TEST(CpuKernels, TheAvx512ProductMatchesTheReferenceOnEveryTileShape) {
  SKIP_WITHOUT_AVX512();
  Rng rng(1);
  struct Case {
    std::size_t m, n, k;
  };
  for (const Case c : {Case{1, 1, 1}, Case{7, 17, 5}, Case{8, 16, 25}, Case{13, 50, 9}, Case{6, 64, 33},
                       Case{32, 100, 144}}) {
    SCOPED_TRACE(testing::Message() << c.m << "x" << c.n << "x" << c.k);
    const std::size_t ldb = c.n + 3, ldc = c.n + 5;
    const auto a = random_values(rng, c.m * c.k), b = random_values(rng, c.k * ldb);
    for (const bool transposed : {false, true}) {
      // A read as (m, k), or through its transpose stored (k, m).
      const Strided sa = transposed ? Strided{a.data(), 1, c.m} : Strided{a.data(), c.k, 1};
      for (const bool accumulate : {false, true}) {
        std::vector<float> c1 = random_values(rng, c.m * ldc), c2 = c1;
        matmul_avx512(c.m, c.n, c.k, sa, b.data(), ldb, c1.data(), ldc, accumulate);
        matmul_reference(c.m, c.n, c.k, sa, b.data(), ldb, c2.data(), ldc, accumulate);
        expect_close(c1, c2, c.k);
      }
    }
  }
}

TEST(CpuKernels, TheAvx512DotProductsMatchTheReference) {
  SKIP_WITHOUT_AVX512();
  Rng rng(2);
  for (const std::size_t n : {1u, 9u, 16u, 37u, 300u}) {
    const std::size_t ma = 6, mb = 9, lda = n + 2, ldb = n + 1, ldc = mb + 3;
    const auto a = random_values(rng, ma * lda), b = random_values(rng, mb * ldb);
    std::vector<float> c1 = random_values(rng, ma * ldc), c2 = c1;
    dot_products_avx512(ma, mb, n, a.data(), lda, b.data(), ldb, c1.data(), ldc);
    dot_products_reference(ma, mb, n, a.data(), lda, b.data(), ldb, c2.data(), ldc);
    expect_close(c1, c2, n);
  }
}

TEST(CpuKernels, TheAvx512Im2colAndCol2imMatchTheReference) {
  SKIP_WITHOUT_AVX512();
  Rng rng(3);
  // c, h, w, k, s, pad: the models' shapes and odd ones, strides 1 and 2.
  const std::vector<std::vector<std::size_t>> cases = {
      {1, 28, 28, 5, 1, 0}, {16, 14, 14, 3, 2, 1}, {3, 7, 6, 3, 1, 1}, {2, 4, 37, 3, 2, 1}, {4, 6, 6, 1, 2, 0}};
  for (const auto& v : cases) {
    const std::size_t oh = conv_out(v[1], v[3], v[4], v[5]), ow = conv_out(v[2], v[3], v[4], v[5]);
    const ConvGeometry g{v[0], v[1], v[2], v[3], v[4], v[5], oh, ow};
    ASSERT_TRUE(vector_im2col(g));
    const std::size_t ld = g.plane() + 7;
    const auto x = random_values(rng, g.c * g.h * g.w);
    std::vector<float> padded(g.c * (g.h + 2 * g.pad) * (g.w + 2 * g.pad));
    std::vector<float> col1(g.rows() * ld, 0.0f), col2 = col1;
    im2col_avx512(g, x.data(), padded.data(), col1.data(), ld);
    im2col_reference(g, x.data(), col2.data(), ld);
    for (std::size_t r = 0; r < g.rows(); ++r)
      for (std::size_t p = 0; p < g.plane(); ++p) ASSERT_EQ(col1[r * ld + p], col2[r * ld + p]);
    const auto col = random_values(rng, g.rows() * ld);
    std::vector<float> dx1(x.size()), dx2(x.size());
    col2im_avx512(g, col.data(), ld, padded.data(), dx1.data());
    col2im_reference(g, col.data(), ld, dx2.data());
    expect_close(dx1, dx2, g.k * g.k);
  }
}

}  // namespace
}  // namespace asgd::cpu
