#include "compute/loss.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace asgd {

float SoftmaxCrossEntropy::forward(ConstTensorView logits, std::span<const std::int32_t> labels) {
  const std::size_t batch = logits.shape[0];
  const std::size_t classes = logits.shape[1];
  assert(labels.size() == batch);
  probs_.resize({batch, classes});
  double loss = 0.0;
  for (std::size_t r = 0; r < batch; ++r) {
    const float* z = logits.data + r * classes;
    float* p = probs_.data() + r * classes;
    const float zmax = *std::max_element(z, z + classes);
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) {
      p[c] = std::exp(z[c] - zmax);
      sum += p[c];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (std::size_t c = 0; c < classes; ++c) p[c] *= inv;
    // log-sum-exp form keeps the loss finite even when p underflows to 0.
    loss += std::log(sum) - static_cast<double>(z[labels[r]] - zmax);
  }
  return static_cast<float>(loss / static_cast<double>(batch));
}

void SoftmaxCrossEntropy::backward(std::span<const std::int32_t> labels, Tensor& dlogits) const {
  const std::size_t batch = probs_.dim(0);
  const std::size_t classes = probs_.dim(1);
  dlogits.resize(probs_.shape());
  const float scale = 1.0f / static_cast<float>(batch);
  for (std::size_t r = 0; r < batch; ++r) {
    const float* p = probs_.data() + r * classes;
    float* d = dlogits.data() + r * classes;
    for (std::size_t c = 0; c < classes; ++c) d[c] = p[c] * scale;
    d[labels[r]] -= scale;
  }
}

std::size_t SoftmaxCrossEntropy::correct(std::span<const std::int32_t> labels) const {
  const std::size_t batch = probs_.dim(0);
  const std::size_t classes = probs_.dim(1);
  std::size_t hits = 0;
  for (std::size_t r = 0; r < batch; ++r) {
    const float* p = probs_.data() + r * classes;
    const auto best = static_cast<std::int32_t>(std::max_element(p, p + classes) - p);
    hits += best == labels[r];
  }
  return hits;
}

}  // namespace asgd
