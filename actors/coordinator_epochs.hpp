#pragma once
// The coordinator's epochs and evaluations: reports summed per epoch, when
// an epoch is complete, its metrics, and when to evaluate. Part of
// CoordinatorCore (coordinator_core.hpp); not thread-safe.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <optional>
#include <vector>

#include "actors/coordinator_membership.hpp"
#include "asgd/job.hpp"

namespace asgd {

/// Merges shard staleness histograms into (mean, p99, max).
struct StalenessSummary {
  double mean = 0.0;
  double p99 = 0.0;
  double max = 0.0;
  std::uint64_t count = 0;
};
StalenessSummary summarize_staleness(const std::vector<std::uint64_t>& histogram);

/// A worker's epoch report (or a sum of them) as its phases.
WorkerPhases phases_of(const EpochReport& r);

/// Adds histogram `h` into `into`, growing it as needed.
void merge_histogram(std::vector<std::uint64_t>& into, const std::vector<std::uint64_t>& h);

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
    /// The longest any one worker spent on it (computing, waiting for shards
    /// and for data): the epoch cannot have taken less, even when its
    /// reports arrived together with the previous epoch's.
    double busiest_s = 0.0;
    std::vector<WorkerPhases> phases;    // per worker, as reported (wall 0: not reported)
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
  std::uint64_t pending_updates() const;              ///< reported in epochs not evaluated (yet)
  void set_updates(std::uint64_t u) { updates_ = u; }
  double train_s() const { return train_s_; }         ///< when the last epoch ended; 0 until then
  double latest_report_s() const { return latest_report_s_; }  ///< the latest report's arrival

 private:
  std::uint32_t workers_;
  std::uint32_t epochs_;
  std::map<std::uint64_t, Epoch> epochs_seen_;  // epoch (0-based) -> reports so far
  std::set<std::uint64_t> evaluated_;           // epochs whose line is written
  std::vector<EpochReport> totals_;
  std::uint64_t updates_ = 0;
  double last_end_s_ = 0.0;
  double train_s_ = 0.0;
  double latest_report_s_ = 0.0;
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

}  // namespace asgd
