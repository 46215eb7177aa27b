#include "compute/layers/global_avg_pool.hpp"

#include <algorithm>
#include <cassert>

namespace asgd {

Shape GlobalAvgPool::output_shape(const Shape& input) const {
  assert(input.size() == 3);
  return {input[0]};
}

void GlobalAvgPool::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4);
  const std::size_t planes = x.shape[0] * x.shape[1];
  const std::size_t plane = x.shape[2] * x.shape[3];
  y.resize({x.shape[0], x.shape[1]});
  const float scale = 1.0f / static_cast<float>(plane);
  for (std::size_t i = 0; i < planes; ++i) {
    const float* in = x.data + i * plane;
    float sum = 0.0f;
    for (std::size_t j = 0; j < plane; ++j) sum += in[j];
    y[i] = sum * scale;
  }
}

void GlobalAvgPool::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  const std::size_t planes = x.shape[0] * x.shape[1];
  const std::size_t plane = x.shape[2] * x.shape[3];
  const float scale = 1.0f / static_cast<float>(plane);
  for (std::size_t i = 0; i < planes; ++i) {
    float* out = dx->data() + i * plane;
    std::fill(out, out + plane, dy[i] * scale);
  }
}

}  // namespace asgd
