#pragma once
// ssp(s), stale-synchronous parallel (Ho et al. 2013): shards apply every
// gradient as it arrives, but a read at clock c is answered only once the
// slowest live worker has reached clock c - s, so it contains every update of
// clocks up to c - s - 1. A worker therefore blocks exactly when it is s + 1
// clocks ahead of the slowest. ssp(0) admits the same reads at the same
// moments as bsp; ssp(infinity) is async.

#include "policies/registry.hpp"

namespace asgd {

class SspPolicy final : public ConsistencyPolicy {
 public:
  explicit SspPolicy(std::uint32_t staleness) : s_(staleness) {}

  std::string name() const override { return "ssp:" + std::to_string(s_); }
  std::optional<std::uint32_t> staleness_bound() const override { return s_; }
  StepPlan plan(std::uint64_t) const override { return {.local_update = false, .push = true, .pull = true}; }
  PushAction admit_push(const PushInfo&, const ClockView&) const override { return PushAction::apply; }
  bool may_answer_pull(const PullInfo& pull, const ClockView& view) const override {
    return view.min_clock + s_ >= pull.clock;
  }

 private:
  std::uint32_t s_;
};

inline PolicyEntry ssp_policy_entry() {
  return {"ssp",
          "stale-synchronous: a worker may run S clocks ahead of the slowest (ssp:S)",
          "staleness",
          {{"staleness", "S", 3, 0, 1e9, true, "ssp: how many clocks a worker may run ahead of the slowest"}},
          [](const PolicyOptions& o) { return std::make_unique<SspPolicy>(static_cast<std::uint32_t>(o.at("staleness"))); }};
}

}  // namespace asgd
