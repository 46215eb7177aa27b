#pragma once
// Dense (torch.nn.Linear) on the CPU, through BLAS.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compute/layer.hpp"

namespace asgd {

/// y = x W^T + b with W (out, in) and b (out): torch.nn.Linear's layout.
class Dense final : public Layer {
 public:
  Dense(std::size_t in, std::size_t out) : in_(in), out_(out) {}
  std::string kind() const override { return "dense"; }
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::span<float> params, std::span<float> grads) override;
  void set_pool(ThreadPool* pool) override { pool_ = pool; }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::size_t in() const { return in_; }
  std::size_t out() const { return out_; }

 private:
  std::size_t in_, out_;
  float* w_ = nullptr;   // (out, in)
  float* b_ = nullptr;   // (out,)
  float* dw_ = nullptr;  // (out, in)
  float* db_ = nullptr;  // (out,)
  ThreadPool* pool_ = nullptr;  // the model's; null: the calling thread alone
};

}  // namespace asgd
