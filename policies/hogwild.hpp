#pragma once
// hogwild (Recht et al. 2011): the workers of one process share one
// parameter buffer and each applies its own updates to it in place, without
// locks; no shard round trip is on the hot path (shards only serve
// snapshots of the shared buffer). It needs one address space, so it is
// refused where workers do not share host memory.

#include "policies/registry.hpp"

namespace asgd {

class HogwildPolicy final : public ConsistencyPolicy {
 public:
  std::string name() const override { return "hogwild"; }
  std::optional<std::uint32_t> staleness_bound() const override { return std::nullopt; }
  StepPlan plan(std::uint64_t) const override { return {.local_update = true, .push = false, .pull = false}; }
  bool shares_parameters() const override { return true; }
  // Nothing is pushed or read through a shard; answer whatever comes.
  PushAction admit_push(const PushInfo&, const ClockView&) const override { return PushAction::apply; }
  bool may_answer_pull(const PullInfo&, const ClockView&) const override { return true; }
};

inline PolicyEntry hogwild_policy_entry() {
  return {"hogwild",
          "lock-free updates of one shared buffer (one process only)",
          "",
          {},
          [](const PolicyOptions&) { return std::make_unique<HogwildPolicy>(); }};
}

}  // namespace asgd
