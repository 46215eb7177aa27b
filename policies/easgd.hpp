#pragma once
// easgd (elastic averaging SGD, Zhang, Choromanska and LeCun 2015, the
// asynchronous variant): each worker trains its own parameters x_i with its
// own optimizer and, every tau local steps, pushes them; the shard moves its
// center variable c towards them and them towards it by the moving rate
// alpha times their difference,
//   d = alpha (x_i - c),   c <- c + d,   x_i <- x_i - d,
// and replies with the worker's moved x_i. Nobody waits for anybody: the
// elastic force, not a barrier, keeps the workers near the center, which is
// the model the job evaluates and writes.

#include "policies/registry.hpp"

namespace asgd {

class EasgdPolicy final : public ConsistencyPolicy {
 public:
  EasgdPolicy(std::uint32_t local_steps, float moving_rate) : tau_(local_steps), alpha_(moving_rate) {}

  std::string name() const override { return "easgd"; }
  std::optional<std::uint32_t> staleness_bound() const override { return std::nullopt; }
  StepPlan plan(std::uint64_t step) const override {
    const bool round_end = (step + 1) % tau_ == 0;
    return {.local_update = true, .push = round_end, .pull = round_end};
  }
  Payload payload() const override { return Payload::parameters; }
  Combine combine() const override { return {.rule = Combine::Rule::elastic, .moving_rate = alpha_}; }
  PushAction admit_push(const PushInfo&, const ClockView&) const override { return PushAction::apply; }
  bool may_answer_pull(const PullInfo&, const ClockView&) const override { return true; }

 private:
  std::uint32_t tau_;
  float alpha_;
};

inline PolicyEntry easgd_policy_entry() {
  return {"easgd",
          "elastic averaging: workers keep their own parameters, pulled towards a center every tau steps",
          "",
          {{"local-steps", "TAU", 4, 1, 1e9, true, "easgd: local steps between elastic moves (tau)"},
           {"moving-rate", "ALPHA", 0.45, 0, 1, false,
            "easgd: the share of their difference center and worker each move (alpha)", true, "0.9 / workers"}},
          [](const PolicyOptions& o) {
            return std::make_unique<EasgdPolicy>(static_cast<std::uint32_t>(o.at("local-steps")),
                                                 static_cast<float>(o.at("moving-rate")));
          }};
}

}  // namespace asgd
