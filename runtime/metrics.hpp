#pragma once
// The metrics file: JSON Lines, one object per line, each with "event".
// "epoch" lines as epochs finish, then exactly one "summary" line, always
// the last. Field names and meanings are the contract of DESIGN.md and
// docs/metrics.md.

#include <optional>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "asgd/job.hpp"

namespace asgd {

nlohmann::json to_json(const WorkerPhases& p);
nlohmann::json to_json(const EnergyUse& e);
nlohmann::json to_json(const EpochMetrics& m);
nlohmann::json to_json(const EvalPoint& e);
nlohmann::json to_json(const JobSummary& s);

/// The records back from a metrics file (asgd compare --processes reads
/// each run's): the inverse of to_json. Errors: invalid_argument naming the
/// field that is missing or of another type.
Result<EpochMetrics> epoch_from_json(const nlohmann::json& j);
Result<EvalPoint> eval_from_json(const nlohmann::json& j);
Result<JobSummary> summary_from_json(const nlohmann::json& j);

/// Why `metrics_out` cannot be a job's metrics file: it is one of the files
/// of the job's checkpoint folder (`checkpoint_dir`, else the `resume`
/// folder), which the job writes itself or a --resume reads. Ok for an
/// empty path. (Whether it can be written is for where it is written:
/// MetricsWriter::open.)
Status check_metrics_path(const std::string& metrics_out, const std::string& checkpoint_dir, const std::string& resume);

/// Appends records to a file, flushing each line so a crash loses at most
/// the line being written. Holds the file locked (flock) while it lives:
/// one job at a time writes it. Not thread-safe.
class MetricsWriter {
 public:
  /// Creates `path` and locks it, or appends to it (a resumed job's file
  /// goes on). An earlier file is emptied at the first write, not here: a
  /// job refused after this (a usage error) leaves the file as it found
  /// it. Errors: invalid_argument naming the path when it cannot be
  /// written, or when another job (in this process or another) writes it:
  /// two jobs' lines interleaved in one file, both ending ok.
  static Result<MetricsWriter> open(const std::string& path, bool append = false);
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&&) = delete;
  MetricsWriter(const MetricsWriter&) = delete;
  ~MetricsWriter();
  /// One line, whole or not at all: a write that fails part-way is cut
  /// back, so the file stays valid JSON Lines.
  Status write(const nlohmann::json& record);

 private:
  MetricsWriter() = default;
  std::string path_;
  int fd_ = -1;
  bool empty_first_ = false;  ///< the earlier file's lines go at the first write
  bool file_ = true;          ///< a regular file (not /dev/null, a terminal or a pipe)
  std::FILE* flush_first_ = nullptr;  ///< stdout or stderr, when the file is theirs: flushed before each line
};

/// A job's metrics file, when it has one: records go there until a write
/// fails, and the first failure is kept for the end of the job.
struct MetricsSink {
  std::optional<MetricsWriter> writer;
  Status error;
  /// The writer of `path` (MetricsWriter::open); none for an empty path.
  Status open(const std::string& path, bool append);
  void write(const nlohmann::json& record);
  /// The last line of a job that failed or was cancelled, in
  /// place of the summary: {"event": "stopped", "status": "cancelled",
  /// "message": why, "wall_s": seconds since the job began}.
  void stopped(const Status& why, double wall_s);
};

}  // namespace asgd
