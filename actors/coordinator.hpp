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
// Watches every actor it started; one that stops abnormally fails the job
// with a message naming it.

#include <caf/all.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>

#include "actors/key_range.hpp"
#include "actors/messages.hpp"
#include "asgd/job.hpp"
#include "compute/model.hpp"

namespace asgd {

struct CoordinatorSetup {
  JobConfig config;
  std::shared_ptr<const data::DatasetSplits> data;
  std::function<void(const EpochMetrics&)> on_epoch;   ///< called from the coordinator's thread
  std::shared_ptr<std::promise<Result<JobSummary>>> outcome;  ///< set exactly once
};

struct CoordinatorState {
  CoordinatorSetup setup;
  std::optional<Model> model;                 // for initialisation and evaluation
  std::vector<KeyRange> ranges;
  std::vector<caf::actor> shards;
  std::vector<caf::actor> workers;
  std::vector<caf::actor> feeders;
  std::map<caf::actor_addr, std::string> names;  // for diagnostics: "worker 1", "shard 0"

  struct EpochAgg {
    std::uint32_t reports = 0;
    EpochReport sum;          // samples, loss and updates summed over workers
    double end_s = 0.0;       // when the last report arrived, since train_start
    double duration_s = 0.0;  // since the previous epoch ended
  };
  std::map<std::uint64_t, EpochAgg> epochs;   // epoch (0-based) -> reports so far
  std::deque<std::uint64_t> to_evaluate;      // completed epochs, in order
  bool evaluating = false;
  std::uint64_t updates = 0;                  // cumulative over completed epochs
  std::chrono::steady_clock::time_point train_start;
  std::chrono::steady_clock::time_point last_epoch_end;
  double train_s = 0.0;
  std::optional<double> time_to_target_s;
  std::vector<EpochReport> worker_totals;     // per worker, for the closing log
  bool done = false;
  static inline const char* name = "coordinator";
};

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup);

/// How many pushes every worker together will send over the whole job (each
/// shard applies all of them under async): the length of the learning-rate
/// schedule.
std::uint64_t planned_pushes(const JobConfig& config, std::size_t train_count);

/// Merges shard staleness histograms into (mean, p99, max).
struct StalenessSummary {
  double mean = 0.0;
  double p99 = 0.0;
  double max = 0.0;
  std::uint64_t count = 0;
};
StalenessSummary summarize_staleness(const std::vector<ShardStats>& stats);

}  // namespace asgd
