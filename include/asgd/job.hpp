#pragma once
// A training job: its configuration (a plain struct, every field with its
// default), what it reports per epoch and at the end, and how to run it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <span>
#include <string>
#include <vector>

#include "asgd/dataset.hpp"
#include "asgd/model_spec.hpp"
#include "asgd/status.hpp"

namespace asgd {

/// The most workers and shards one job may have. In one process each worker
/// is an actor with a data-feeder thread of its own; across processes each
/// is a process with connections to the others: past about a thousand, a
/// job spends its time and memory on bookkeeping, not training.
inline constexpr std::uint32_t kMaxWorkers = 1024;
inline constexpr std::uint32_t kMaxShards = 1024;
/// Compute threads per worker, at most (--threads): more than a machine has
/// cores only time-shares them.
inline constexpr std::uint32_t kMaxThreads = 256;
/// The longest wait a setting or flag may ask for, in seconds (a week):
/// longer ones overflow the clocks they are measured on.
inline constexpr double kMaxWaitS = 7 * 86400.0;

/// Everything that defines one job. Each field is also a TOML key and a
/// command-line flag of `asgd train`: the flag is the field name with '_'
/// written as '-', and the key the field name, both without a unit suffix
/// ("_s", "_epochs": `--eval-every` and `eval_every` for eval_every_s,
/// `--lr-warmup` and `lr_warmup` for lr_warmup_epochs); policy_options are
/// the policies' own knobs (`--staleness`, ...). Plain data: copy it freely.
struct JobConfig {
  std::string dataset = "mnist";    ///< mnist | fashion-mnist | cifar10
  std::string data_dir;             ///< the dataset's own folder; empty: $ASGD_DATA_DIR/<dataset>, else ./data/<dataset>
  std::string model = "mlp";        ///< mlp, lenet, resnet-mini or resnet18 (docs/user-guide.md); ignored when model_spec is set
  /// A model described from code (asgd/model_spec.hpp), used instead of
  /// `model` wherever the job builds one; checkpoints record it. Not a TOML
  /// key or flag, and not carried across processes (asgd cluster refuses
  /// it). Shared, never modified by the runtime. Null: `model` by name.
  std::shared_ptr<const ModelSpec> model_spec;
  std::string policy = "async";     ///< bsp | ssp | ssp:S | async | hogwild | averaging | easgd | allreduce | gossip | gossip:S (docs/policies.md)
  /// The policy's settings by name, as flags spell them ("staleness",
  /// "local-steps", "moving-rate"); each is also a flag and a TOML key
  /// (local_steps). Which policy takes which, and their defaults:
  /// docs/policies.md and `asgd train --help`. A setting the policy does not
  /// take is an error; one not given takes the policy's default.
  std::map<std::string, double> policy_options;
  /// async, ssp: a step more than workers / 2 updates stale (since its
  /// read) takes the rate times workers / staleness (more than the rate
  /// until the staleness passes the worker count), one more than
  /// workers / 4 stale momentum 0.5 (docs/policies.md). Unset: on for async
  /// and ssp unless lr or momentum is set (training_settings).
  std::optional<bool> staleness_aware_lr;
  /// Per-worker batch-size weights: "" (equal), "W0,W1,..." (one positive
  /// number per worker; batch and data partition scale with the weight), or
  /// "auto" (from each worker's step cost, fixed and per sample, measured
  /// before training: batches that make every worker's step equally long).
  std::string worker_weights;
  /// Simulated slow workers for experiments, items joined by ',':
  /// "W:FACTOR" makes each step of worker W take FACTOR times its compute
  /// time; "random:P:FACTOR" slows each step of every worker so with
  /// probability P; "pause:W:EVERY:SECONDS" stalls worker W for SECONDS after
  /// every EVERY-th step. Which steps are slowed follows from `seed`.
  std::string straggler;
  /// Augmentation of training images by the data feeders: "crop" (shifted
  /// by up to an eighth of the side, the border black), "flip" (mirrored with chance
  /// 1/2), "crop,flip" or "none"; empty: crop,flip for cifar10, none for the
  /// grayscale sets and for a job's own data. Seeded by `seed`.
  std::string augment;
  std::uint32_t workers = 2;        ///< worker actors, 1 to kMaxWorkers
  std::uint32_t shards = 1;         ///< parameter shards, 1 to kMaxShards
  std::string device = "cpu";       ///< where workers compute
  std::uint32_t epochs = 3;         ///< passes over the training split, >= 1
  /// Samples per worker step, >= 1. Unset: 64, or fewer for async and ssp
  /// with more than 4 workers (training_settings); a value set is used as
  /// it is.
  std::optional<std::uint32_t> batch;
  /// Base learning rate, > 0. Unset: the default for the policy and the
  /// worker count (training_settings); a value set is used as it is.
  std::optional<double> lr;
  /// Epochs over which the rate ramps up linearly at the start, >= 0.
  /// Unset: the policy's default (training_settings).
  std::optional<double> lr_warmup_epochs;
  std::string lr_schedule = "cosine";  ///< constant | cosine (decays to 0 over the job's updates) | step (x0.1 at 50% and 75%)
  std::string optimizer = "momentum";  ///< shard-side optimizer: sgd | momentum | adagrad | adam
  /// For optimizer = momentum only (refused with the others), in [0, 1).
  /// Unset: the default for the policy and the worker count
  /// (training_settings).
  std::optional<double> momentum;
  double weight_decay = 0.0;        ///< L2 coefficient added to every gradient, >= 0
  std::uint64_t seed = 1;           ///< seeds initialisation, the validation split and shuffling
  std::optional<double> target_accuracy;  ///< validation accuracy whose first crossing time is reported
  /// Once an evaluation finds target_accuracy reached: each worker stops
  /// after the step it is in, and the job ends with the final test
  /// evaluation as after its last epoch (JobSummary::stopped_at_target).
  bool stop_at_target = false;
  /// Also evaluate on the validation split every S seconds of training, for
  /// a finer time-to-target and accuracy curve (0: only after each epoch).
  double eval_every_s = 0.0;
  std::string metrics_out;          ///< JSON Lines metrics file; empty: none
  /// Where the trained model is written at the end (DIR/model.ckpt:
  /// parameters, BatchNorm statistics, layout, input normalisation; read
  /// by `asgd export`); empty: not written.
  std::string checkpoint_dir;
  /// With checkpoint_dir: each shard also writes its key range, optimizer
  /// state and clocks to DIR/shard-K.ckpt every this many seconds, and the
  /// job's settings go to DIR/job.toml, so `resume` can continue the job
  /// (0: only the final model).
  double checkpoint_every_s = 30.0;
  /// Continue the job whose checkpoints are in this folder (written with
  /// checkpoint_dir and checkpoint_every_s): the shards start from their
  /// checkpoints and training from the first epoch not every worker had
  /// finished. Lost work: at most one checkpoint interval. Empty: a new job.
  std::string resume;
  std::uint32_t validation_size = 5000;  ///< training images held out for validation
  /// Compute threads per worker; 0: the CPUs this process may use (its
  /// affinity mask, capped by a cgroup CPU limit) divided by the workers
  /// (at least 1).
  std::uint32_t threads = 0;
  std::uint32_t prefetch = 4;       ///< batches each data feeder keeps ready, 1 to 256
  double rpc_timeout_s = 60.0;      ///< longest wait for any reply (shard, feeder) before the job fails
  /// asgd cluster: a worker process silent this long is declared dead and
  /// the job goes on without it (< rpc_timeout_s, so that workers held at
  /// a barrier by the dead one do not give up first).
  double heartbeat_timeout_s = 10.0;
  /// Tensors between processes (asgd cluster): none (float32) or fp16,
  /// which halves the bytes on the wire. In-process jobs copy nothing.
  std::string compress = "none";
  /// Serve the job's live state over HTTP on this port (0: off): /metrics
  /// (Prometheus text), /status (JSON) and / (a page with live charts).
  std::uint16_t status_port = 0;
  /// The address the status server binds; the default keeps it on this host.
  std::string status_address = "127.0.0.1";
};

/// Checks every field; the message names the flag and the bad value.
Status validate(const JobConfig& config);

/// For a job on `data` instead of config.dataset: checks every field but
/// `dataset`, `data_dir` and `validation_size` (which such a job ignores),
/// then `data` (validate(const UserDataset&)), then that config.model_spec,
/// when set, fits the data's sample shape and classes, and that the job
/// can be planned on them: no more workers than training samples, no
/// worker's share smaller than its batch. Errors: invalid_argument with a
/// message naming the problem.
Status validate(const JobConfig& config, const UserDataset& data);

/// What a job trains with once its unset optimizer settings take their
/// defaults. Values set in the JobConfig are kept exactly. Unset ones are
/// the two-worker defaults (lr 0.02, momentum 0.9, no warm-up; async and
/// ssp with staleness-aware steps), adjusted so that a job still converges with more
/// workers (docs/policies.md, "Defaults as workers grow"; the measurements
/// that chose them are in docs/benchmarks.md).
struct TrainingSettings {
  std::uint32_t batch = 64;  ///< samples per worker step (before --worker-weights)
  double lr = 0.02;                 ///< the learning rate (JobConfig::lr when set)
  double momentum = 0.9;            ///< the optimizer's momentum (JobConfig::momentum when set)
  double lr_warmup_epochs = 0.0;    ///< epochs over which lr ramps up from lr / workers
  bool staleness_aware_lr = false;  ///< stale gradients' steps divided by their staleness
  /// Policy settings not given whose default the worker count changes
  /// (averaging's local-steps beyond 8 workers, easgd's moving-rate).
  std::map<std::string, double> policy_options;
  /// The defaults that differ from the two-worker ones, each saying why:
  /// "lr 0.08 (0.02 x 8 workers / 2, the linear scaling rule)". Empty when
  /// none do (or every one is set).
  std::vector<std::string> adjusted;
};
/// Where a job's shards and workers run: their stale steps differ (CAF runs
/// an in-process worker several steps in a row), and so do some defaults.
enum class Placement {
  one_process,  ///< run_job, `asgd train`
  processes,    ///< `asgd cluster`: a process per shard and worker
};

/// Pure: the same config gives the same settings in every process of a job.
/// Expects a config that passed validate().
TrainingSettings training_settings(const JobConfig& config, Placement where = Placement::one_process);

/// The data folder a job reads: config.data_dir, else $ASGD_DATA_DIR/<dataset>,
/// else ./data/<dataset>.
std::string resolve_data_dir(const JobConfig& config);

/// Where loading a dataset keeps decompressed copies of its gzip'd image
/// files (docs/user-guide.md, "Data"): $ASGD_CACHE_DIR, else
/// $XDG_CACHE_HOME/asgd (an absolute one), else $HOME/.cache/asgd; empty
/// (no cache) when ASGD_CACHE_DIR is "off" (or "0", "no", "false", in any
/// case) or none of them is set. Read at each call.
std::string resolve_image_cache();

/// Where one worker's time went, in seconds, over an epoch or the whole
/// job. The phases do not overlap, and together they make its wall time:
/// every moment from its first step to its last is in exactly one of them.
struct WorkerPhases {
  double wall_s = 0.0;         ///< from its first step (or the previous epoch's end) to its last
  double data_wait_s = 0.0;    ///< waiting for a batch from its data feeder
  double forward_s = 0.0;      ///< the model's forward pass and loss (on a GPU, on its clock)
  double backward_s = 0.0;     ///< the backward pass: gradients (on a GPU, on its clock)
  /// On a GPU: parameters up and gradients down (with their staging
  /// through pinned host memory where the buffers could not be page-locked).
  double copy_s = 0.0;
  /// On a GPU, the rest of the training step: the batch's upload (when not
  /// prefetched), cuDNN's one-time algorithm search for a batch size,
  /// kernel launches, waiting for the device.
  double device_s = 0.0;
  double delay_s = 0.0;        ///< a simulated straggler's extra time (--straggler)
  double push_pull_s = 0.0;    ///< from sending its pushes or pulls to the last shard's reply
  double policy_wait_s = 0.0;  ///< of push_pull_s: replies the policy held back
  /// The rest: preparing pushes, taking in parameters, local updates, and
  /// waiting for a thread between steps (on 2 cores, the other workers').
  double other_s = 0.0;
};

/// One line of progress, reported when every worker has finished an epoch.
struct EpochMetrics {
  std::uint32_t epoch = 0;        ///< 1-based
  double wall_s = 0.0;            ///< seconds since training started
  double train_loss = 0.0;        ///< mean training loss over the epoch's batches; NaN when every one was dropped (NaN/Inf loss)
  double val_accuracy = 0.0;      ///< on the held-out validation split
  double samples_per_s = 0.0;     ///< training samples this epoch / its duration
  std::uint64_t updates = 0;      ///< worker pushes in the evaluated parameters (the fewest any shard had applied), cumulative
  std::vector<WorkerPhases> worker_phases;  ///< per worker, this epoch (empty for a worker that did not report it)
};

/// A validation evaluation between epochs (--eval-every); the metrics
/// file's "eval" record.
struct EvalPoint {
  double wall_s = 0.0;            ///< seconds since training started, when the parameters were read
  double val_accuracy = 0.0;      ///< on the validation split, in [0, 1]
  std::uint64_t updates = 0;      ///< gradient updates the shards had applied to those parameters
  std::uint64_t samples = 0;      ///< training samples the workers had reported by then
  /// Mean training loss over the batches reported since the previous
  /// epoch or eval point; NaN when none were.
  double train_loss = 0.0;
};

/// How a running job stands, about twice a second (JobCallbacks::on_progress).
struct Progress {
  double wall_s = 0.0;            ///< seconds since training started
  std::uint32_t epoch = 1;        ///< the epoch the slowest worker is in, 1-based
  std::uint32_t epochs = 0;       ///< the job's epochs
  std::uint64_t samples = 0;      ///< training samples the workers have trained on so far
  std::uint64_t total_samples = 0;  ///< over the whole job (epochs x training samples)
  double train_loss = 0.0;        ///< mean loss of the batches since the previous Progress; NaN when none
  double samples_per_s = 0.0;     ///< since the previous Progress
  std::optional<double> val_accuracy;  ///< the latest validation accuracy, once there is one
  std::optional<double> eta_s;    ///< remaining training seconds at the recent rate, once known
};

/// Joules one device used: "cpu package 0", "dram 0" (RAPL), "gpu 0" (NVML).
struct DeviceEnergy {
  std::string device;   ///< "cpu package 0", "cuda:0", ...
  double joules = 0.0;  ///< what it used over the window measured
};

/// The energy this machine used while the job trained and evaluated
/// (docs/user-guide.md, "Energy"). Not measured where neither RAPL nor NVML
/// can be read; `reason` then says why (and, when only one of them could,
/// why not the other).
struct EnergyUse {
  bool measured = false;              ///< false where nothing could be read: see reason
  std::string reason;                 ///< why not (or why not every device); empty when all were read
  std::vector<DeviceEnergy> devices;  ///< each device read
  double joules = 0.0;    ///< every device together
  double seconds = 0.0;   ///< the window measured
  double mean_power_w() const { return seconds > 0 ? joules / seconds : 0.0; }  ///< joules / seconds, watts
  double edp_js() const { return joules * seconds; }  ///< energy-delay product, joule-seconds
};

/// The job's outcome; the metrics file's "summary" record.
struct JobSummary {
  std::string policy;                      ///< as JobConfig::policy named it ("ssp:3")
  /// Every setting of the policy as the job ran it: given, default, or a
  /// default the worker count changed ({"fetch-every": 1, "push-every": 4}).
  std::map<std::string, double> policy_options;
  double lr = 0.0;        ///< the learning rate the job took (JobConfig::lr, else its default)
  std::optional<double> momentum;  ///< the momentum it took (none for an optimizer without one)
  std::string optimizer;           ///< JobConfig::optimizer
  std::string lr_schedule;         ///< JobConfig::lr_schedule
  double weight_decay = 0.0;       ///< JobConfig::weight_decay
  std::uint64_t seed = 0;          ///< JobConfig::seed: with the rest, what a rerun needs
  std::string compress;            ///< JobConfig::compress ("none" in one process, where nothing goes over a wire)
  /// Compute threads per worker as the job took them (JobConfig::threads,
  /// or its rule for 0); none across processes, where each worker process
  /// chooses on its host (its log says).
  std::optional<std::uint32_t> threads;
  std::optional<std::uint32_t> staleness;  ///< the policy's staleness bound; none for async
  std::uint32_t workers = 0;               ///< worker actors or processes
  std::uint32_t shards = 0;                ///< parameter shards
  std::string device;                      ///< JobConfig::device
  std::string model;                       ///< the model's name (a ModelSpec's for a spec)
  std::string dataset;                     ///< the dataset's, or UserDataset::name
  std::uint32_t epochs = 0;                ///< JobConfig::epochs (stopped_at_target says when it ended sooner)
  double wall_s = 0.0;            ///< whole job: loading data, training, final evaluation
  double train_s = 0.0;           ///< training only: first step to the last worker's last step
  double samples_per_s = 0.0;     ///< training samples / train_s
  double final_test_accuracy = 0.0;  ///< on the official test set, after training
  std::optional<double> time_to_target_s;  ///< training seconds until val accuracy >= target
  bool stopped_at_target = false;  ///< --stop-at-target ended training there, before its last epoch
  std::uint64_t updates_applied = 0;  ///< worker pushes applied by the shards
  double staleness_mean = 0.0;    ///< over every (push, shard) application
  double staleness_p99 = 0.0;     ///< 99th percentile of the same
  double staleness_max = 0.0;     ///< the stalest application
  /// [s] = updates applied with staleness s (clocks; see docs/policies.md).
  std::vector<std::uint64_t> staleness_histogram;
  std::vector<std::uint32_t> worker_batch;  ///< per worker: its batch size (after weights)
  std::vector<double> worker_wait_s;        ///< per worker: seconds the policy held its reads back
  std::vector<WorkerPhases> worker_phases;  ///< per worker: where its time went, over the job
  std::vector<double> shard_optimizer_s;    ///< per shard: seconds spent folding updates into its parameters
  double evaluation_s = 0.0;                ///< the coordinator's validation and test evaluations (BatchNorm recalibration included)
  EnergyUse energy;                         ///< while training and evaluating
  std::uint64_t malformed_frames = 0;       ///< frames the shards' processes dropped unread (asgd cluster)
  std::uint64_t nonfinite_rejected = 0;     ///< pushes the shards refused for a NaN or infinity (nothing applied)
  std::uint32_t workers_lost = 0;           ///< workers declared dead; the job finished without them
  std::uint32_t shard_restarts = 0;         ///< shard processes restarted from their checkpoints (asgd cluster)
  std::uint32_t workers_rejoined = 0;       ///< worker processes that took a lost worker's place (asgd cluster)
  /// Shard checkpoint writes that failed (--checkpoint-dir): while they
  /// fail, a restart or a resume loses more than one interval.
  std::uint64_t checkpoint_failures = 0;
  /// The normalisation the job gave its inputs, x' = (x - mean) / stddev
  /// for pixels x in [0, 1]: one value per channel, measured on the
  /// training split (mean 0 and stddev 1 for user data, which is taken as
  /// normalised). What Predictor::from_params needs with on_final_params.
  std::vector<float> input_mean;
  std::vector<float> input_stddev;
};

/// Called from a runtime thread, one call at a time, in epoch order.
struct JobCallbacks {
  std::function<void(const EpochMetrics&)> on_epoch;  ///< each epoch's line, when every worker has finished it
  std::function<void(const EvalPoint&)> on_eval;  ///< --eval-every evaluations
  std::function<void(const Progress&)> on_progress;  ///< about twice a second while training
  /// Once, after training and before the summary: the final parameters in
  /// the model's flat layout. The span is valid during the call only.
  std::function<void(std::span<const float>)> on_final_params;
};

/// Runs a job to its end inside this process: loads the data, starts an
/// actor system of its own (coordinator, shards, workers, data feeders),
/// trains, evaluates, writes config.metrics_out if set, and stops every actor
/// before returning. Reentrant: jobs in different threads do not share state.
/// `stop` cancels the job (StatusCode::cancelled) once each worker's step in
/// progress ends. The job waits for each callback. Memory the job freed is
/// given back to the system (malloc_trim) before it returns; a Runtime also
/// sets the allocator's thresholds so that a long-running service's threads
/// keep less (docs/user-guide.md, Memory). Errors: invalid_argument
/// and not_found for configuration and missing data, corruption for bad data
/// files, timeout when a reply takes longer than rpc_timeout_s, internal.
Result<JobSummary> run_job(const JobConfig& config, const JobCallbacks& callbacks = {},
                           std::stop_token stop = {});

/// run_job on the user's own data instead of config.dataset: nothing is
/// read from disk. `data` is checked first (validate(config, *data)) and
/// copied once into the job; the caller may drop or reuse it as soon as
/// this returns or, for Runtime::submit, as soon as submit returns.
/// JobSummary::dataset and checkpoints carry data->name. Errors as run_job,
/// plus invalid_argument for a null or bad `data`.
Result<JobSummary> run_job(const JobConfig& config, std::shared_ptr<const UserDataset> data,
                           const JobCallbacks& callbacks = {}, std::stop_token stop = {});

}  // namespace asgd
