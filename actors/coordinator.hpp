#pragma once
// coordinator: starts and owns one job's actors. It partitions the
// parameters into key ranges across shards (balanced by size) and the
// training split into one partition per worker, starts a data feeder per
// worker, collects epoch reports, evaluates on the validation split after
// each epoch, decides when training ends, evaluates on the test set, and
// hands the job's outcome back through a promise.
//
// Accepts:
//   EpochReport                  from workers
//   (failed_atom, int32 StatusCode, std::string)  from a worker that cannot go on: the job fails
//   (cancel_atom)                from the runtime: the job stops, cancelled
//   (eval_atom)                  self-message every --eval-every seconds: evaluate now
//   (lost_atom, uint32 W, std::string why)  worker W's process ended (its supervisor saw it): lost now
//   (rejoin_atom, uint32 W)      a new process registered for worker W
//   (restarted_atom, uint32 S)   shard S's process was restarted and reloaded its checkpoint
// Watches every actor it started. A worker that stops abnormally (its
// process went silent past --heartbeat-timeout) is lost: the shards are told
// it left, so synchronous policies stop waiting for it, and the job goes on
// with the others (its data share is not trained further). Any other actor
// that stops abnormally fails the job with a message naming it. With --worker-weights auto it first asks each
// worker, one at a time, how many samples per second it computes, and sizes
// batches and data partitions from the answers. The final evaluation waits
// until every worker has stopped, so it sees every last push.
//
// The actor is a shell: what to do about each message is CoordinatorCore's
// to decide (actors/coordinator_core.hpp); the actor performs its actions.

#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>

#include "actors/coordinator_core.hpp"
#include "actors/coordinator_resume.hpp"
#include "actors/job_plan.hpp"
#include "actors/key_range.hpp"
#include "messaging/collective.hpp"
#include "messaging/protocol.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/shared_parameters.hpp"
#include "asgd/job.hpp"
#include "compute/model.hpp"
#include "actors/live_status.hpp"

namespace asgd {

class RemotePlacement;

struct CoordinatorSetup {
  JobConfig config;
  std::shared_ptr<const data::DatasetSplits> data;
  std::function<void(const EpochMetrics&)> on_epoch;   ///< called from the coordinator's thread
  std::function<void(const EvalPoint&)> on_eval;       ///< likewise, for --eval-every
  std::function<void(const Progress&)> on_progress;    ///< likewise, every kLiveEvery while training
  std::function<void(std::span<const float>)> on_final_params;  ///< called from the coordinator's thread
  std::shared_ptr<std::promise<Result<JobSummary>>> outcome;  ///< set exactly once
  /// Where shards and workers run when they are other processes; null:
  /// spawned here.
  std::shared_ptr<RemotePlacement> remote;
  /// Kept current every kLiveEvery for a status server; null: none.
  std::shared_ptr<LiveStatus> live;
  /// A record for the metrics file beyond epochs and evals (the "resume"
  /// line); called from the coordinator's thread.
  std::function<void(const nlohmann::json&)> on_record;
  /// The job's compute threads, which its models (the workers' and the
  /// evaluation's) take their pools from; null: each model's own default.
  std::shared_ptr<ComputeContext> compute;
  /// The job's plan (plan_job), from which the coordinator starts its shards
  /// and workers.
  JobPlan plan;
  /// The model the plan was made for, its parameters initialised: the
  /// shards' initial parameters, then the coordinator's for evaluation. The
  /// coordinator takes it over.
  std::shared_ptr<Model> model;
  /// --resume: where the workers start again (plan_resume), read before
  /// the job's settings beside the checkpoints were replaced.
  std::optional<ResumePlan> resumed;
  /// --resume, once every shard restored its checkpoint: writes the job's
  /// settings beside them (so a resume refused by a shard leaves them as
  /// they were); a failure fails the job. Called from the coordinator's
  /// thread; null: nothing to write.
  std::function<Status()> on_restored;
};

/// How often the coordinator refreshes Progress and the live status (and
/// asks the shards how they stand, when there is a status server).
inline constexpr std::chrono::milliseconds kLiveEvery{500};

/// The job's --rpc-timeout as a CAF duration.
inline caf::timespan rpc_timeout(const JobConfig& config) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(config.rpc_timeout_s));
}

/// Shards and workers in other processes (runtime/cluster_coordinator.cpp).
/// The coordinator calls it from its own thread only.
class RemotePlacement {
 public:
  virtual ~RemotePlacement() = default;
  /// Hands shard setup.index its setup (range, initial parameters, ...) and
  /// returns the local actor that stands for it, without waiting for the
  /// process to take it (await_shards does). `restart`, for a resumed job:
  /// each worker's clock where it starts again, the process reloading the
  /// shard's checkpoint; empty for a new job.
  virtual Result<caf::actor> place_shard(caf::local_actor* coordinator, const ShardSetup& setup,
                                         const std::vector<Clock>& restart) = 0;
  /// Once every placed shard's process serves, or one did not take its
  /// assignment in time, sends `coordinator` (ready_atom, int32 StatusCode,
  /// std::string what); code 0: every shard serves. Never blocks.
  virtual void await_shards(caf::actor coordinator) = 0;
  /// The local actor that stands for worker `w`: it stops normally once the
  /// worker has finished, abnormally when its process went silent.
  virtual Result<caf::actor> place_worker(caf::local_actor* coordinator, std::uint32_t w) = 0;
  /// Starts worker `w` as `plan` says (its share, its straggler factor, the
  /// schedule's length), at epoch `first_epoch` (0-based): a worker process
  /// that rejoins a running job.
  virtual void start_worker(const JobPlan& plan, std::uint32_t w, std::uint32_t first_epoch) = 0;
  /// The job's start: hands every worker of `plan` its assignment (epoch
  /// `first_epoch`, 0 unless the job resumes) without starting it. Once every worker's process has loaded its data
  /// and made its actors (WorkerReady), or at --join-timeout, sends the
  /// coordinator (prepared_atom), which starts its clock and then each
  /// worker (begin_worker).
  virtual void prepare_workers(const JobPlan& plan, std::uint32_t first_epoch) = 0;
  virtual void begin_worker(std::uint32_t w) = 0;
  /// --worker-weights auto: asks worker `w`'s process for its samples/s
  /// (an assignment that says calibrate); the answer reaches the
  /// coordinator as (calibrate_atom, w, samples_per_s).
  virtual void calibrate_worker(const JobPlan& plan, std::uint32_t w) = 0;
  /// Worker `w`'s new process (registered in place of a lost one) is not
  /// taken: tells it to stop, saying why.
  virtual void dismiss_worker(std::uint32_t w, const std::string& why) = 0;
  /// Worker `w` is lost: under allreduce and gossip, tells every other
  /// worker's process, whose collective then no longer waits for it; a
  /// process of its that has not exited is ended by its supervisor.
  virtual void worker_lost(std::uint32_t w) = 0;
  /// --stop-at-target: every worker process stops after its current step.
  virtual void stop_workers() = 0;
};

// The actor's state: the core, which decides, and what it needs to act on
// its decisions (the actors it started, the model it evaluates on).
struct CoordinatorState {
  CoordinatorSetup setup;
  double evaluation_s = 0.0;                  // spent in evaluate_on
  std::shared_ptr<std::vector<StepCost>> rates; // --worker-weights auto across processes: those reported so far
  std::optional<CoordinatorCore> core;        // from setup's config and plan
  std::optional<Model> model;                 // for initialisation and evaluation
  std::vector<caf::actor> shards;
  std::vector<caf::actor> workers;
  std::vector<caf::actor> feeders;
  std::shared_ptr<SharedParameters> shared;   // hogwild only
  std::shared_ptr<messaging::Collective> collective;  // allreduce, gossip in one process
  std::map<caf::actor_addr, std::string> names;  // for diagnostics: "worker 1", "shard 0"
  std::vector<LiveShard> live_shards;         // what the shards last said, for the live status
  static inline const char* name = "coordinator";
};

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup);

}  // namespace asgd
