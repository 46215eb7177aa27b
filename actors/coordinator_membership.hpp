#pragma once
// The coordinator's view of its workers: which are live, lost or finished,
// and what each last said of its progress. Part of CoordinatorCore
// (coordinator_core.hpp); not thread-safe.

#include <chrono>
#include <cstdint>
#include <vector>

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

/// The mean loss of the batches reported between two totals; NaN for none.
double loss_between(const ProgressTotals& from, const ProgressTotals& to);

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
    /// What the processes that had its place before reported (samples,
    /// updates, loss; at_s unused): the totals count on from there, so that
    /// they never go back when a new process starts from zero.
    ProgressTotals before;
    /// Its place's counts: `before` and this process's latest (at_s unused).
    ProgressTotals counted() const {
      return {before.samples + latest.samples, before.updates + latest.updates, before.loss_sum + latest.loss_sum,
              before.loss_samples + latest.loss_samples};
    }
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
  /// Worker w reported epoch `epoch` (0-based) complete: it trains the next
  /// one, whatever its last progress said (which comes up to 0.25 s later).
  void completed(std::size_t w, std::uint64_t epoch);
  /// The furthest epoch any other worker that is not lost is in (one that
  /// finished: past its last; 0 for none).
  std::uint64_t furthest_epoch_besides(std::size_t w) const;
  ProgressTotals totals(double at_s) const;

 private:
  std::vector<Worker> seen_;
  std::uint32_t stopped_ = 0;
  std::uint32_t lost_ = 0;
  std::uint32_t rejoined_ = 0;
};

}  // namespace asgd
