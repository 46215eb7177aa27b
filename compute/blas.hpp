#pragma once
// The only place that talks to BLAS. Row-major single-precision GEMM plus the
// thread-count knob (OpenBLAS keeps one process-wide pool, so the runtime sets
// it once per process from its configuration).

#include <cstddef>

namespace asgd::blas {

/// C (m, n) = alpha * op(A) * op(B) + beta * C, row-major, where op(A) is
/// (m, k) and op(B) is (k, n); trans_a / trans_b say the stored matrices are
/// the transposes. lda/ldb/ldc default to the packed row lengths.
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          const float* a, const float* b, float beta, float* c);

/// Sets the number of threads BLAS uses for one call (process-wide).
void set_threads(int threads);
int threads();

}  // namespace asgd::blas
