#include "compute/layers/flatten.hpp"

#include <algorithm>

namespace asgd {

void Flatten::forward(ConstTensorView x, Tensor& y) {
  const std::size_t batch = x.shape[0];
  y.resize({batch, batch ? x.size() / batch : 0});
  std::copy(x.data, x.data + x.size(), y.data());
}

void Flatten::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  dx->resize(x.shape);
  std::copy(dy.data(), dy.data() + dy.size(), dx->data());
}

}  // namespace asgd
