#include "compute/layers/dense.hpp"

#include <algorithm>
#include <cassert>

#include "compute/blas.hpp"
#include "compute/thread_pool.hpp"

namespace asgd {

namespace {

// Products of fewer multiply-adds run on one thread, where splitting costs
// more than it saves (OpenBLAS's own threshold for threading a GEMM).
constexpr std::size_t kSplitWork = std::size_t{1} << 18;

// Calls product(begin, end) on [0, rows) cut into one block of rows per
// thread of `pool`, each doing `work_per_row` multiply-adds per row.
template <class F>
void split_rows(ThreadPool* pool, std::size_t rows, std::size_t work_per_row, F&& product) {
  const std::size_t parts = rows * work_per_row < kSplitWork ? 1 : std::min(threads_of(pool), rows);
  if (parts <= 1) return product(std::size_t{0}, rows);
  auto part = [&](std::size_t p, std::size_t /*thread*/) { product(rows * p / parts, rows * (p + 1) / parts); };
  pool->run(parts, part);
}

}  // namespace

Shape Dense::output_shape([[maybe_unused]] const Shape& input) const {
  assert(numel(input) == in_);
  return {out_};
}

std::vector<ParamSpec> Dense::param_specs() const {
  return {{"weight", {out_, in_}, Init::he_uniform, in_}, {"bias", {out_}, Init::zeros, in_}};
}

void Dense::bind(std::span<float> params, std::span<float> grads) {
  assert(params.size() == out_ * in_ + out_ && grads.size() == params.size());
  w_ = params.data();
  b_ = w_ + out_ * in_;
  dw_ = grads.data();
  db_ = dw_ + out_ * in_;
}

void Dense::forward(ConstTensorView x, Tensor& y) {
  const std::size_t batch = x.shape[0];
  y.resize({batch, out_});
  float* out = y.data();
  split_rows(pool_, batch, in_ * out_, [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r) std::copy(b_, b_ + out_, out + r * out_);
    // y (B, out) += x (B, in) * W^T (in, out)
    blas::gemm(false, true, r1 - r0, out_, in_, 1.0f, x.data + r0 * in_, w_, 1.0f, out + r0 * out_);
  });
}

void Dense::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  // dW (out, in) = dy^T (out, B) * x (B, in), a block of dW's rows per thread.
  split_rows(pool_, out_, batch * in_, [&](std::size_t o0, std::size_t o1) {
    blas::gemm(true, false, o1 - o0, in_, batch, 1.0f, dy.data() + o0, out_, x.data, in_, 0.0f, dw_ + o0 * in_, in_);
  });
  std::fill(db_, db_ + out_, 0.0f);
  for (std::size_t r = 0; r < batch; ++r) {
    const float* row = dy.data() + r * out_;
    for (std::size_t j = 0; j < out_; ++j) db_[j] += row[j];
  }
  if (dx) {
    dx->resize(x.shape);
    // dx (B, in) = dy (B, out) * W (out, in)
    split_rows(pool_, batch, in_ * out_, [&](std::size_t r0, std::size_t r1) {
      blas::gemm(false, false, r1 - r0, in_, out_, 1.0f, dy.data() + r0 * out_, w_, 0.0f, dx->data() + r0 * in_);
    });
  }
}

}  // namespace asgd
