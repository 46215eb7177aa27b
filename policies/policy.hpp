#pragma once
// The consistency policy: the only thing that decides how stale a worker may
// be. Actors ask it three questions (may this push be applied now, may this
// pull be answered now, what happens when a clock advances) plus, on the
// worker side, which steps talk to the shards at all. Actors hold no
// policy-specific branches; a new policy is one short file in policies/.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

using WorkerId = std::uint32_t;
/// A worker's clock: the number of steps it has completed.
using Clock = std::uint64_t;

/// What one worker step does besides computing a gradient.
struct StepPlan {
  bool push = true;  ///< send the gradients accumulated since the last push
  bool pull = true;  ///< refresh the local parameters before the next step
};

/// What a shard does with an arriving push.
enum class PushAction {
  apply,    ///< apply it now with the shard's optimizer
  discard,  ///< drop it (for example a late gradient under backup workers)
};

/// What a shard knows about an arriving push.
struct PushInfo {
  WorkerId worker = 0;
  Clock clock = 0;                 ///< the worker's clock when it computed the gradient
  std::uint64_t base_version = 0;  ///< the shard version the gradient was computed on
  std::uint64_t shard_version = 0; ///< the shard's version now
};

/// What a shard knows about an arriving pull.
struct PullInfo {
  WorkerId worker = 0;
  Clock clock = 0;
};

/// Settings a policy may read; each policy documents which it uses.
struct PolicyConfig {
  std::string name = "async";
  std::uint32_t fetch_every = 1;    ///< async: pull every n-th step (Downpour n_fetch)
  std::uint32_t push_every = 1;     ///< async: push every n-th step (Downpour n_push)
  std::optional<std::uint32_t> staleness;  ///< ssp's s
};

/// One instance per actor that consults it (each shard and each worker own
/// theirs), so implementations need no locking.
class ConsistencyPolicy {
 public:
  virtual ~ConsistencyPolicy() = default;

  virtual std::string name() const = 0;

  /// The bound on staleness this policy guarantees, if any (null: none).
  virtual std::optional<std::uint32_t> staleness_bound() const = 0;

  /// Worker side: what step `step` (0-based) does after computing.
  virtual StepPlan plan(std::uint64_t step) const = 0;

  /// Shard side: may this push be applied now?
  virtual PushAction admit_push(const PushInfo& push) = 0;

  /// Shard side: may this pull be answered now? A pull that may not is held
  /// by the shard and asked again after every applied push or clock advance.
  virtual bool may_answer_pull(const PullInfo& pull) const = 0;

  /// Shard side: the slowest live worker's clock advanced to `min_clock`.
  virtual void on_clock_advance(Clock min_clock) = 0;
};

/// Names make_policy knows, and those this build implements.
const std::vector<std::string>& known_policies();

/// Errors: invalid_argument naming the bad value (unknown policy, a
/// fetch_every or push_every of 0, a policy this build does not implement).
Result<std::unique_ptr<ConsistencyPolicy>> make_policy(const PolicyConfig& config);

}  // namespace asgd
