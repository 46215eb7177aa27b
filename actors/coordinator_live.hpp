#pragma once
// Progress and the live status, from the workers' latest progress. Part of
// CoordinatorCore (coordinator_core.hpp); not thread-safe.

#include <cstdint>
#include <optional>
#include <vector>

#include "actors/coordinator_membership.hpp"
#include "actors/live_status.hpp"
#include "asgd/job.hpp"

namespace asgd {

/// Progress and the live status from the workers' latest progress.
class LiveView {
 public:
  /// Each worker's samples an epoch, and the epochs this run trains
  /// (from `first_epoch`, a resumed job's, to `epochs`).
  void set_plan(std::vector<std::uint64_t> per_epoch, std::uint64_t first_epoch, std::uint64_t epochs);
  /// The whole job's samples: each worker's planned ones; a lost worker's
  /// as far as it came (its share is not done by anyone); a rejoined one's
  /// as far as its earlier processes came and then from the epoch it
  /// rejoined at (the epochs between are skipped).
  std::uint64_t total_samples(const Membership& members) const;
  /// Progress since the previous tick, which `now_totals` become.
  Progress tick(const Membership& members, const ProgressTotals& now_totals, std::uint32_t epochs,
                std::optional<double> val_accuracy);
  /// Writes `p` (tick's), the totals it came from and each worker's state
  /// into `snap`; `now` dates the workers' last reports.
  void fill(LiveSnapshot& snap, const Progress& p, const Membership& members, std::uint64_t evaluations,
            CoordinatorInstant now) const;

 private:
  std::vector<std::uint64_t> per_epoch_;  // per worker
  std::uint64_t first_epoch_ = 0, epochs_ = 0;
  ProgressTotals last_;                 // at the previous tick
};

/// Shard stats as the live status shows them; `now_unix` dates its checkpoint.
LiveShard live_shard(const ShardStats& s, double now_unix);

}  // namespace asgd
