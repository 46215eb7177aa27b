#include "compute/optimizer.hpp"

#include <cassert>
#include <cmath>

namespace asgd {

namespace {

// Plain SGD: p -= lr * (g + wd * p).
class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& c) : c_(c) {}
  void step(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy) override {
    assert(p.size() == g.size() && (copy.empty() || copy.size() == p.size()));
    const float lr = c_.lr * lr_scale;
    const float wd = c_.weight_decay;
    if (copy.empty()) {
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * (g[i] + wd * p[i]);
    } else {
      for (std::size_t i = 0; i < p.size(); ++i) copy[i] = p[i] -= lr * (g[i] + wd * p[i]);
    }
  }

 private:
  OptimizerConfig c_;
};

// Heavy-ball momentum in PyTorch's form: v = mu * v + g; p -= lr * v.
class Momentum final : public Optimizer {
 public:
  Momentum(const OptimizerConfig& c, std::size_t size) : c_(c), v_(size, 0.0f) {}
  void step(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy) override {
    assert(p.size() == v_.size() && g.size() == v_.size() && (copy.empty() || copy.size() == p.size()));
    const float lr = c_.lr * lr_scale;
    const float mu = c_.momentum;
    const float wd = c_.weight_decay;
    float* v = v_.data();
    // Two loops rather than a branch inside one, so both vectorise.
    if (copy.empty()) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        v[i] = mu * v[i] + (g[i] + wd * p[i]);
        p[i] -= lr * v[i];
      }
    } else {
      for (std::size_t i = 0; i < p.size(); ++i) {
        v[i] = mu * v[i] + (g[i] + wd * p[i]);
        copy[i] = p[i] -= lr * v[i];
      }
    }
  }

 private:
  OptimizerConfig c_;
  std::vector<float> v_;  // (size,) momentum buffer
};

}  // namespace

const std::vector<std::string>& known_optimizers() {
  static const std::vector<std::string> names = {"sgd", "momentum"};
  return names;
}

Result<std::unique_ptr<Optimizer>> make_optimizer(const OptimizerConfig& c, std::size_t size) {
  if (!(c.lr > 0.0f) || !std::isfinite(c.lr))
    return Status::InvalidArgument("learning rate must be a positive number, got " + std::to_string(c.lr));
  if (!(c.weight_decay >= 0.0f) || !std::isfinite(c.weight_decay))
    return Status::InvalidArgument("weight decay must be >= 0, got " + std::to_string(c.weight_decay));
  if (c.kind == "sgd") return std::unique_ptr<Optimizer>(std::make_unique<Sgd>(c));
  if (c.kind == "momentum") {
    if (!(c.momentum >= 0.0f && c.momentum < 1.0f))
      return Status::InvalidArgument("momentum must be in [0, 1), got " + std::to_string(c.momentum));
    return std::unique_ptr<Optimizer>(std::make_unique<Momentum>(c, size));
  }
  return Status::InvalidArgument("unknown optimizer '" + c.kind + "' (known: sgd, momentum)");
}

}  // namespace asgd
