#pragma once
// Residual: a block of two paths whose outputs add (ResNet's basic block).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/layer.hpp"

namespace asgd {

/// y = main(x) + shortcut(x), where each path is a sequence of layers and an
/// empty shortcut is the identity: the body of a ResNet basic block (the
/// ReLU after the add is a separate layer). Parameters are main's then
/// shortcut's, named "main.I.*" and "shortcut.I.*".
class Residual final : public Layer {
 public:
  Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut);
  ~Residual() override;
  std::string kind() const override { return "residual"; }
  Shape output_shape(const Shape& input) const override;
  std::size_t activation_floats(const Shape& input) const override;  // both paths' layers' and the sum
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::span<float> params, std::span<float> grads) override;
  void set_training(bool training) override;
  std::vector<LayerBuffer> buffers() override;  // "main.I.running_mean", ...
  std::vector<Layer*> children() override;
  void set_pool(ThreadPool* pool) override;  // its own and its paths' layers'
  void reseed(std::uint64_t seed) override;
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  const std::vector<std::unique_ptr<Layer>>& main_path() const { return main_; }
  const std::vector<std::unique_ptr<Layer>>& shortcut_path() const { return shortcut_; }

 private:
  std::vector<std::unique_ptr<Layer>> main_, shortcut_;
  std::vector<Tensor> main_acts_, shortcut_acts_;  // per path layer: its output
  Tensor grad_a_, grad_b_, grad_short_;           // backward scratch
  ThreadPool* pool_ = nullptr;  // the model's; null: the calling thread alone
};

}  // namespace asgd
