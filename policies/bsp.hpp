#pragma once
// bsp, bulk-synchronous parallel: for clock t every shard waits for the
// gradient of every live worker, averages them (weighted by batch size),
// applies the average once, and only then answers reads at clock t + 1.
// With b backup workers (Chen et al. 2016) it commits once the first
// N - b gradients of clock t are in and discards the ones that come later.

#include "policies/registry.hpp"

namespace asgd {

class BspPolicy final : public ConsistencyPolicy {
 public:
  explicit BspPolicy(std::uint32_t backup_workers) : backups_(backup_workers) {}

  std::string name() const override { return "bsp"; }
  std::optional<std::uint32_t> staleness_bound() const override { return 0; }
  StepPlan plan(std::uint64_t) const override { return {.local_update = false, .push = true, .pull = true}; }
  PushAction admit_push(const PushInfo& push, const ClockView& view) const override {
    return push.clock < view.committed ? PushAction::discard : PushAction::aggregate;
  }
  bool commit_ready(Clock, std::uint32_t contributions, const ClockView& view) const override {
    // With every worker gone there is nothing left to wait for: commit what
    // the departed pushed. Otherwise at least one live push, even when
    // backups outnumber the live workers.
    if (view.live_workers == 0) return true;
    const std::uint32_t needed = view.live_workers > backups_ ? view.live_workers - backups_ : 1;
    return contributions >= needed;
  }
  bool may_answer_pull(const PullInfo& pull, const ClockView& view) const override {
    return view.committed >= pull.clock;
  }

 private:
  std::uint32_t backups_;
};

inline PolicyEntry bsp_policy_entry() {
  return {"bsp",
          "bulk-synchronous: each clock's gradients are averaged into one step",
          "",
          {{"backup-workers", "B", 0, 0, 1e9, true, "bsp: apply a clock once all but B workers pushed; drop the late"}},
          [](const PolicyOptions& o) {
            return std::make_unique<BspPolicy>(static_cast<std::uint32_t>(o.at("backup-workers")));
          }};
}

}  // namespace asgd
