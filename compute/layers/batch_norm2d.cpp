#include "compute/layers/batch_norm2d.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "compute/cpu_kernels.hpp"
#include "compute/thread_pool.hpp"

namespace asgd {

using cpu::vectorised;

namespace {

// Sums over one channel plane, vectorised as cpu::plane_sum is: 16
// independent float lanes, their total in double (call them through
// vectorised<>).

constexpr std::size_t kLanes = 16;

// sum (x - mean)^2
ASGD_VECTOR_LOOP double plane_sq_dev(const float* __restrict x, std::size_t n, float mean) {
  float lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) {
      const float d = x[i + j] - mean;
      lane[j] += d * d;
    }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(x[i] - mean) * static_cast<double>(x[i] - mean);
  for (float v : lane) total += v;
  return total;
}

// sum dy and sum dy * (x - mean), added to the two totals
ASGD_VECTOR_LOOP void plane_grad_sums(const float* __restrict dy, const float* __restrict x, std::size_t n,
                                        float mean, double& sum_dy, double& sum_dy_dev) {
  float lane_dy[kLanes] = {}, lane_dev[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) lane_dy[j] += dy[i + j];
    for (std::size_t j = 0; j < kLanes; ++j) lane_dev[j] += dy[i + j] * (x[i + j] - mean);
  }
  double total_dy = 0.0, total_dev = 0.0;
  for (; i < n; ++i) {
    total_dy += dy[i];
    total_dev += static_cast<double>(dy[i]) * static_cast<double>(x[i] - mean);
  }
  for (std::size_t j = 0; j < kLanes; ++j) {
    total_dy += lane_dy[j];
    total_dev += lane_dev[j];
  }
  sum_dy += total_dy;
  sum_dy_dev += total_dev;
}

// y = x * scale + shift
ASGD_VECTOR_LOOP void plane_affine(const float* __restrict x, std::size_t n, float scale, float shift,
                                     float* __restrict y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * scale + shift;
}

// dx = a * dy + b * x + c
ASGD_VECTOR_LOOP void plane_affine2(const float* __restrict dy, const float* __restrict x, std::size_t n, float a,
                                      float b, float c, float* __restrict dx) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = a * dy[i] + b * x[i] + c;
}

}  // namespace

// The batch is cut into chunks of samples as Conv2D cuts it, so that each
// thread mostly reads samples the previous layer left in its own core's
// cache (split by channel, half of every read crossed cores: BatchNorm took
// 17% of a resnet step). Statistics are per-chunk partial sums added in
// chunk order between parallel passes, so they do not depend on the threads.

BatchNorm2D::BatchNorm2D(std::size_t channels, float eps, float momentum)
    : c_(channels),
      eps_(eps),
      momentum_(momentum),
      running_mean_(channels, 0.0f),
      running_var_(channels, 1.0f),
      mean_(channels, 0.0f),
      inv_std_(channels, 1.0f) {}

std::vector<ParamSpec> BatchNorm2D::param_specs() const {
  return {{"weight", {c_}, Init::ones, 0}, {"bias", {c_}, Init::zeros, 0}};
}

void BatchNorm2D::bind(std::span<float> params, std::span<float> grads) {
  assert(params.size() == 2 * c_ && grads.size() == params.size());
  gamma_ = params.data();
  beta_ = gamma_ + c_;
  dgamma_ = grads.data();
  dbeta_ = dgamma_ + c_;
}

std::vector<LayerBuffer> BatchNorm2D::buffers() {
  return {{"running_mean", running_mean_}, {"running_var", running_var_}};
}

void BatchNorm2D::begin_recalibration() {
  // torch's reset_running_stats(), then momentum=None averages the batches.
  std::fill(running_mean_.begin(), running_mean_.end(), 0.0f);
  std::fill(running_var_.begin(), running_var_.end(), 1.0f);
  cumulative_ = true;
  batches_seen_ = 0;
}

void BatchNorm2D::end_recalibration() { cumulative_ = false; }

void BatchNorm2D::check_values_per_channel(std::size_t values_per_channel) {
  if (values_per_channel == 1)
    throw std::invalid_argument(
        "BatchNorm2D in training needs more than one value per channel, and this batch gives it one (a batch of 1 "
        "on 1x1 maps): its variance is undefined; train with a batch of at least 2, or put the BatchNorm before "
        "the layer that pools to 1x1");
}

void BatchNorm2D::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4 && x.shape[1] == c_);
  const std::size_t batch = x.shape[0];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const std::size_t n = batch * plane;
  y.resize(x.shape);
  const Chunks chunks = sample_chunks(batch, threads_of(pool_));
  if (partial_.size() < chunks.count * 2 * c_) partial_.resize(chunks.count * 2 * c_);
  // Sums f(plane of sample b, channel c) over the batch per channel, into
  // partial[0][slot].
  auto sum_planes = [&](std::size_t slot, auto f) {
    auto work = [&](std::size_t chunk, std::size_t /*thread*/) {
      double* acc = partial_.data() + (chunk * 2 + slot) * c_;
      std::fill(acc, acc + c_, 0.0);
      const auto [b0, b1] = chunks.range(chunk, batch);
      for (std::size_t b = b0; b < b1; ++b)
        for (std::size_t c = 0; c < c_; ++c) acc[c] += f(x.data + (b * c_ + c) * plane, c);
    };
    run_chunks(pool_, chunks.count, work);
    double* total = partial_.data() + slot * c_;
    for (std::size_t chunk = 1; chunk < chunks.count; ++chunk)
      for (std::size_t c = 0; c < c_; ++c) total[c] += partial_[(chunk * 2 + slot) * c_ + c];
    return total;
  };
  if (training_ && n > 0) {
    check_values_per_channel(n);
    const float factor = cumulative_ ? 1.0f / static_cast<float>(++batches_seen_) : momentum_;
    // Two passes (mean, then squared deviations): E[x^2] - mean^2 would
    // cancel catastrophically for channels far from zero.
    const double* sums =
        sum_planes(0, [&](const float* p, std::size_t) { return vectorised<cpu::plane_sum>(p, plane); });
    for (std::size_t c = 0; c < c_; ++c) mean_[c] = static_cast<float>(sums[c] / static_cast<double>(n));
    const double* sq = sum_planes(
        1, [&](const float* p, std::size_t c) { return vectorised<plane_sq_dev>(p, plane, mean_[c]); });
    for (std::size_t c = 0; c < c_; ++c) {
      const double var = sq[c] / static_cast<double>(n);
      const double unbiased = n > 1 ? sq[c] / static_cast<double>(n - 1) : var;
      inv_std_[c] = static_cast<float>(1.0 / std::sqrt(var + eps_));
      running_mean_[c] = (1.0f - factor) * running_mean_[c] + factor * mean_[c];
      running_var_[c] = (1.0f - factor) * running_var_[c] + factor * static_cast<float>(unbiased);
    }
  } else {
    for (std::size_t c = 0; c < c_; ++c) {
      mean_[c] = running_mean_[c];
      inv_std_[c] = 1.0f / std::sqrt(running_var_[c] + eps_);
    }
  }
  // y = (x - mean) * inv_std * gamma + beta = x * scale + shift
  auto normalise = [&](std::size_t chunk, std::size_t /*thread*/) {
    const auto [b0, b1] = chunks.range(chunk, batch);
    for (std::size_t b = b0; b < b1; ++b)
      for (std::size_t c = 0; c < c_; ++c) {
        const float scale = inv_std_[c] * gamma_[c];
        const float shift = beta_[c] - mean_[c] * scale;
        const std::size_t at = (b * c_ + c) * plane;
        vectorised<plane_affine>(x.data + at, plane, scale, shift, y.data() + at);
      }
  };
  run_chunks(pool_, chunks.count, normalise);
}

void BatchNorm2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const std::size_t n = batch * plane;
  if (dx) dx->resize(x.shape);
  const Chunks chunks = sample_chunks(batch, threads_of(pool_));
  if (partial_.size() < chunks.count * 2 * c_) partial_.resize(chunks.count * 2 * c_);
  auto sums = [&](std::size_t chunk, std::size_t /*thread*/) {
    double* sum_dy = partial_.data() + chunk * 2 * c_;
    double* sum_dy_dev = sum_dy + c_;
    std::fill(sum_dy, sum_dy + 2 * c_, 0.0);
    const auto [b0, b1] = chunks.range(chunk, batch);
    for (std::size_t b = b0; b < b1; ++b)
      for (std::size_t c = 0; c < c_; ++c) {
        const std::size_t at = (b * c_ + c) * plane;
        vectorised<plane_grad_sums>(dy.data() + at, x.data + at, plane, mean_[c], sum_dy[c], sum_dy_dev[c]);
      }
  };
  run_chunks(pool_, chunks.count, sums);
  coef_.resize(3 * c_);
  for (std::size_t c = 0; c < c_; ++c) {
    double sum_dy = 0.0, sum_dy_dev = 0.0;
    for (std::size_t chunk = 0; chunk < chunks.count; ++chunk) {
      sum_dy += partial_[chunk * 2 * c_ + c];
      sum_dy_dev += partial_[(chunk * 2 + 1) * c_ + c];
    }
    const float mean = mean_[c], inv_std = inv_std_[c];
    const double sum_dy_xhat = sum_dy_dev * inv_std;
    dbeta_[c] = static_cast<float>(sum_dy);
    dgamma_[c] = static_cast<float>(sum_dy_xhat);
    // dx = k (dy - mean(dy) - xhat mean(dy xhat)) with k = gamma inv_std in
    // training mode, where the batch statistics depend on x too; in
    // inference mode the layer is affine and dx = k dy. Written as
    // dx = a dy + b x + c, with xhat = (x - mean) inv_std.
    const float k = gamma_[c] * inv_std;
    double mean_dy = 0.0, mean_dy_xhat = 0.0;
    if (training_ && n > 0) {
      mean_dy = sum_dy / static_cast<double>(n);
      mean_dy_xhat = sum_dy_xhat / static_cast<double>(n);
    }
    const double slope = -static_cast<double>(k) * mean_dy_xhat * inv_std;  // per unit of x
    coef_[c] = k;
    coef_[c_ + c] = static_cast<float>(slope);
    coef_[2 * c_ + c] = static_cast<float>(-k * mean_dy - slope * mean);
  }
  if (!dx) return;
  auto input_grads = [&](std::size_t chunk, std::size_t /*thread*/) {
    const auto [b0, b1] = chunks.range(chunk, batch);
    for (std::size_t b = b0; b < b1; ++b)
      for (std::size_t c = 0; c < c_; ++c) {
        const std::size_t at = (b * c_ + c) * plane;
        vectorised<plane_affine2>(dy.data() + at, x.data + at, plane, coef_[c], coef_[c_ + c], coef_[2 * c_ + c],
                      dx->data() + at);
      }
  };
  run_chunks(pool_, chunks.count, input_grads);
}

}  // namespace asgd
