#include "compute/optimizer.hpp"

#include "compute/denormals.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>

namespace asgd {

void Optimizer::step_visiting(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy,
                              const std::function<void(std::size_t, std::size_t)>& written) {
  step(p, g, lr_scale, copy);
  written(0, copy.size());
}

namespace {

// step_visiting for an update that is elementwise and keeps no per-step
// state (so steps over consecutive blocks equal one step over the whole):
// 6144 floats (24 KiB) a block, a multiple of the 3 x 4 KiB a CRC-32C pass
// takes at a time, and small enough to stay in L1 between the update and
// the visit.
template <class Step>
void step_in_blocks(std::span<float> p, std::span<const float> g, std::span<float> copy,
                    const std::function<void(std::size_t, std::size_t)>& written, Step&& step) {
  assert(p.size() == g.size() && copy.size() == p.size());
  constexpr std::size_t kBlock = 6144;
  for (std::size_t i = 0; i < p.size(); i += kBlock) {
    const std::size_t m = std::min(kBlock, p.size() - i);
    step(p.subspan(i, m), g.subspan(i, m), copy.subspan(i, m));
    written(i, i + m);
  }
}

// Plain SGD: p -= lr * (g + wd * p).
class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& c) : c_(c) {}
  void step(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy) override {
    const FlushDenormals flush;
    assert(p.size() == g.size() && (copy.empty() || copy.size() == p.size()));
    const float lr = c_.lr * lr_scale;
    const float wd = c_.weight_decay * decay_scale_;
    if (copy.empty()) {
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * (g[i] + wd * p[i]);
    } else {
      for (std::size_t i = 0; i < p.size(); ++i) copy[i] = p[i] -= lr * (g[i] + wd * p[i]);
    }
  }
  void step_visiting(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy,
                     const std::function<void(std::size_t, std::size_t)>& written) override {
    step_in_blocks(p, g, copy, written, [&](auto pb, auto gb, auto cb) { step(pb, gb, lr_scale, cb); });
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
    update(p, g, lr_scale, copy, v_.data());
  }
  void step_visiting(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy,
                     const std::function<void(std::size_t, std::size_t)>& written) override {
    assert(p.size() == v_.size());
    // Each block's elements use their own slice of the momentum buffer.
    step_in_blocks(p, g, copy, written, [&](auto pb, auto gb, auto cb) {
      update(pb, gb, lr_scale, cb, v_.data() + (pb.data() - p.data()));
    });
  }
  std::vector<std::span<float>> state() override { return {v_}; }
  void set_momentum_scale(float scale) override { momentum_scale_ = scale; }

 private:
  // v: (p.size(),) the momentum buffer's slice for p.
  void update(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy, float* v) const {
    const FlushDenormals flush;
    const float lr = c_.lr * lr_scale;
    const float mu = c_.momentum * momentum_scale_;
    const float wd = c_.weight_decay * decay_scale_;
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

  OptimizerConfig c_;
  std::vector<float> v_;  // (size,) momentum buffer
  float momentum_scale_ = 1.0f;
};

// Adagrad (Duchi et al. 2011) as torch.optim.Adagrad with lr_decay 0.
class Adagrad final : public Optimizer {
 public:
  Adagrad(const OptimizerConfig& c, std::size_t size) : c_(c), sum_(size, 0.0f) {}
  void step(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy) override {
    const FlushDenormals flush;
    assert(p.size() == sum_.size() && g.size() == sum_.size() && (copy.empty() || copy.size() == p.size()));
    const float lr = c_.lr * lr_scale;
    const float wd = c_.weight_decay * decay_scale_;
    float* s = sum_.data();
    // The copy (when wanted) may alias g: read g[i] before writing copy[i].
    float* out = copy.empty() ? p.data() : copy.data();
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float gi = g[i] + wd * p[i];
      s[i] += gi * gi;
      out[i] = p[i] -= lr * gi / (std::sqrt(s[i]) + kEps);
    }
  }
  std::vector<std::span<float>> state() override { return {sum_}; }

 private:
  static constexpr float kEps = 1e-10f;
  OptimizerConfig c_;
  std::vector<float> sum_;  // (size,) running sum of squared gradients
};

// Adam (Kingma and Ba 2015) as torch.optim.Adam with its default betas and
// eps. The step count is this optimizer's own (a shard's applied updates).
class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& c, std::size_t size) : c_(c), m_(size, 0.0f), v_(size, 0.0f) {}
  void step(std::span<float> p, std::span<const float> g, float lr_scale, std::span<float> copy) override {
    const FlushDenormals flush;
    assert(p.size() == m_.size() && g.size() == m_.size() && (copy.empty() || copy.size() == p.size()));
    ++t_;
    const double bias1 = 1.0 - std::pow(static_cast<double>(kBeta1), static_cast<double>(t_));
    const double bias2 = 1.0 - std::pow(static_cast<double>(kBeta2), static_cast<double>(t_));
    const auto step_size = static_cast<float>(c_.lr * lr_scale / bias1);
    const auto inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
    const float wd = c_.weight_decay * decay_scale_;
    float* m = m_.data();
    float* v = v_.data();
    // The copy (when wanted) may alias g: read g[i] before writing copy[i].
    float* out = copy.empty() ? p.data() : copy.data();
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float gi = g[i] + wd * p[i];
      m[i] = kBeta1 * m[i] + (1.0f - kBeta1) * gi;
      v[i] = kBeta2 * v[i] + (1.0f - kBeta2) * gi * gi;
      out[i] = p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bias2 + kEps);
    }
  }
  std::vector<std::span<float>> state() override { return {m_, v_}; }
  std::uint64_t steps() const override { return t_; }
  void set_steps(std::uint64_t t) override { t_ = t; }

 private:
  static constexpr float kBeta1 = 0.9f;
  static constexpr float kBeta2 = 0.999f;
  static constexpr float kEps = 1e-8f;
  OptimizerConfig c_;
  std::vector<float> m_;  // (size,) first moment
  std::vector<float> v_;  // (size,) second moment
  std::uint64_t t_ = 0;   // steps taken
};

}  // namespace

const std::vector<std::string>& known_optimizers() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adagrad", "adam"};
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
  if (c.kind == "adagrad") return std::unique_ptr<Optimizer>(std::make_unique<Adagrad>(c, size));
  if (c.kind == "adam") return std::unique_ptr<Optimizer>(std::make_unique<Adam>(c, size));
  return Status::InvalidArgument("unknown optimizer '" + c.kind + "' (known: sgd, momentum, adagrad, adam)");
}

}  // namespace asgd
