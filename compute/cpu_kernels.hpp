#pragma once
// Matrix products and the vectorisation switch the CPU layers share. Each
// AVX-512 kernel has a plain reference beside it: the reference runs where
// the CPU lacks AVX-512, and tests/compute/cpu_kernels_test.cpp compares the
// two where it has it. Everything here is single-threaded: layers split
// their work across their ThreadPool themselves.

#include <cstddef>
#include <utility>

namespace asgd::cpu {

inline std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

/// Whether this CPU runs AVX-512F (a property of the CPU, not state).
bool have_avx512();

// Plain loops that GCC vectorises are written once, always inlined, and
// called through vectorised<f>(...), which on an AVX-512 CPU runs them
// inside a function compiled for it: 16-float vectors instead of the 4 of
// the baseline x86-64 build. (target_clones does the same through an ifunc
// resolver, which ThreadSanitizer cannot run.) F itself is the reference.
#define ASGD_VECTOR_LOOP [[gnu::always_inline]] inline

#if defined(__x86_64__)
template <auto F, class... Args>
[[gnu::target("avx512f")]] auto run_avx512(Args&&... args) {
  return F(std::forward<Args>(args)...);
}
#endif

template <auto F, class... Args>
auto vectorised(Args&&... args) {
#if defined(__x86_64__)
  if (have_avx512()) return run_avx512<F>(std::forward<Args>(args)...);
#endif
  return F(std::forward<Args>(args)...);
}

/// The sum of x (n), in double: 16 float lanes, which GCC vectorises (it
/// keeps a plain float sum in order without -ffast-math), added in double.
/// A lane sums at most n / 16 values, so float is as accurate here as
/// PyTorch's double accumulation needs. Call it through vectorised<>.
ASGD_VECTOR_LOOP double plane_sum(const float* __restrict x, std::size_t n) {
  constexpr std::size_t kLanes = 16;
  float lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) lane[j] += x[i + j];
  double total = 0.0;
  for (; i < n; ++i) total += x[i];
  for (float v : lane) total += v;
  return total;
}

/// A matrix read through strides: element (i, r) is data[i * row + r * col],
/// which lets one product read W, W^T or an im2col buffer without copies.
struct Strided {
  const float* data;
  std::size_t row, col;
};

/// C (m, n) = A (m, k) * B (k, n), or C += A B when accumulate; B and C are
/// row-major with leading dimensions ldb and ldc. The AVX-512 register
/// tiles where the CPU has them, else BLAS for packed operands and
/// matmul_reference for the rest.
void matmul(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
            std::size_t ldc, bool accumulate);
void matmul_reference(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb,
                      float* c, std::size_t ldc, bool accumulate);
/// Only on a CPU with AVX-512.
void matmul_avx512(std::size_t m, std::size_t n, std::size_t k, Strided a, const float* b, std::size_t ldb, float* c,
                   std::size_t ldc, bool accumulate);

/// C (ma, mb) += A (ma, n) * B (mb, n)^T, both read along rows.
void dot_products(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda, const float* b,
                  std::size_t ldb, float* c, std::size_t ldc);
void dot_products_reference(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda,
                            const float* b, std::size_t ldb, float* c, std::size_t ldc);
/// Only on a CPU with AVX-512.
void dot_products_avx512(std::size_t ma, std::size_t mb, std::size_t n, const float* a, std::size_t lda,
                         const float* b, std::size_t ldb, float* c, std::size_t ldc);

}  // namespace asgd::cpu
