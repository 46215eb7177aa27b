#pragma once
// The only place that talks to BLAS. Row-major single-precision GEMM plus the
// thread-count knob. OpenBLAS keeps one process-wide thread count, which
// cannot give two jobs in one process two budgets, so asgd's layers call it
// single-threaded from their own pools (ComputeContext sets the count to 1
// and each Dense layer splits its products across its model's threads).

#include <cstddef>
#include <string>
#include <utility>

#include "asgd/status.hpp"

namespace asgd::blas {

/// C (m, n) = alpha * op(A) * op(B) + beta * C, row-major, where op(A) is
/// (m, k) and op(B) is (k, n); trans_a / trans_b say the stored matrices are
/// the transposes. lda/ldb/ldc default to the packed row lengths.
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          const float* a, const float* b, float beta, float* c);

/// The same with explicit leading dimensions (the stored matrices' row
/// lengths), for products on blocks of rows or columns.
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
          std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

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

/// Makes OpenBLAS hold a work buffer for each of `callers` matrix products
/// that may run at once. OpenBLAS takes a 128 MiB buffer the first time a
/// product runs beside as many others, keeps it for the process's life, and
/// when it cannot get one it retries forever: a job whose workers used up
/// the address space before their first products never ended (its threads
/// spun in the allocator, and stopping it waited for them). Reserving the
/// buffers before the job builds its models makes memory that is not there
/// fail an allocation of asgd's, which ends the job with an error. Also
/// reserves one for each of OpenBLAS's own threads (see blas.cpp). Checks
/// first that each buffer fits, and says so when one does not. The buffers
/// cost address space, not resident memory (OpenBLAS does not touch them).
Status reserve_buffers(std::size_t callers);

/// One job's claim on OpenBLAS's buffers, for as long as the job runs: jobs
/// that run at once in one process (two asgd::Runtimes, or one running two)
/// multiply at once too, so each claim reserves buffers for its own
/// products and every other live claim's (reserve_buffers of the sum).
class BufferClaim {
 public:
  /// Claims `callers` more. Errors: as reserve_buffers (nothing claimed).
  static Result<BufferClaim> make(std::size_t callers);
  BufferClaim(BufferClaim&& other) noexcept : callers_(std::exchange(other.callers_, 0)) {}
  BufferClaim& operator=(BufferClaim&&) = delete;
  BufferClaim(const BufferClaim&) = delete;
  ~BufferClaim();  ///< the buffers stay in OpenBLAS's pool; the sum drops

 private:
  explicit BufferClaim(std::size_t callers) : callers_(callers) {}
  std::size_t callers_;
};

/// Sets the number of threads BLAS uses for one call (process-wide; see above).
void set_threads(int threads);
int threads();

}  // namespace asgd::blas
