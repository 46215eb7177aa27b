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

#include <caf/all.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>

#include "actors/job_plan.hpp"
#include "actors/key_range.hpp"
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
};

/// Where a resumed job starts (JobConfig::resume): read from the shards'
/// checkpoints, for the job's shares.
struct ResumePlan {
  std::uint32_t first_epoch = 0;        ///< 0-based: the first epoch not every worker had finished
  std::vector<Clock> restart;           ///< per worker: the clock of its first step (first_epoch x its steps per epoch)
  std::uint64_t updates = 0;            ///< updates the restored parameters hold
  double written_unix_s = 0.0;          ///< when the oldest of the shard checkpoints was written
};
/// Errors: not_found for a missing shard checkpoint, corruption, and
/// invalid_argument when the checkpoints are not this job's or it had
/// already trained every epoch.
Result<ResumePlan> plan_resume(const JobConfig& config, const JobPlan& plan);

/// How often the coordinator refreshes Progress and the live status (and
/// asks the shards how they stand, when there is a status server).
inline constexpr std::chrono::milliseconds kLiveEvery{500};

/// The job's --rpc-timeout as a CAF duration.
caf::timespan rpc_timeout(const JobConfig& config);

/// Shards and workers in other processes (runtime/cluster.cpp). The
/// coordinator calls it from its own thread only.
class RemotePlacement {
 public:
  virtual ~RemotePlacement() = default;
  /// Hands shard setup.index its setup (range, initial parameters, ...) and
  /// returns the local actor that stands for it.
  virtual Result<caf::actor> place_shard(caf::local_actor* coordinator, const ShardSetup& setup) = 0;
  /// The local actor that stands for worker `w`: it stops normally once the
  /// worker has finished, abnormally when its process went silent.
  virtual Result<caf::actor> place_worker(caf::local_actor* coordinator, std::uint32_t w) = 0;
  /// Starts worker `w` as `plan` says (its share, its straggler factor, the
  /// schedule's length), at epoch `first_epoch` (0-based).
  virtual void start_worker(const JobPlan& plan, std::uint32_t w, std::uint32_t first_epoch) = 0;
  /// Worker `w`'s new process (registered in place of a lost one) is not
  /// taken: tells it to stop, saying why.
  virtual void dismiss_worker(std::uint32_t w, const std::string& why) = 0;
};

struct CoordinatorState {
  CoordinatorSetup setup;
  JobPlan plan;                               // setup's, taken over: shares change with --worker-weights auto
  std::optional<Model> model;                 // for initialisation and evaluation
  std::vector<caf::actor> shards;
  std::vector<caf::actor> workers;
  std::vector<caf::actor> feeders;
  std::optional<ResumePlan> resumed;
  std::shared_ptr<SharedParameters> shared;   // hogwild only
  std::uint32_t workers_stopped = 0;          // finished or lost
  std::uint32_t workers_lost = 0;
  std::uint32_t shard_restarts = 0;
  std::uint32_t workers_rejoined = 0;
  bool last_epoch_evaluated = false;
  bool finishing = false;
  std::map<caf::actor_addr, std::string> names;  // for diagnostics: "worker 1", "shard 0"

  struct EpochAgg {
    std::uint32_t reports = 0;
    std::vector<bool> reported;  // per worker
    bool complete = false;       // every live worker reported: queued for evaluation
    EpochReport sum;          // samples and updates summed over workers
    std::vector<double> loss_by_worker;  // summed in worker order: reproducible
    double last_report_s = 0.0;  // when the latest report arrived, since train_start
    double end_s = 0.0;       // when the epoch ended: its last live worker's report, since train_start
    double duration_s = 0.0;  // since the previous epoch ended
  };
  std::map<std::uint64_t, EpochAgg> epochs;   // epoch (0-based) -> reports so far
  std::deque<std::uint64_t> to_evaluate;      // completed epochs, in order
  bool evaluating = false;
  std::uint64_t updates = 0;                  // cumulative over completed epochs
  std::chrono::steady_clock::time_point train_start;
  double last_epoch_end_s = 0.0;              // since train_start
  double train_s = 0.0;
  std::optional<double> time_to_target_s;
  std::vector<EpochReport> worker_totals;     // per worker, for the closing log and the summary
  bool done = false;

  // What the workers last said of their progress, for Progress, the live
  // status and the eval points' loss.
  struct WorkerSeen {
    WorkerProgress latest;
    std::chrono::steady_clock::time_point at;
    bool finished = false;  // stopped normally, its share done
    bool lost = false;      // stopped abnormally
    std::uint64_t first_epoch = 0;  // its epochs before this one are not awaited (a rejoined worker's)
  };
  std::vector<WorkerSeen> seen;
  struct Totals {  // summed over the workers' latest progress
    std::uint64_t samples = 0;
    std::uint64_t updates = 0;
    double loss_sum = 0.0;
    std::uint64_t loss_samples = 0;
    double at_s = 0.0;  // training seconds when taken
  };
  Totals last_tick;   // at the previous Progress
  Totals last_point;  // at the previous epoch or eval point
  std::uint64_t total_samples = 0;            // the whole job's
  std::optional<double> last_val_accuracy;
  std::uint64_t evaluations = 0;
  std::vector<LiveShard> live_shards;
  static inline const char* name = "coordinator";
};

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup);

/// Merges shard staleness histograms into (mean, p99, max).
struct StalenessSummary {
  double mean = 0.0;
  double p99 = 0.0;
  double max = 0.0;
  std::uint64_t count = 0;
};
StalenessSummary summarize_staleness(const std::vector<std::uint64_t>& histogram);

/// Adds histogram `h` into `into`, growing it as needed.
void merge_histogram(std::vector<std::uint64_t>& into, const std::vector<std::uint64_t>& h);

}  // namespace asgd
