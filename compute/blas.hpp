#pragma once
// The only place that talks to BLAS. Row-major single-precision GEMM plus the
// thread-count knob (OpenBLAS keeps one process-wide pool, so the runtime sets
// it once per process from its configuration).

#include <cstddef>
#include <string>

namespace asgd::blas {

/// C (m, n) = alpha * op(A) * op(B) + beta * C, row-major, where op(A) is
/// (m, k) and op(B) is (k, n); trans_a / trans_b say the stored matrices are
/// the transposes. lda/ldb/ldc default to the packed row lengths.
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          const float* a, const float* b, float beta, float* c);

/// The kernel set OpenBLAS picked when it loaded ("SkylakeX", "Haswell", ...).
std::string core_name();

/// OpenBLAS 0.3.21 (Debian 12) does not recognise recent Intel server CPUs
/// (Sapphire and Emerald Rapids) and falls back to its generic Prescott
/// kernels, about 4x slower on matrix products. When it has fallen back to
/// those on a CPU with AVX-512 or AVX2, this returns the OPENBLAS_CORETYPE
/// value that selects the right kernels ("SkylakeX", "Haswell"); otherwise
/// empty. OpenBLAS reads the variable only when it loads, so a program has
/// to set it before starting (the asgd CLI re-executes itself once).
std::string suggested_coretype();

/// Sets the number of threads BLAS uses for one call (process-wide).
void set_threads(int threads);
int threads();

}  // namespace asgd::blas
