#pragma once
// The consistency policy: the only thing that decides how stale a worker may
// be. A shard asks it three questions (what to do with an arriving push,
// whether an aggregate is complete, whether a read may be answered now) and
// a worker asks which steps update locally, push or pull. Policies are pure:
// the state they judge (every worker's clock, what the shard has committed)
// is the shard's ClockView, passed in. Actors hold no policy-specific
// branches; a new policy is one short file in policies/.
//
// Clocks. A worker's clock is the number of steps it has completed: the
// gradient of its step t is pushed tagged with clock t, and the read that
// precedes step c is a read "at clock c". Staleness is counted in clocks,
// the unit Ho et al. (2013) bound: every update records
//   staleness = (clock of the update) - (complete clock of the read it was computed on)
// where a read's complete clock V means it contains every live worker's
// updates of clocks < V. bsp gives 0, ssp(s) at most s, averaging over k local
// steps k - 1, async whatever gap between the fastest and slowest worker
// opens up.

#include <cstdint>
#include <limits>
#include <map>
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
  bool local_update = false;  ///< apply the gradient to the worker's own parameters with its own optimizer
  bool push = true;           ///< send the payload accumulated since the last push
  bool pull = true;           ///< refresh the local parameters before the next step
};

/// What a worker pushes.
enum class Payload {
  gradients,   ///< the (summed) gradients since the last push
  parameters,  ///< its own parameters, after local updates
};

/// What a shard does with an arriving push.
enum class PushAction {
  apply,      ///< apply it now with the shard's optimizer
  aggregate,  ///< add it to its clock's aggregate, applied once commit_ready says so
  discard,    ///< drop it (a late gradient under backup workers)
};

/// What a shard knows when it asks its policy: its view of the workers'
/// clocks, built from the pushes it received.
struct ClockView {
  std::uint32_t live_workers = 0;  ///< workers that have not left the job
  /// The slowest live worker's clock (the pushes of clocks below it have all
  /// arrived); the largest clock seen when no worker is live.
  Clock min_clock = 0;
  Clock committed = 0;             ///< aggregates committed: clocks < committed are in the parameters
};

/// What a shard knows about an arriving push.
struct PushInfo {
  WorkerId worker = 0;
  Clock clock = 0;       ///< the step that produced it
  Clock base_clock = 0;  ///< complete clock of the read it was computed on
};

/// A read: a pull, or the parameters a push asks for in its reply.
struct PullInfo {
  WorkerId worker = 0;
  Clock clock = 0;       ///< the step the worker will compute next
};

/// A policy's settings by knob name ("local-steps" -> 4). Which knobs each
/// policy takes, their ranges and defaults: policies/registry.hpp.
using PolicyOptions = std::map<std::string, double>;

/// Which policy, and the settings given for it.
struct PolicyConfig {
  /// A registered name, with ":V" where the policy takes one ("ssp:3").
  std::string name = "async";
  /// Knobs set; the policy's other knobs take their defaults. A knob the
  /// policy does not take is an error.
  PolicyOptions options;
};

/// What workers exchange among themselves each step, beside the shards
/// (the decentralized policies). Their shards only keep the parameters the
/// workers publish, for evaluation and checkpoints.
enum class Exchange {
  none,       ///< parameter server: workers talk to shards only
  /// every step, the samples-weighted mean of every live worker's gradient
  /// (an all-reduce), which each worker applies with its own optimizer to
  /// its own, identical, copy of the parameters
  allreduce,
  /// every step, after its own update, a worker averages its parameters
  /// with its peers' latest published copies, each from a clock no more
  /// than staleness_bound() behind its own (it waits otherwise)
  gossip,
};

/// How a shard folds what it applies (a push, or a committed aggregate's
/// weighted mean) into its parameters, and what the reply then carries.
struct Combine {
  enum class Rule {
    optimizer_step,  ///< gradients: one step of the shard's optimizer; the reply carries the parameters
    replace,         ///< parameters: the shard's become them (averaging's mean)
    /// parameters: the shard's (the center) and the worker's each move
    /// `moving_rate` of their difference towards the other; the reply
    /// carries the worker's moved copy (elastic averaging)
    elastic,
  };
  Rule rule = Rule::optimizer_step;
  float moving_rate = 0.0f;
};

/// One instance per actor that consults it (each shard and each worker own
/// theirs). Implementations are stateless after construction.
class ConsistencyPolicy {
 public:
  virtual ~ConsistencyPolicy() = default;

  /// The name as given on the command line, with its parameter ("ssp:3").
  virtual std::string name() const = 0;

  /// The bound on staleness this policy guarantees, if any (null: none).
  virtual std::optional<std::uint32_t> staleness_bound() const = 0;

  /// Worker side: what step `step` (0-based) does after computing.
  virtual StepPlan plan(std::uint64_t step) const = 0;

  /// Worker side: what a push carries.
  virtual Payload payload() const { return Payload::gradients; }

  /// Shard side: how an applied push or a commit enters the parameters.
  virtual Combine combine() const { return {}; }

  /// Workers update one shared parameter buffer in place (hogwild): only
  /// possible when they share an address space and the parameters' memory.
  virtual bool shares_parameters() const { return false; }

  /// What workers exchange with each other every step (none: they go
  /// through the shards only).
  virtual Exchange exchange() const { return Exchange::none; }

  /// gossip: the workers whose copies worker `worker` of `workers` averages
  /// with after step `step`.
  virtual std::vector<WorkerId> peers(WorkerId worker, std::uint32_t workers, std::uint64_t step) const {
    (void)worker, (void)workers, (void)step;
    return {};
  }

  /// Shard side: what to do with this push. Called after the push's clock
  /// entered the view.
  virtual PushAction admit_push(const PushInfo& push, const ClockView& view) const = 0;

  /// Shard side: may the aggregate of clock `clock` be committed now, with
  /// `contributions` of the live workers done with it (they pushed for it,
  /// or their clock passed it without a push, so they never will)? Asked
  /// again whenever the view changes (a push arrives, a worker leaves).
  virtual bool commit_ready(Clock clock, std::uint32_t contributions, const ClockView& view) const {
    (void)clock;
    return contributions >= view.live_workers;
  }

  /// Shard side: may this read be answered now? A read that may not is held
  /// by the shard and asked again whenever the view changes.
  virtual bool may_answer_pull(const PullInfo& pull, const ClockView& view) const = 0;
};

/// Policy names make_policy knows (policies/registry.hpp has the rest).
std::vector<std::string> known_policies();

/// Errors: invalid_argument naming the bad value (unknown policy, a
/// malformed ":V", a knob out of range or one the policy does not take).
Result<std::unique_ptr<ConsistencyPolicy>> make_policy(const PolicyConfig& config);

}  // namespace asgd
