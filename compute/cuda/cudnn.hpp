#pragma once
// Owning handles for cuDNN and cuBLAS objects, for the CUDA backend's host
// code. Move-only; each frees its object on destruction.

#include <cublas_v2.h>
#include <cudnn.h>

#include <cstddef>
#include <utility>

#include "compute/cuda/check.hpp"

namespace asgd::cuda {

// Owns one cuDNN object (the handle or a descriptor), created on first use.
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnObject {
 public:
  CudnnObject() = default;
  ~CudnnObject() {
    if (h_) Destroy(h_);
  }
  CudnnObject(CudnnObject&& other) noexcept : h_(std::exchange(other.h_, nullptr)) {}
  CudnnObject& operator=(CudnnObject&&) = delete;
  CudnnObject(const CudnnObject&) = delete;
  CudnnObject& operator=(const CudnnObject&) = delete;

  T get() {
    if (!h_) ASGD_CUDNN_CHECK(Create(&h_));
    return h_;
  }

 private:
  T h_ = nullptr;
};
using CudnnHandle = CudnnObject<cudnnHandle_t, cudnnCreate, cudnnDestroy>;
using TensorDesc = CudnnObject<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = CudnnObject<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    CudnnObject<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = CudnnObject<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;
using ActDesc =
    CudnnObject<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor>;

class CublasHandle {
 public:
  CublasHandle() { ASGD_CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// cuDNN and cuBLAS take int sizes; plan and batch checks keep every size
// below INT_MAX, so this never truncates.
inline int to_int(std::size_t n) { return static_cast<int>(n); }

}  // namespace asgd::cuda
