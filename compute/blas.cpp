#include "compute/blas.hpp"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <vector>

// OpenBLAS's own work-buffer pool (driver/others/memory.c): exported by
// libopenblas though not declared in cblas.h.
extern "C" void* blas_memory_alloc(int procpos);
extern "C" void blas_memory_free(void* buffer);

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

namespace {

// What OpenBLAS 0.3.21 maps for one buffer: BUFFER_SIZE (128 MiB on x86-64)
// and a page.
constexpr std::size_t kBufferBytes = (std::size_t{128} << 20) + 4096;
// Far more products at once than a 2-to-64-core host runs; OpenBLAS's table
// holds 128 buffers.
constexpr std::size_t kMostCallers = 32;

// Whether `bytes` more of address space can be mapped now.
bool address_space_for(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  ::munmap(p, bytes);
  return true;
}

}  // namespace

Status reserve_buffers(std::size_t callers) {
  // And one for each of OpenBLAS's own threads, which take theirs when they
  // start: in a process a few milliseconds old, that can be after this, and
  // a buffer reserved here would then be theirs for good (a test that
  // reserved for its two products alone hung 4 runs in 20 under load).
  callers += static_cast<std::size_t>(std::max(openblas_get_num_procs() - 1, 0));
  callers = std::clamp<std::size_t>(callers, 1, kMostCallers);
  std::vector<void*> held;
  Status status;
  // Held all at once, so that each call finds the earlier ones taken: a
  // buffer already in the pool is handed out again without a new mapping.
  for (std::size_t i = 0; i < callers; ++i) {
    if (!address_space_for(kBufferBytes)) {
      status = Status::Unavailable("out of memory: no room for BLAS work buffer " + std::to_string(i + 1) + " of " +
                                   std::to_string(callers) +
                                   " (128 MiB each); a job of fewer workers or a smaller model may fit");
      break;
    }
    held.push_back(blas_memory_alloc(0));
  }
  for (void* buffer : held) blas_memory_free(buffer);
  return status;
}

namespace {
std::mutex claims_mu;
std::size_t claimed = 0;  // the live claims' callers, summed
}  // namespace

Result<BufferClaim> BufferClaim::make(std::size_t callers) {
  {
    std::lock_guard lock(claims_mu);
    if (Status s = reserve_buffers(claimed + callers); !s.ok()) return s;
    claimed += callers;
  }
  return BufferClaim(callers);  // the moved-from temporary's destructor takes the lock
}

BufferClaim::~BufferClaim() {
  if (callers_ == 0) return;  // moved from
  std::lock_guard lock(claims_mu);
  claimed -= callers_;
}

void set_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

int threads() { return openblas_get_num_threads(); }

}  // namespace asgd::blas
