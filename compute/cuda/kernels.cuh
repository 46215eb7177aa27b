#pragma once
// The backend's own CUDA kernels, behind plain launch functions so that host
// code compiled by the C++ compiler can call them. Each queues its kernel on
// `stream` and returns the launch status (cudaSuccess, or the error to pass
// to ASGD_CUDA_CHECK); nothing is launched for empty inputs. Layouts are
// row-major, NCHW for images; every kernel has its CPU counterpart in
// compute/layers/ (lowerings.cpp says which).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace asgd::cuda::kernels {

/// y (rows, cols) += b (cols) on every row: the dense layer's bias.
cudaError_t add_row_bias(float* y, const float* b, std::size_t rows, std::size_t cols, cudaStream_t stream);

/// y (batch, channels, plane) += b (channels): the convolution's bias.
cudaError_t add_channel_bias(float* y, const float* b, std::size_t batch, std::size_t channels, std::size_t plane,
                             cudaStream_t stream);

/// out (channels) = sum over batch and plane of dy (batch, channels, plane):
/// bias gradients (plane = 1 for a dense layer). Overwrites out.
cudaError_t channel_sum(const float* dy, std::size_t batch, std::size_t channels, std::size_t plane, float* out,
                        cudaStream_t stream);

/// out (n) = a (n) + b (n); out may alias a or b.
cudaError_t add(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream);

/// out (n) = in (n) * mask, mask[i] = 0 with probability p, else 1 / (1 - p)
/// (inverted dropout). The mask is a hash of (seed, i), so forward (in = x)
/// and backward (in = dy) with the same seed apply the same mask and no mask
/// is stored.
cudaError_t dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, cudaStream_t stream);

/// y (n) = x where x > 0, else slope * x: LeakyReLU (cuDNN's activation
/// descriptors have no leaky mode).
cudaError_t leaky_relu(const float* x, float* y, std::size_t n, float slope, cudaStream_t stream);

/// dx (n) = dy where x > 0, else slope * dy.
cudaError_t leaky_relu_backward(const float* x, const float* dy, float* dx, std::size_t n, float slope,
                                cudaStream_t stream);

/// y (rows) = mean of each row of x (rows, plane): global average pooling
/// with rows = batch * channels.
cudaError_t row_mean(const float* x, float* y, std::size_t rows, std::size_t plane, cudaStream_t stream);

/// dx (rows, plane) = dy (rows) / plane, broadcast along each row.
cudaError_t row_mean_backward(const float* dy, float* dx, std::size_t rows, std::size_t plane, cudaStream_t stream);

/// Softmax cross-entropy from log-probabilities logp (batch, classes) and
/// labels (batch,) in [0, classes): dlogits (batch, classes) =
/// (softmax - onehot) / batch and loss (1) = mean of -logp[label].
/// row_loss (batch) is scratch.
cudaError_t softmax_xent(const float* logp, const std::int32_t* labels, std::size_t batch, std::size_t classes,
                         float* dlogits, float* row_loss, float* loss, cudaStream_t stream);

}  // namespace asgd::cuda::kernels
