#include "compute/blas.hpp"

#include <cblas.h>

namespace asgd::blas {

void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          const float* a, const float* b, float beta, float* c) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
          std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

std::string core_name() { return openblas_get_corename(); }

std::string suggested_coretype() {
  const std::string core = core_name();
  // The generic x86-64 kernel sets OpenBLAS uses when it does not know a CPU.
  if (core != "Prescott" && core != "Core2" && core != "Nehalem" && core != "Sandybridge") return "";
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && core != "Haswell") return "Haswell";
  return "";
}

void set_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

int threads() { return openblas_get_num_threads(); }

}  // namespace asgd::blas
