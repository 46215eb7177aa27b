#include "compute/layers/dropout.hpp"

#include <algorithm>

namespace asgd {

void Dropout::forward(ConstTensorView x, Tensor& y) {
  y.resize(x.shape);
  const std::size_t n = x.size();
  if (!training_) {
    mask_.clear();  // backward passes the gradient through unchanged
    std::copy(x.data, x.data + n, y.data());
    return;
  }
  mask_.resize(n);
  // p = 1 drops everything (torch gives zeros, not 0 * inf).
  const float keep_scale = p_ < 1.0f ? 1.0f / (1.0f - p_) : 0.0f;
  for (std::size_t i = 0; i < n; ++i) mask_[i] = rng_.uniform() < p_ ? 0.0f : keep_scale;
  for (std::size_t i = 0; i < n; ++i) y[i] = x.data[i] * mask_[i];
}

void Dropout::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t n = dy.size();
  if (mask_.size() != n) {
    std::copy(dy.data(), dy.data() + n, dx->data());
    return;
  }
  for (std::size_t i = 0; i < n; ++i) (*dx)[i] = dy[i] * mask_[i];
}

}  // namespace asgd
