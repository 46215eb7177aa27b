#include "compute/cuda/kernels.cuh"

namespace asgd::cuda::kernels {
namespace {

constexpr unsigned kThreads = 256;

// Grid-stride launches: enough blocks to fill the GPU, never more than the
// work needs.
unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

#define ASGD_GRID_STRIDE(i, n)                                                      \
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::size_t{gridDim.x} * blockDim.x)

__global__ void add_row_bias_kernel(float* y, const float* b, std::size_t rows, std::size_t cols) {
  ASGD_GRID_STRIDE(i, rows * cols) y[i] += b[i % cols];
}

__global__ void add_channel_bias_kernel(float* y, const float* b, std::size_t n, std::size_t channels,
                                        std::size_t plane) {
  ASGD_GRID_STRIDE(i, n) y[i] += b[(i / plane) % channels];
}

// One block per channel; a fixed reduction tree, so the sum is the same on
// every run.
__global__ void channel_sum_kernel(const float* dy, std::size_t batch, std::size_t channels, std::size_t plane,
                                   float* out) {
  __shared__ float partial[kThreads];
  const std::size_t c = blockIdx.x;
  float sum = 0.0f;
  for (std::size_t j = threadIdx.x; j < batch * plane; j += blockDim.x) {
    const std::size_t b = j / plane, p = j % plane;
    sum += dy[(b * channels + c) * plane + p];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[c] = partial[0];
}

__global__ void add_kernel(const float* a, const float* b, float* out, std::size_t n) {
  ASGD_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

// SplitMix64's finaliser over a counter: a stateless generator, so each
// element's draw depends only on (seed, i).
__device__ std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

__global__ void dropout_kernel(const float* in, float* out, std::size_t n, float p, float scale, std::uint64_t seed) {
  ASGD_GRID_STRIDE(i, n) {
    // 24 random bits, uniform in [0, 1) like Rng::uniform.
    const float u = static_cast<float>(mix(seed + (i + 1) * 0x9E3779B97F4A7C15ULL) >> 40) * (1.0f / 16777216.0f);
    out[i] = in[i] * (u >= p ? scale : 0.0f);  // a dropped NaN stays NaN, as the CPU's x * mask
  }
}

__global__ void leaky_relu_kernel(const float* x, float* y, std::size_t n, float slope) {
  ASGD_GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : slope * x[i];
}

__global__ void leaky_relu_backward_kernel(const float* x, const float* dy, float* dx, std::size_t n, float slope) {
  ASGD_GRID_STRIDE(i, n) dx[i] = x[i] > 0.0f ? dy[i] : slope * dy[i];
}

__global__ void row_mean_kernel(const float* x, float* y, std::size_t rows, std::size_t plane) {
  ASGD_GRID_STRIDE(r, rows) {
    const float* row = x + r * plane;
    float sum = 0.0f;
    for (std::size_t p = 0; p < plane; ++p) sum += row[p];
    y[r] = sum / static_cast<float>(plane);
  }
}

__global__ void row_mean_backward_kernel(const float* dy, float* dx, std::size_t rows, std::size_t plane) {
  const float inv = 1.0f / static_cast<float>(plane);
  ASGD_GRID_STRIDE(i, rows * plane) dx[i] = dy[i / plane] * inv;
}

__global__ void softmax_xent_grad_kernel(const float* logp, const std::int32_t* labels, std::size_t batch,
                                         std::size_t classes, float* dlogits, float* row_loss) {
  const float scale = 1.0f / static_cast<float>(batch);
  ASGD_GRID_STRIDE(i, batch * classes) {
    const std::size_t r = i / classes, c = i % classes;
    const bool hit = static_cast<std::size_t>(labels[r]) == c;
    dlogits[i] = (expf(logp[i]) - (hit ? 1.0f : 0.0f)) * scale;
    if (hit) row_loss[r] = -logp[i];
  }
}

// One block; the mean is accumulated in double, like the CPU loss.
__global__ void mean_kernel(const float* v, std::size_t n, float* out) {
  __shared__ double partial[kThreads];
  double sum = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) sum += v[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<float>(partial[0] / static_cast<double>(n));
}

}  // namespace

cudaError_t add_row_bias(float* y, const float* b, std::size_t rows, std::size_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  add_row_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(y, b, rows, cols);
  return cudaGetLastError();
}

cudaError_t add_channel_bias(float* y, const float* b, std::size_t batch, std::size_t channels, std::size_t plane,
                             cudaStream_t stream) {
  const std::size_t n = batch * channels * plane;
  if (n == 0) return cudaSuccess;
  add_channel_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, b, n, channels, plane);
  return cudaGetLastError();
}

cudaError_t channel_sum(const float* dy, std::size_t batch, std::size_t channels, std::size_t plane, float* out,
                        cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  channel_sum_kernel<<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(dy, batch, channels, plane, out);
  return cudaGetLastError();
}

cudaError_t add(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t leaky_relu(const float* x, float* y, std::size_t n, float slope, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  leaky_relu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n, slope);
  return cudaGetLastError();
}

cudaError_t leaky_relu_backward(const float* x, const float* dy, float* dx, std::size_t n, float slope,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  leaky_relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, dy, dx, n, slope);
  return cudaGetLastError();
}

cudaError_t dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  dropout_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, n, p, scale, seed);
  return cudaGetLastError();
}

cudaError_t row_mean(const float* x, float* y, std::size_t rows, std::size_t plane, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  row_mean_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(x, y, rows, plane);
  return cudaGetLastError();
}

cudaError_t row_mean_backward(const float* dy, float* dx, std::size_t rows, std::size_t plane, cudaStream_t stream) {
  if (rows * plane == 0) return cudaSuccess;
  row_mean_backward_kernel<<<blocks_for(rows * plane), kThreads, 0, stream>>>(dy, dx, rows, plane);
  return cudaGetLastError();
}

cudaError_t softmax_xent(const float* logp, const std::int32_t* labels, std::size_t batch, std::size_t classes,
                         float* dlogits, float* row_loss, float* loss, cudaStream_t stream) {
  if (batch * classes == 0) return cudaSuccess;
  softmax_xent_grad_kernel<<<blocks_for(batch * classes), kThreads, 0, stream>>>(logp, labels, batch, classes, dlogits,
                                                                                 row_loss);
  mean_kernel<<<1, kThreads, 0, stream>>>(row_loss, batch, loss);
  return cudaGetLastError();
}

}  // namespace asgd::cuda::kernels
