#pragma once
// Dropout on the CPU.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/layer.hpp"
#include "base/random.hpp"

namespace asgd {

/// Inverted dropout (torch.nn.Dropout(p)): in training mode each unit is
/// zeroed with probability p and the rest scaled by 1 / (1 - p); identity in
/// inference mode. Masks come from the layer's own seeded generator.
class Dropout final : public Layer {
 public:
  explicit Dropout(float p, std::uint64_t seed = 0) : p_(p), seed_(seed), rng_(seed) {}
  std::string kind() const override { return "dropout"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void set_training(bool training) override { training_ = training; }
  void reseed(std::uint64_t seed) override {
    seed_ = seed;
    rng_ = Rng(seed);
  }
  void forward(ConstTensorView x, Tensor& y) override;
  void backward(ConstTensorView x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  float p() const { return p_; }
  /// The seed last given (at construction or reseed()): the GPU's masks
  /// follow it too.
  std::uint64_t seed() const { return seed_; }

 private:
  float p_;
  std::uint64_t seed_;
  bool training_ = true;
  Rng rng_;
  std::vector<float> mask_;  // (B, ...) of the last training forward: 0 or 1 / (1 - p)
};

}  // namespace asgd
