#pragma once
// async (Downpour SGD, Dean et al. 2012): shards apply every push the moment
// it arrives and answer every read at once; workers never wait for each
// other. A worker pulls every `fetch_every` steps and pushes the gradients it
// accumulated every `push_every` steps (Downpour's n_fetch and n_push), which
// trades traffic for staleness.

#include "policies/registry.hpp"

namespace asgd {

class AsyncPolicy final : public ConsistencyPolicy {
 public:
  AsyncPolicy(std::uint32_t fetch_every, std::uint32_t push_every)
      : fetch_every_(fetch_every), push_every_(push_every) {}

  std::string name() const override { return "async"; }
  std::optional<std::uint32_t> staleness_bound() const override { return std::nullopt; }
  StepPlan plan(std::uint64_t step) const override {
    return {.local_update = false, .push = (step + 1) % push_every_ == 0, .pull = (step + 1) % fetch_every_ == 0};
  }
  PushAction admit_push(const PushInfo&, const ClockView&) const override { return PushAction::apply; }
  bool may_answer_pull(const PullInfo&, const ClockView&) const override { return true; }

 private:
  std::uint32_t fetch_every_;
  std::uint32_t push_every_;
};

inline PolicyEntry async_policy_entry() {
  return {"async",
          "Downpour SGD: shards apply every push at once, nobody waits",
          "",
          {{"fetch-every", "N", 1, 1, 1e9, true, "async: pull parameters every N steps"},
           {"push-every", "N", 1, 1, 1e9, true, "async: push accumulated gradients every N steps"}},
          [](const PolicyOptions& o) {
            return std::make_unique<AsyncPolicy>(static_cast<std::uint32_t>(o.at("fetch-every")),
                                                 static_cast<std::uint32_t>(o.at("push-every")));
          }};
}

}  // namespace asgd
