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
//                  last said of its progress   (coordinator_membership.hpp)
//   EpochTracker   reports summed per epoch, when an epoch is complete (every
//                  live worker reported), its metrics   (coordinator_epochs.hpp)
//   EvalSchedule   when to evaluate: each completed epoch in order, and every
//                  --eval-every seconds between them   (coordinator_epochs.hpp)
//   LiveView       Progress and the live status   (coordinator_live.hpp)
//   resume         where a --resume'd job starts, and the metrics file's
//                  records of resumes and restarts   (coordinator_resume.hpp)
// each with its .cpp. CoordinatorCore ties them together and decides
// rejoins and how the job ends: finished exactly once, after the last
// epoch's evaluation and every worker's stop, or failed exactly once.
//
// Not thread-safe: the actor serialises calls.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/coordinator_epochs.hpp"
#include "actors/coordinator_live.hpp"
#include "actors/coordinator_membership.hpp"
#include "actors/coordinator_resume.hpp"
#include "actors/job_plan.hpp"
#include "asgd/job.hpp"
#include "asgd/status.hpp"
#include "messaging/protocol.hpp"

namespace asgd {

/// A cancelled job's message (JobHandle::cancel, Ctrl-C, a stop token).
inline constexpr const char* kJobCancelled = "the job was cancelled";

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
/// --stop-at-target: every worker's data feeder serves no more, so each
/// worker stops after the step it is in (and reports what it did of its epoch).
struct StopTraining {};
}  // namespace coordinator_action

using CoordinatorAction =
    std::variant<coordinator_action::Leave, coordinator_action::Kill, coordinator_action::Evaluate,
                 coordinator_action::Finish, coordinator_action::Fail, coordinator_action::Dismiss,
                 coordinator_action::Place, coordinator_action::Join, coordinator_action::StartWorker,
                 coordinator_action::EpochDone, coordinator_action::PointDone, coordinator_action::Record,
                 coordinator_action::ArmEval, coordinator_action::StopTraining>;
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
  /// The updates applied so far: the evaluated epochs' and, once stopped
  /// at the target, those reported since (epochs never evaluated).
  std::uint64_t updates() const { return epochs_.updates() + (stopped_ ? epochs_.pending_updates() : 0); }
  std::optional<double> last_val_accuracy() const { return last_val_accuracy_; }
  /// Seconds since training started at `now`; 0 before.
  double training_seconds(Instant now) const;

  // Start-up.
  /// --resume: the workers start again where `r` says.
  void resume(ResumePlan r);
  /// --worker-weights auto: batches and shares sized by the measured step
  /// costs, so that every worker's step takes equally long.
  void calibrated(const std::vector<StepCost>& costs);
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
  void cancel(Actions& out) { fail(Status::Cancelled(kJobCancelled), out); }
  /// Fails the job, once: later calls append nothing.
  void fail(Status status, Actions& out);
  /// An --eval-every tick at `now`.
  void eval_tick(Instant now, Actions& out);
  /// The evaluation Evaluate asked for gave `accuracy` on parameters that
  /// hold `applied` worker pushes (none: unknown, the workers' reports
  /// count); done at `now`.
  void evaluated(double accuracy, std::optional<std::uint64_t> applied, Instant now, Actions& out);
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
  bool note_accuracy(double accuracy, double at_s);
  void stop_at_target(double accuracy, double at_s, Actions& out);
  JobSummary summary(double test_accuracy, const std::vector<std::uint64_t>& histogram) const;
  std::string divergence_hint() const;

  JobConfig config_;
  JobPlan plan_;
  std::string dataset_;
  Membership members_;
  std::map<std::uint32_t, std::string> gone_before_training_;  // worker_gone() before start_training()
  EpochTracker epochs_;
  EvalSchedule evals_;
  LiveView live_;
  std::optional<ResumePlan> resumed_;
  Instant train_start_{};
  ProgressTotals last_point_;  // at the previous epoch or eval point
  std::optional<double> time_to_target_s_;
  static constexpr double kDivergedLossFactor = 100.0;
  void warn_if_diverging(const EpochMetrics& m) const;
  std::optional<double> last_val_accuracy_;
  /// What the shards had applied when an epoch's parameters were read (the
  /// fewest of any shard): a lost worker's pushes after its last report are
  /// there, not in the workers' counts.
  std::uint64_t shards_applied_ = 0;
  std::uint64_t evaluations_ = 0;
  std::uint32_t shard_restarts_ = 0;
  bool last_epoch_evaluated_ = false;
  bool stopped_ = false;  // --stop-at-target: training stops; no epoch or point is evaluated any more
  bool finishing_ = false;
  bool done_ = false;
};

}  // namespace asgd
