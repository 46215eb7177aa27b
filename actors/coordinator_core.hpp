#pragma once
// The coordinator's decisions without any actor around it, in the style of
// ShardCore: the shell (actors/coordinator.cpp) hands it what arrived and
// the time, and performs the Actions it appends (sending, spawning,
// snapshots of the shards, evaluating on the model). Tests drive it message
// by message with no actor system and no sleeps
// (tests/actors/coordinator_core_test.cpp).
//
// It is made of parts a reader can hold one at a time:
//   Membership     which workers are live, lost or finished, and what each
//                  last said of its progress   (coordinator_membership.cpp)
//   EpochTracker   reports summed per epoch, when an epoch is complete (every
//                  live worker reported), its metrics   (coordinator_epochs.cpp)
//   EvalSchedule   when to evaluate: each completed epoch in order, and every
//                  --eval-every seconds between them   (coordinator_epochs.cpp)
//   LiveView       Progress and the live status   (coordinator_live.cpp)
//   resume         where a --resume'd job starts, and the metrics file's
//                  records of resumes and restarts   (coordinator_resume.cpp)
// CoordinatorCore (coordinator_core.cpp) ties them together and decides
// rejoins and how the job ends: finished exactly once, after the last
// epoch's evaluation and every worker's stop, or failed exactly once.
//
// Not thread-safe: the actor serialises calls.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/job_plan.hpp"
#include "actors/live_status.hpp"
#include "asgd/job.hpp"
#include "asgd/status.hpp"
#include "messaging/protocol.hpp"

namespace asgd {

using CoordinatorInstant = std::chrono::steady_clock::time_point;

/// Summed over the workers' latest progress.
struct ProgressTotals {
  std::uint64_t samples = 0;
  std::uint64_t updates = 0;
  double loss_sum = 0.0;
  std::uint64_t loss_samples = 0;
  double at_s = 0.0;  ///< training seconds when taken
};

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

/// The mean loss of the batches reported between two totals; NaN for none.
double loss_between(const ProgressTotals& from, const ProgressTotals& to);

// ---- membership ------------------------------------------------------------

/// Which workers are still in the job. Empty until training starts (start):
/// a worker lost while the coordinator calibrates is not counted.
class Membership {
 public:
  struct Worker {
    WorkerProgress latest;          ///< what it last said of its progress
    CoordinatorInstant at{};        ///< when; epoch of the clock: never
    bool finished = false;          ///< stopped normally, its share done
    bool lost = false;              ///< stopped abnormally
    std::uint64_t first_epoch = 0;  ///< its epochs before this one are not awaited (a rejoined worker's)
  };

  void start(std::uint32_t workers) { seen_.assign(workers, {}); }
  bool started() const { return !seen_.empty(); }
  std::size_t size() const { return seen_.size(); }
  const Worker& worker(std::size_t w) const { return seen_.at(w); }
  const std::vector<Worker>& workers() const { return seen_; }
  bool lost(std::size_t w) const { return w < seen_.size() && seen_[w].lost; }
  bool finished(std::size_t w) const { return w < seen_.size() && seen_[w].finished; }
  /// Whether epoch `epoch`'s evaluation waits for worker w's report.
  bool awaited(std::size_t w, std::uint64_t epoch) const;
  /// Neither lost nor finished.
  bool in_training(std::size_t w) const { return w < seen_.size() && !seen_[w].lost && !seen_[w].finished; }

  std::uint32_t stopped() const { return stopped_; }  ///< finished or lost
  std::uint32_t lost_count() const { return lost_; }
  std::uint32_t rejoined() const { return rejoined_; }

  /// Worker w stopped normally (counted even before training started).
  void finish(std::size_t w);
  /// Worker w stopped abnormally; false when it had already stopped (or
  /// training has not started).
  bool lose(std::size_t w);
  /// A new process took lost worker w's place; it trains from `first_epoch`.
  void rejoin(std::size_t w, std::uint64_t first_epoch);
  /// Progress from worker w; a late one (fewer samples) or a lost worker's is
  /// ignored.
  void progress(const WorkerProgress& p, CoordinatorInstant now);
  /// The furthest epoch any other worker still training is in (0 for none).
  std::uint64_t furthest_epoch_besides(std::size_t w) const;
  ProgressTotals totals(double at_s) const;

 private:
  std::vector<Worker> seen_;
  std::uint32_t stopped_ = 0;
  std::uint32_t lost_ = 0;
  std::uint32_t rejoined_ = 0;
};

// ---- epochs and evaluation -------------------------------------------------

/// The workers' epoch reports, summed per epoch until the epoch is
/// evaluated, and per worker for the closing log and the summary.
class EpochTracker {
 public:
  struct Epoch {
    std::vector<bool> reported;          // per worker
    bool complete = false;               // every awaited worker reported: queued for evaluation
    EpochReport sum;                     // samples and updates summed over workers
    std::vector<double> loss_by_worker;  // summed in worker order: reproducible
    double last_report_s = 0.0;          // when the latest report arrived, since training started
    double end_s = 0.0;                  // its last awaited worker's report, since training started
    double duration_s = 0.0;             // since the previous epoch ended
  };

  EpochTracker(std::uint32_t workers, std::uint32_t epochs) : workers_(workers), epochs_(epochs), totals_(workers) {}

  /// Worker r.worker finished epoch r.epoch at training second `at_s`.
  void report(const EpochReport& r, double at_s);
  /// Marks complete, in order, every epoch each awaited worker has
  /// reported; returns them. An epoch not yet reported holds back the later
  /// ones that faster workers have.
  std::vector<std::uint64_t> complete(const Membership& members);
  /// The metrics of completed epoch e, given its validation accuracy (and
  /// the updates before it); forgets it. Logs its dropped batches.
  EpochMetrics evaluated(std::uint64_t e, double val_accuracy);

  const Epoch* epoch(std::uint64_t e) const;
  const std::vector<EpochReport>& worker_totals() const { return totals_; }
  std::uint64_t updates() const { return updates_; }  ///< cumulative over evaluated epochs
  void set_updates(std::uint64_t u) { updates_ = u; }
  double train_s() const { return train_s_; }         ///< when the last epoch ended; 0 until then

 private:
  std::uint32_t workers_;
  std::uint32_t epochs_;
  std::map<std::uint64_t, Epoch> epochs_seen_;  // epoch (0-based) -> reports so far
  std::vector<EpochReport> totals_;
  std::uint64_t updates_ = 0;
  double last_end_s_ = 0.0;
  double train_s_ = 0.0;
};

/// What to evaluate next, one evaluation at a time: completed epochs in
/// order, and an eval point every --eval-every seconds when no evaluation is
/// under way.
class EvalSchedule {
 public:
  using Duration = std::chrono::steady_clock::duration;
  /// `every_s` <= 0: no eval points.
  explicit EvalSchedule(double every_s);

  bool periodic() const { return period_ > Duration::zero(); }
  Duration period() const { return period_; }
  /// Training starts at `now`: the first point is due a period later.
  void start(CoordinatorInstant now) { due_ = now + period_; }
  CoordinatorInstant due() const { return due_; }
  /// A tick at `now`: true when a point is due (now has reached due()); the
  /// next is then due a period after now.
  bool tick(CoordinatorInstant now);

  void epoch_completed(std::uint64_t e) { queue_.push_back(e); }
  bool evaluating() const { return evaluating_; }
  /// Begins the next evaluation when none is under way: an epoch's if one
  /// is queued, else none. Returns the epoch.
  std::optional<std::uint64_t> begin_epoch();
  /// Begins an eval point taken at `at` when none is under way.
  bool begin_point(const ProgressTotals& at);
  /// The evaluation under way: an eval point's totals, or an epoch.
  std::optional<ProgressTotals> point() const { return point_; }
  std::optional<std::uint64_t> epoch() const { return epoch_; }
  void end() {
    evaluating_ = false;
    point_.reset();
    epoch_.reset();
  }

 private:
  Duration period_{};
  CoordinatorInstant due_{};
  std::deque<std::uint64_t> queue_;  // completed epochs, in order
  bool evaluating_ = false;
  std::optional<ProgressTotals> point_;
  std::optional<std::uint64_t> epoch_;
};

// ---- live status -----------------------------------------------------------

/// Progress and the live status from the workers' latest progress.
class LiveView {
 public:
  void set_total_samples(std::uint64_t n) { total_samples_ = n; }
  std::uint64_t total_samples() const { return total_samples_; }
  /// Progress since the previous tick, which `now_totals` become.
  Progress tick(const Membership& members, const ProgressTotals& now_totals, std::uint32_t epochs,
                std::optional<double> val_accuracy);
  /// Writes `p` (tick's), the totals it came from and each worker's state
  /// into `snap`; `now` dates the workers' last reports.
  void fill(LiveSnapshot& snap, const Progress& p, const Membership& members, std::uint64_t evaluations,
            CoordinatorInstant now) const;

 private:
  std::uint64_t total_samples_ = 0;  // the whole job's
  ProgressTotals last_;              // at the previous tick
};

/// Shard stats as the live status shows them; `now_unix` dates its checkpoint.
LiveShard live_shard(const ShardStats& s, double now_unix);

// ---- resume and restarts ---------------------------------------------------

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
/// What --resume was given is the user's to fix, whatever is wrong with it:
/// a usage error that names the folder and the file.
Status resume_refused(const JobConfig& cfg, const Status& why);
/// The metrics file's "resume" record, logged.
nlohmann::json resume_record(const JobConfig& cfg, const ResumePlan& resumed, double now_unix);
/// The metrics file's "shard_restarted" record, logged: what the restarted
/// shard said it reloaded (`reloaded`), or that it did not say (`why`).
nlohmann::json shard_restart_record(std::uint32_t shard, double at_s, const ShardStats* reloaded,
                                    const std::string& why, double now_unix);

// ---- the core --------------------------------------------------------------

/// What the shell does for the core, in the order appended.
namespace coordinator_action {
struct Leave { std::uint32_t worker; };         ///< tell every shard worker w left (and the shared buffer)
struct Kill { std::uint32_t worker; };          ///< stop watching worker w's actor and kill it
struct Evaluate {};                             ///< snapshot the shards, evaluate on validation, then evaluated()
struct Finish {};                               ///< snapshot, test, checkpoint, shard stats, then finished()
struct Fail { Status status; };                 ///< the job failed: report it and shut down
struct Dismiss { std::uint32_t worker; std::string why; };  ///< refuse worker w's new process
/// Place rejoining worker w's new process, then rejoined() (or refuse_rejoin()).
struct Place { std::uint32_t worker; std::uint64_t first_epoch; };
/// Tell every shard worker w is back at `clock`; once all confirm, rejoin_confirmed().
struct Join { std::uint32_t worker; Clock clock; std::uint64_t first_epoch; };
struct StartWorker { std::uint32_t worker; std::uint32_t first_epoch; };  ///< a remote worker starts training
struct EpochDone { EpochMetrics metrics; };     ///< for on_epoch
struct PointDone { EvalPoint point; };          ///< for on_eval
struct Record { nlohmann::json record; };       ///< for on_record
struct ArmEval { std::chrono::steady_clock::duration after; };  ///< call eval_tick() after this long
}  // namespace coordinator_action

using CoordinatorAction =
    std::variant<coordinator_action::Leave, coordinator_action::Kill, coordinator_action::Evaluate,
                 coordinator_action::Finish, coordinator_action::Fail, coordinator_action::Dismiss,
                 coordinator_action::Place, coordinator_action::Join, coordinator_action::StartWorker,
                 coordinator_action::EpochDone, coordinator_action::PointDone, coordinator_action::Record,
                 coordinator_action::ArmEval>;
using CoordinatorActions = std::vector<CoordinatorAction>;

class CoordinatorCore {
 public:
  using Instant = CoordinatorInstant;
  using Actions = CoordinatorActions;

  /// `dataset` names the data for the summary.
  CoordinatorCore(JobConfig config, JobPlan plan, std::string dataset);

  const JobConfig& config() const { return config_; }
  const JobPlan& plan() const { return plan_; }
  const Membership& members() const { return members_; }
  const EpochTracker& epochs() const { return epochs_; }
  const EvalSchedule& evals() const { return evals_; }
  const std::optional<ResumePlan>& resumed() const { return resumed_; }
  bool done() const { return done_; }
  bool finishing() const { return finishing_; }
  std::optional<double> last_val_accuracy() const { return last_val_accuracy_; }
  /// Seconds since training started at `now`; 0 before.
  double training_seconds(Instant now) const;

  // Start-up.
  /// --resume: the workers start again where `r` says.
  void resume(ResumePlan r);
  /// --worker-weights auto: shares sized by the measured rates.
  void calibrated(const std::vector<double>& samples_per_s);
  /// Training starts at `now`.
  void start_training(Instant now, Actions& out);

  // What arrives.
  void report(const EpochReport& r, Instant now, Actions& out);
  void progress(const WorkerProgress& p, Instant now) { members_.progress(p, now); }
  /// Worker w's actor stopped normally: it finished its share.
  void worker_finished(std::uint32_t w, Actions& out);
  /// Worker w's actor stopped abnormally (went silent), for `why`.
  void worker_lost(std::uint32_t w, const std::string& why, Actions& out);
  /// Worker w's supervisor saw its process end: killed and lost at once.
  void worker_gone(std::uint32_t w, const std::string& why, Actions& out);
  /// A worker (or the cluster) says the job cannot go on.
  void failed(StatusCode code, const std::string& what, Actions& out);
  void cancel(Actions& out) { fail(Status::Cancelled("the job was cancelled"), out); }
  /// Fails the job, once: later calls append nothing.
  void fail(Status status, Actions& out);
  /// An --eval-every tick at `now`.
  void eval_tick(Instant now, Actions& out);
  /// The evaluation Evaluate asked for gave `accuracy`; done at `now`.
  void evaluated(double accuracy, Instant now, Actions& out);
  /// Shard stats and the test accuracy after Finish: the summary (logged);
  /// the job is done.
  JobSummary finished(double test_accuracy, const std::vector<ShardStats>& stats);

  // Rejoins: a new process registered for worker w. `placeable`: the job
  // runs its workers in other processes.
  void rejoin(std::uint32_t w, bool placeable, Actions& out);
  void refuse_rejoin(std::uint32_t w, const std::string& why, Actions& out);
  void rejoined(std::uint32_t w, std::uint64_t first_epoch, Actions& out);
  void rejoin_confirmed(std::uint32_t w, std::uint64_t first_epoch, Instant now, Actions& out);

  /// A shard's process was restarted at `now`: counted; returns training seconds.
  double shard_restarted(Instant now);

  // Live status.
  Progress tick(Instant now) {
    return live_.tick(members_, members_.totals(training_seconds(now)), config_.epochs, last_val_accuracy_);
  }
  void fill_live(LiveSnapshot& snap, const Progress& p, Instant now) const {
    live_.fill(snap, p, members_, evaluations_, now);
  }

 private:
  void complete_epochs(Actions& out);
  void maybe_evaluate(Actions& out);
  void maybe_finish(Actions& out);
  void lose(std::uint32_t w, const std::string& why, Actions& out);
  void note_accuracy(double accuracy, double at_s);
  JobSummary summary(double test_accuracy, const std::vector<std::uint64_t>& histogram) const;
  std::string divergence_hint() const;

  JobConfig config_;
  JobPlan plan_;
  std::string dataset_;
  Membership members_;
  EpochTracker epochs_;
  EvalSchedule evals_;
  LiveView live_;
  std::optional<ResumePlan> resumed_;
  Instant train_start_{};
  ProgressTotals last_point_;  // at the previous epoch or eval point
  std::optional<double> time_to_target_s_;
  std::optional<double> last_val_accuracy_;
  std::uint64_t evaluations_ = 0;
  std::uint32_t shard_restarts_ = 0;
  bool last_epoch_evaluated_ = false;
  bool finishing_ = false;
  bool done_ = false;
};

}  // namespace asgd
