#pragma once
// parameter_shard: owns one key range of the model's parameters, applies the
// gradients workers push with its own optimizer state, answers pulls, and
// counts how stale every applied gradient was. What it may apply or answer
// when is the consistency policy's call, never the shard's.
//
// Accepts:
//   (push_atom, PushRequest)  -> PushReply     gradient for this range
//   (pull_atom, PullRequest)  -> ParamsReply   (held while the policy says no)
//   (snapshot_atom)           -> ParamsReply   for evaluation, never held
//   (stats_atom)              -> ShardStats

#include <caf/all.hpp>

#include <memory>
#include <vector>

#include "actors/key_range.hpp"
#include "actors/messages.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "policies/policy.hpp"

namespace asgd {

struct ShardSetup {
  std::uint32_t index = 0;
  KeyRange range;
  std::vector<float> initial;       ///< (range.size(),) starting parameters
  OptimizerConfig optimizer;
  PolicyConfig policy;
  LrSchedule schedule;              ///< by this shard's applied-update count
};

/// The shard's logic without any actor around it, so tests drive it directly.
/// Not thread-safe; the actor serialises calls.
class ShardCore {
 public:
  /// Errors: invalid_argument for a bad optimizer or policy, or an initial
  /// vector whose size is not the range's.
  static Result<ShardCore> make(ShardSetup setup);

  std::uint32_t index() const { return setup_.index; }
  const KeyRange& range() const { return setup_.range; }
  std::uint64_t version() const { return version_; }
  std::span<const float> params() const { return params_; }

  /// Applies or discards one push as the policy says. A gradient whose size
  /// is not the range's is rejected (counted, not applied) and answered
  /// with applied = false. Reuses the request's buffer for the reply.
  PushReply push(PushRequest&& request);

  /// May a pull be answered now?
  bool may_answer(const PullRequest& pull) const;

  /// The current parameters, copied into a reply (reusing `buffer`).
  ParamsReply params_reply(std::vector<float> buffer = {}) const;

  ShardStats stats() const;

 private:
  ShardCore() = default;
  ShardSetup setup_;
  std::vector<float> params_;      // (range.size(),)
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<ConsistencyPolicy> policy_;
  std::uint64_t version_ = 0;      // pushes applied so far
  ShardStats stats_;
};

struct ShardState {
  std::unique_ptr<ShardCore> core;
  struct HeldPull {
    PullRequest request;
    caf::response_promise promise;
  };
  std::vector<HeldPull> held;
  static inline const char* name = "parameter_shard";
};

/// The actor. `core` must be built with ShardCore::make.
caf::behavior parameter_shard(caf::stateful_actor<ShardState>* self, std::shared_ptr<ShardCore> core);

}  // namespace asgd
