#pragma once
// Optimizers over a contiguous slice of parameters, with PyTorch's update
// rules and defaults, so results compare with torch.optim:
//   sgd:      p -= lr * g
//   momentum: v = mu * v + g;  p -= lr * v
//   adagrad:  s += g^2;  p -= lr * g / (sqrt(s) + 1e-10)
//   adam:     m = 0.9 m + 0.1 g;  v = 0.999 v + 0.001 g^2;
//             p -= lr * (m / (1 - 0.9^t)) / (sqrt(v / (1 - 0.999^t)) + 1e-8)
// where g already includes weight_decay * p (L2, as torch.optim's
// weight_decay; not AdamW's decoupled decay). A shard owns one for its
// key range; a plain training loop owns one for the whole model. Each keeps
// its own state (momentum buffers) sized to the slice it was made for.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

struct OptimizerConfig {
  std::string kind = "momentum";  ///< "sgd", "momentum", "adagrad" or "adam"
  float lr = 0.05f;               ///< learning rate, > 0
  float momentum = 0.9f;          ///< used by "momentum", in [0, 1)
  float weight_decay = 0.0f;      ///< L2 coefficient added to the gradient, >= 0
};

/// Names make_optimizer accepts.
const std::vector<std::string>& known_optimizers();

/// Not thread-safe: one owner applies steps.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// params -= step(grads); both spans have the size the optimizer was made for.
  /// `lr_scale` multiplies the learning rate for this step only. When `copy`
  /// is not empty (same size), the updated parameters are also written there
  /// in the same pass: a shard answering with fresh parameters saves a
  /// separate copy over memory.
  virtual void step(std::span<float> params, std::span<const float> grads, float lr_scale = 1.0f,
                    std::span<float> copy = {}) = 0;

  /// step() with a `copy` (not empty), calling `written(begin, end)` each
  /// time copy[begin, end) is final, block by block (a few KiB) for the
  /// optimizers whose update is elementwise and stateless between elements,
  /// else once at the end. A shard checksums its reply this way while the
  /// bytes are still in cache. `copy` may be `grads` itself (each element
  /// is read before it is written), as with step().
  virtual void step_visiting(std::span<float> params, std::span<const float> grads, float lr_scale,
                             std::span<float> copy, const std::function<void(std::size_t, std::size_t)>& written);

  /// Multiplies the momentum coefficient of the steps that follow, until
  /// set again (1: as configured). Optimizers without momentum ignore it.
  /// A shard takes a very stale update with less momentum (docs/policies.md).
  virtual void set_momentum_scale(float scale) { (void)scale; }

  /// Multiplies the weight decay of the steps that follow, until set again
  /// (1: as configured): a push that sums the gradients of n steps
  /// (--push-every n) decays the parameters n times as much, as n steps of
  /// their own would.
  void set_decay_scale(float scale) { decay_scale_ = scale; }

  /// Its state, for checkpoints: the buffers it keeps (each (size,);
  /// momentum: 1, adagrad: 1, adam: 2, sgd: none), writable so a restored
  /// checkpoint can fill them, and the steps it has taken (adam's t).
  virtual std::vector<std::span<float>> state() { return {}; }
  virtual std::uint64_t steps() const { return 0; }
  virtual void set_steps(std::uint64_t) {}

 protected:
  float decay_scale_ = 1.0f;
};

/// Errors: invalid_argument for an unknown kind or an out-of-range value.
Result<std::unique_ptr<Optimizer>> make_optimizer(const OptimizerConfig& config, std::size_t size);

}  // namespace asgd
