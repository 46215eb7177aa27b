#pragma once
// averaging (periodic parameter averaging, "local SGD"): every worker takes
// k local steps with its own optimizer, then pushes its parameters; once
// every live worker's parameters for that round are in, the shard replaces
// its copy by their average (weighted by batch size) and answers the reads
// for the next round. A round ending at clock t is committed as clock t.

#include "policies/registry.hpp"

namespace asgd {

class AveragingPolicy final : public ConsistencyPolicy {
 public:
  explicit AveragingPolicy(std::uint32_t local_steps) : k_(local_steps) {}

  std::string name() const override { return "averaging"; }
  /// Each worker's last local step of a round lacks the others' last k - 1.
  std::optional<std::uint32_t> staleness_bound() const override { return k_ - 1; }
  StepPlan plan(std::uint64_t step) const override {
    const bool round_end = (step + 1) % k_ == 0;
    return {.local_update = true, .push = round_end, .pull = round_end};
  }
  Payload payload() const override { return Payload::parameters; }
  Combine combine() const override { return {.rule = Combine::Rule::replace}; }
  PushAction admit_push(const PushInfo& push, const ClockView& view) const override {
    return push.clock < view.committed ? PushAction::discard : PushAction::aggregate;
  }
  bool may_answer_pull(const PullInfo& pull, const ClockView& view) const override {
    return view.committed >= pull.clock;
  }

 private:
  std::uint32_t k_;
};

inline PolicyEntry averaging_policy_entry() {
  return {"averaging",
          "local SGD: K local steps, then the workers' parameters are averaged",
          "",
          {{"local-steps", "K", 8, 1, 1e9, true, "averaging: local steps between parameter averages", false,
            "8, 4 beyond 8 workers"}},
          [](const PolicyOptions& o) {
            return std::make_unique<AveragingPolicy>(static_cast<std::uint32_t>(o.at("local-steps")));
          }};
}

}  // namespace asgd
