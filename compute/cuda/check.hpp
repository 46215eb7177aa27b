#pragma once
// Check macros for CUDA runtime, cuDNN and cuBLAS calls, and the one
// exception type the backend throws. Host code only (never seen by nvcc).

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace asgd::cuda {

/// The one exception the CUDA backend throws from a DeviceModel's per-step
/// calls (compute_gradients, infer, prefetch): a failed CUDA, cuDNN or
/// cuBLAS call (the message names the call, file, line and the library's
/// error string) or arguments that do not fit the model (wrong sizes, a
/// label out of range). It is a std::runtime_error, so callers that never
/// include CUDA headers (workers) catch std::runtime_error. After a failed
/// library call the DeviceModel should be discarded: a kernel fault leaves
/// the CUDA context unusable. Argument errors are found before any work is
/// queued and leave the model usable.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

// "cudnnConvolutionForward(handle, ...)" -> "cudnnConvolutionForward".
inline std::string_view call_name(std::string_view expr) { return expr.substr(0, expr.find('(')); }

[[noreturn]] inline void fail(std::string_view what, const char* expr, const char* file, int line) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": " + std::string(call_name(expr)) +
              " failed: " + std::string(what));
}

[[noreturn]] inline void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  fail(std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")", expr, file, line);
}

[[noreturn]] inline void fail_cudnn(cudnnStatus_t status, const char* expr, const char* file, int line) {
  // The last error string often says which argument cuDNN disliked.
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string what = cudnnGetErrorString(status);
  if (detail[0] != '\0') what += std::string(" (") + detail + ")";
  fail(what, expr, file, line);
}

[[noreturn]] inline void fail_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  fail(std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")", expr, file, line);
}

}  // namespace detail
}  // namespace asgd::cuda

// Each evaluates `expr` once and throws asgd::cuda::Error unless it succeeded.
#define ASGD_CUDA_CHECK(expr)                                                                                      \
  do {                                                                                                             \
    const cudaError_t asgd_cuda_err_ = (expr);                                                                     \
    if (asgd_cuda_err_ != cudaSuccess) ::asgd::cuda::detail::fail_cuda(asgd_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ASGD_CUDNN_CHECK(expr)                                                         \
  do {                                                                                 \
    const cudnnStatus_t asgd_cudnn_status_ = (expr);                                   \
    if (asgd_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                    \
      ::asgd::cuda::detail::fail_cudnn(asgd_cudnn_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ASGD_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                   \
    const cublasStatus_t asgd_cublas_status_ = (expr);                                   \
    if (asgd_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::asgd::cuda::detail::fail_cublas(asgd_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)
