#pragma once
// The job plan: everything a job derives from its JobConfig before it
// starts, worked out once, by one pure function. The policy parsed with its
// options resolved, the optimizer and learning-rate schedule, the key range
// of each shard, the data share and steps per epoch of each worker, the
// thread budgets. The in-process coordinator and every cluster role build
// their shards and workers from it (shard_setup, worker_setup) instead of
// deriving the values again, so a formula lives in one place and a test can
// check a job's plan without an actor system, files or data.
//
// A plan holds values only: no actor handles, no buffers. Whoever turns a
// shard's or worker's plan into a running actor adds those.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/key_range.hpp"
#include "actors/step_cost.hpp"
#include "actors/straggler.hpp"
#include "asgd/job.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "compute/tensor.hpp"
#include "dataset/augment.hpp"
#include "dataset/dataset.hpp"
#include "policies/policy.hpp"

namespace asgd {

struct ShardSetup;
struct WorkerSetup;
struct FeederSetup;

/// What one worker trains on: its part of the training split and its batch.
struct WorkerShare {
  data::Partition partition;
  std::uint32_t batch = 0;
};

/// What a job is planned from beside its config: what the model and the
/// data say, where the job runs, and how many CPUs this process may use. The
/// caller finds them out; plan_job only reads them.
struct JobFacts {
  std::size_t num_params = 0;   ///< the model's parameters
  std::size_t train_count = 0;  ///< samples in the training split
  std::size_t classes = 0;
  Shape sample_shape;           ///< (C, H, W)
  Placement placement = Placement::one_process;
  unsigned cores = 1;           ///< the CPUs this process may use (usable_cpus()), for the thread budgets
  std::uint32_t train_fingerprint = 0;  ///< the training split's (LabeledImages::fingerprint); 0: not known
};

/// One shard's part of the plan.
struct ShardPlan {
  std::uint32_t index = 0;
  KeyRange range;               ///< the parameters it owns
  std::string checkpoint_path;  ///< where it checkpoints every JobPlan::checkpoint_every_s; empty: it does not
};

/// One worker's part of the plan.
struct WorkerPlan {
  std::uint32_t id = 0;
  WorkerShare share;
  std::uint64_t steps_per_epoch = 0;  ///< steps_per_epoch(share)
  Straggler straggler;                ///< how --straggler slows its steps (none by default)
  std::string device = "cpu";         ///< where it computes (its item of --device)
  Clock first_clock = 0;              ///< the clock of its first step: > 0 when a job resumes or a worker rejoins
};

struct JobPlan {
  // What the workers build, and where.
  std::string model;
  std::shared_ptr<const ModelSpec> model_spec;  ///< when set, built instead of `model`
  std::string device;  ///< --device as given: one for all workers, or a list (WorkerPlan::device)
  Shape sample_shape;  ///< (C, H, W)
  std::size_t classes = 0;
  Placement placement = Placement::one_process;

  // The policy, parsed once, with the options the worker count changes
  // resolved (policy_config), and what it asks of the runtime.
  PolicyConfig policy;
  std::string policy_name;                       ///< as the policy names itself
  std::optional<std::uint32_t> staleness_bound;  ///< the policy's; none: unbounded
  bool shares_parameters = false;                ///< hogwild: workers write one buffer in one process
  Exchange exchange = Exchange::none;            ///< allreduce, gossip: workers exchange through a collective

  // How updates are applied.
  TrainingSettings training;   ///< for `placement`
  OptimizerConfig optimizer;   ///< the shards', and the workers' for local updates
  LrSchedule schedule;         ///< by clock, planned_clocks long
  std::uint64_t planned_clocks = 0;  ///< the most steps any worker takes over the job

  // Sizes.
  std::uint32_t epochs = 1;
  std::uint32_t batch = 1;       ///< per worker with equal weights (--batch)
  std::size_t num_params = 0;
  std::size_t train_count = 0;
  /// The training split's fingerprint, which the shards write into their
  /// checkpoints: a --resume on other data (another --data-dir) is refused.
  /// 0: not known (a shard process is told it with its assignment).
  std::uint32_t train_fingerprint = 0;
  /// --worker-weights auto: the shares start equal and are planned again
  /// from the rates the workers measure (replan_shares).
  bool calibrate_weights = false;
  std::vector<KeyRange> ranges;     ///< ranges[i]: shard i's keys; together every parameter, in order
  std::vector<ShardPlan> shards;    ///< shards[i].index == i
  std::vector<WorkerPlan> workers;  ///< workers[w].id == w
  std::uint32_t worker_count = 0;   ///< also set where `workers` is left empty (plan_settings)

  // Threads, timeouts, checkpoints, data.
  std::size_t compute_threads = 1;  ///< per worker model (--threads; else compute_threads()'s rule)
  std::size_t actor_threads = 1;    ///< the in-process actor system's scheduler: one per worker, up to the cores
  double rpc_timeout_s = 60.0;
  double hold_warning_s = 0.0;      ///< a shard logs a read held this long (half of --rpc-timeout)
  std::string checkpoint_dir;       ///< where shards checkpoint, every checkpoint_every_s; empty: they do not
  double checkpoint_every_s = 0.0;
  std::uint32_t prefetch = 4;       ///< batches each data feeder keeps ready
  data::Augment augment;            ///< what the data feeders do to training images
  std::uint64_t seed = 1;
};

/// Plans a job. Pure: the same config and facts give the same plan in every
/// process. Expects a config that passed validate(). Errors
/// (invalid_argument, the message naming the flag): more workers than
/// training samples, more shards than parameters, an unknown policy or bad
/// policy options, bad --worker-weights or --straggler, --resume across
/// processes or with --worker-weights auto.
Result<JobPlan> plan_job(const JobConfig& config, const JobFacts& facts);

/// The part of a plan that follows from the config alone: everything but
/// the sizes (ranges, shards and workers empty, the schedule 0 clocks long).
/// A shard or worker process of a cluster is told its part of the
/// coordinator's plan (its key range or data share, the schedule's length)
/// but not the sizes that plan was made from: it plans the rest with this,
/// by the same rules as plan_job, and adds its part (plan_clocks,
/// plan_shard, plan_worker). Errors as plan_job's for the policy,
/// --worker-weights and --straggler.
Result<JobPlan> plan_settings(const JobConfig& config, Placement where, unsigned cores);

/// Sets the plan's schedule `clocks` long.
void plan_clocks(JobPlan& plan, std::uint64_t clocks);

/// Shard `index`'s plan for key range `range`.
ShardPlan plan_shard(const JobPlan& plan, std::uint32_t index, KeyRange range);

/// Worker `id`'s plan for `share`, slowed by `straggler`, starting at epoch
/// `first_epoch` (0-based).
WorkerPlan plan_worker(std::uint32_t id, const WorkerShare& share, const Straggler& straggler,
                       std::uint32_t first_epoch = 0);

/// --worker-weights auto: each worker's share planned again in proportion
/// to `weights` (the batch it should take). The schedule keeps its
/// length: weights aim at the same steps per epoch for every worker.
void replan_shares(JobPlan& plan, const std::vector<double>& weights);

/// The batches (as weights for replan_shares) that make every worker's step
/// take the same time T while they add up to `total_batch`:
/// B_w = (T - fixed_w) / per_sample_w, at least 1 sample each.
std::vector<double> balanced_batches(const std::vector<StepCost>& costs, double total_batch);

/// A shard's setup as the plan says; the caller adds what is not a plan's
/// (hogwild's shared buffer). `initial`: (shard.range.size(),) its starting
/// parameters, empty with a shared buffer.
ShardSetup shard_setup(const JobPlan& plan, const ShardPlan& shard, std::vector<float> initial);

/// A worker's setup as the plan says; the caller adds the actors (shards,
/// feeder, coordinator), the compute context and hogwild's shared buffer.
WorkerSetup worker_setup(const JobPlan& plan, const WorkerPlan& worker);

/// The data feeder's setup for `worker`, on `data`, from epoch `first_epoch`.
FeederSetup feeder_setup(const JobPlan& plan, const WorkerPlan& worker,
                         std::shared_ptr<const data::DatasetSplits> data, std::uint32_t first_epoch);

// The rules the plan is made by, for its callers and tests.

/// Steps a worker takes per epoch on `share`: its partition in batches, the
/// last one partial.
std::uint64_t steps_per_epoch(const WorkerShare& share);

/// The most steps any worker takes over the job: the length of the
/// learning-rate schedule, which runs by clock.
std::uint64_t planned_clocks(const std::vector<WorkerShare>& shares, std::uint32_t epochs);

/// Threads each worker's model computes on: --threads, else `cores` (the
/// CPUs this process may use) divided among the `sharers` (the workers
/// computing on them: all of a job's in one process; in a worker process,
/// the job's worker processes on the same CPUs), at least 1.
unsigned compute_threads(const JobConfig& config, unsigned cores, unsigned sharers);

/// The policy settings a job's configuration gives.
PolicyConfig policy_config(const JobConfig& config);
/// The optimizer settings a job's configuration gives (shard and local).
OptimizerConfig optimizer_config(const JobConfig& config, Placement where = Placement::one_process);
/// The job's learning-rate schedule over `total_steps` clocks (the kind
/// was validated by validate()).
LrSchedule lr_schedule(const JobConfig& config, std::uint64_t total_steps);

/// Each worker's device from --device: one ("cpu", "cuda", "cuda:K") for
/// every worker, or a comma-separated list with one per worker
/// ("cuda:0,cuda:0,cpu"). Errors: invalid_argument naming the bad item and
/// its worker, or a list of the wrong length.
Result<std::vector<std::string>> parse_worker_devices(const std::string& text, std::uint32_t workers);

/// Per-worker weights from --worker-weights "W0,W1,..." (empty: all 1).
/// Errors: invalid_argument unless there is one positive number per worker.
Result<std::vector<double>> parse_worker_weights(const std::string& text, std::uint32_t workers);

/// Splits `train_count` samples and the global batch (batch x workers) in
/// proportion to `weights`, so every worker takes about as many steps per
/// epoch whatever its weight. Equal weights give data::partition_for and
/// `batch` exactly.
std::vector<WorkerShare> assign_shares(std::size_t train_count, std::uint32_t batch, const std::vector<double>& weights);

}  // namespace asgd
