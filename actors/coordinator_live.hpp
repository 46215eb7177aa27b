#pragma once
// Progress and the live status, from the workers' latest progress. Part of
// CoordinatorCore (coordinator_core.hpp); not thread-safe.

#include <cstdint>
#include <optional>

#include "actors/coordinator_membership.hpp"
#include "actors/live_status.hpp"
#include "asgd/job.hpp"

namespace asgd {

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

}  // namespace asgd
