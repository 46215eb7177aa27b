#pragma once
// Comparing consistency policies (asgd compare): what one run leaves behind,
// the accuracy target the runs are timed against, their spread over repeats,
// speedup over worker counts, and the CSV files. Plain data and pure
// functions: nothing here runs a job or touches the disk but write_file.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asgd/job.hpp"
#include "asgd/status.hpp"

namespace asgd::experiments {

/// One point of a run's learning curve: the end of an epoch, or a validation
/// evaluation between epochs (--eval-every).
struct CurvePoint {
  enum class Kind { epoch, eval };
  Kind kind = Kind::epoch;
  std::optional<std::uint32_t> epoch;     ///< 1-based; epoch points only
  double wall_s = 0.0;                    ///< seconds since training started
  std::optional<std::uint64_t> updates;   ///< updates applied so far; none when not reported
  std::optional<std::uint64_t> samples;   ///< training samples so far; none when not known
  std::optional<double> train_loss;       ///< none when no batch was reported
  double val_accuracy = 0.0;
  std::optional<double> samples_per_s;    ///< over the epoch; epoch points only
};

/// `samples`: training samples after this epoch, when the caller knows them.
CurvePoint curve_point(const EpochMetrics& m, std::optional<std::uint64_t> samples = std::nullopt);
/// An evaluation whose updates, samples and loss read 0 (a runtime that does
/// not report them) gets none for each rather than a false zero.
CurvePoint curve_point(const EvalPoint& e);

/// One finished job of a comparison.
struct RunRecord {
  std::string policy;           ///< the --policies entry as given ("ssp:3")
  std::uint32_t workers = 0;
  std::uint32_t repeat = 0;     ///< 0-based; runs with the same repeat share a seed
  std::uint64_t seed = 0;
  JobSummary summary;
  /// The run's learning rate and batch per worker step, given or its
  /// policy's and worker count's defaults (training_settings).
  double lr = 0.0;
  std::uint32_t batch = 0;
  std::vector<CurvePoint> curve;  ///< in wall_s order
  /// Joules the run's machine drew (summary.energy, where RAPL or NVML
  /// measured it), and its energy-delay product (joules x seconds).
  std::optional<double> energy_j;
  std::optional<double> edp_js;
};

/// "<policy>-w<workers>-r<repeat>": the run's name in every output
/// (runs/<id>.jsonl, the CSV files, the report).
std::string run_id(const RunRecord& run);

/// Fills each epoch point's `samples` from the run's total training samples
/// (epoch e of E: total * e / E) where the runtime did not report them.
void fill_epoch_samples(RunRecord& run, std::uint64_t total_samples);

/// "bsp,ssp:3,async" -> {"bsp", "ssp:3", "async"}, in the order given.
/// Errors: invalid_argument naming the text for an empty list or entry, or
/// an entry given twice. Whether each names a policy is validate()'s call.
Result<std::vector<std::string>> parse_policy_list(const std::string& text);

/// "4" or "1,2,4" -> worker counts, ascending. Errors: invalid_argument
/// naming the text for anything but distinct whole numbers >= 1.
Result<std::vector<std::uint32_t>> parse_worker_list(const std::string& text);

/// The job of one run: `base` under `policy` (an entry as given, "ssp:3")
/// with `workers` workers and seed base.seed + repeat. A policy's settings
/// (policy_options, by the registry's knobs; staleness_aware_lr: async and
/// ssp) stay as given for the policies that take them and return to their
/// defaults for the others, so one command line serves every entry. A
/// --device list with more items than `workers` gives the run its first
/// `workers` items (one device per worker). metrics_out and checkpoint_dir
/// are left as they are.
JobConfig config_for_run(const JobConfig& base, const std::string& policy, std::uint32_t workers,
                         std::uint32_t repeat);

/// The validation accuracy every run is timed against.
struct Target {
  double accuracy = 0.0;
  bool given = false;    ///< --target-accuracy; else the highest accuracy every run reached
  std::string how;       ///< one sentence saying how it was chosen, for the report
};

/// The highest validation accuracy that every run reached (the smallest of
/// the runs' best), floored to a multiple of 0.005; none without runs or
/// when a run has no curve point.
std::optional<double> highest_common_accuracy(const std::vector<RunRecord>& runs);

/// `given` when set; else highest_common_accuracy; none when neither.
std::optional<Target> choose_target(const std::vector<RunRecord>& runs, std::optional<double> given);

/// The wall_s of the first point with val_accuracy >= target (up to 1e-9,
/// so that a target chosen from the points themselves is always reached);
/// none when no point reaches it.
std::optional<double> time_to_target(const std::vector<CurvePoint>& curve, double target);

/// Mean, min and max of a non-empty set of values.
struct Spread {
  double mean = 0.0;
  double min = 0.0;
  double max = 0.0;
  std::size_t n = 0;
};
/// none for no values.
std::optional<Spread> spread(const std::vector<double>& values);

/// The runs of one (policy, workers) pair, over repeats.
struct GroupStats {
  std::string policy;
  std::uint32_t workers = 0;
  std::size_t runs = 0;
  std::size_t reached = 0;                  ///< runs that reached the target
  std::optional<Spread> time_to_target_s;   ///< over the runs that reached it
  Spread final_test_accuracy;
  Spread train_s;
  Spread samples_per_s;
  std::optional<Spread> energy_j;           ///< over the runs that measured it
  std::optional<Spread> edp_js;
};

/// One group per (policy, workers) that has runs: policies in the order of
/// `policies`, then workers ascending.
std::vector<GroupStats> group_stats(const std::vector<RunRecord>& runs, const std::vector<std::string>& policies,
                                    const std::optional<Target>& target);

/// One policy at one worker count against the same policy at the smallest
/// worker count that ran (the base).
struct ScalingRow {
  std::string policy;
  std::uint32_t workers = 0;
  std::uint32_t base_workers = 0;  ///< the smallest worker count; 1 unless that one was not run
  /// What T is: "time to target" when every run of the policy reached the
  /// target, else "training time" (train_s), for every worker count alike.
  std::string measure;
  double time_s = 0.0;             ///< mean T over repeats
  double speedup = 0.0;            ///< T(base) / T(workers)
  /// speedup / (workers / base_workers): speedup / workers when the base is
  /// one worker.
  double efficiency = 0.0;
};

/// For each policy run at two or more worker counts, one row per count
/// (the base included, at speedup 1). Empty when no policy was.
std::vector<ScalingRow> scaling_rows(const std::vector<GroupStats>& groups);

/// One CSV field: as is, or double-quoted (quotes doubled) when it holds a
/// comma, a quote or a line break.
std::string csv_field(std::string_view text);

/// results.csv: a header, then one row per run (see docs/comparing-policies.md).
std::string results_csv(const std::vector<RunRecord>& runs, const std::optional<Target>& target);

/// curves.csv: a header, then one row per (run, curve point).
std::string curves_csv(const std::vector<RunRecord>& runs);

/// Writes `content` to `path` through a temporary file renamed into place,
/// so a reader never sees half a file. Errors: io_error naming the path.
Status write_file(const std::string& path, std::string_view content);

}  // namespace asgd::experiments
