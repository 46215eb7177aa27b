#pragma once
// The decentralized policies: workers synchronise with each other, not
// through the shards.
//
// allreduce (synchronous, as PyTorch DDP and Horovod train): every step the
// workers' gradients are averaged by an all-reduce (weighted by samples,
// summed in worker order) and each worker applies the same step with its own
// optimizer to its own copy of the parameters, so the copies stay identical.
// It is bsp's update without the round trip: same seed, same result.
//
// gossip:S (stale-synchronous and decentralized): after its own step a worker
// averages its parameters with its peers' latest copies (its neighbours on a
// ring, or one seeded random peer each step), using a peer's copy only if it
// is from clock c - S or later, where c is its own clock, and waiting
// otherwise. Staleness is bounded by S and counted per peer copy used.
//
// Under both the shards keep only what the workers publish every
// publish-steps steps (their parameters, which replace the shard's): what
// the coordinator evaluates and checkpoints. No gradient goes through them.

#include "base/random.hpp"
#include "policies/registry.hpp"

namespace asgd {

class DecentralizedPolicy : public ConsistencyPolicy {
 public:
  explicit DecentralizedPolicy(std::uint32_t publish_steps) : publish_(publish_steps) {}

  StepPlan plan(std::uint64_t step) const override {
    return {.local_update = true, .push = (step + 1) % publish_ == 0, .pull = false};
  }
  Payload payload() const override { return Payload::parameters; }
  Combine combine() const override { return {.rule = Combine::Rule::replace}; }
  PushAction admit_push(const PushInfo&, const ClockView&) const override { return PushAction::apply; }
  bool may_answer_pull(const PullInfo&, const ClockView&) const override { return true; }

 private:
  std::uint32_t publish_;
};

class AllreducePolicy final : public DecentralizedPolicy {
 public:
  using DecentralizedPolicy::DecentralizedPolicy;
  std::string name() const override { return "allreduce"; }
  std::optional<std::uint32_t> staleness_bound() const override { return 0; }
  Exchange exchange() const override { return Exchange::allreduce; }
};

class GossipPolicy final : public DecentralizedPolicy {
 public:
  GossipPolicy(std::uint32_t staleness, std::uint32_t publish_steps, bool random_peer)
      : DecentralizedPolicy(publish_steps), s_(staleness), random_(random_peer) {}
  std::string name() const override { return "gossip:" + std::to_string(s_); }
  std::optional<std::uint32_t> staleness_bound() const override { return s_; }
  Exchange exchange() const override { return Exchange::gossip; }
  std::vector<WorkerId> peers(WorkerId worker, std::uint32_t workers, std::uint64_t step) const override;

 private:
  std::uint32_t s_;
  bool random_;
};

inline std::vector<WorkerId> GossipPolicy::peers(WorkerId worker, std::uint32_t workers, std::uint64_t step) const {
  if (workers < 2) return {};
  if (random_) {
    // A seeded choice among the others, from the step and the worker: the
    // same in every run and every process.
    const auto other = static_cast<WorkerId>(mix_seed(step, worker) % (workers - 1));
    return {other < worker ? other : other + 1};
  }
  const WorkerId left = (worker + workers - 1) % workers, right = (worker + 1) % workers;
  if (left == right) return {left};
  return {left, right};
}

inline PolicyKnob publish_steps_knob(const std::string& policy) {
  // 8: publishing copies the parameters, and every step cost allreduce a
  // tenth of its speed on the mlp (docs/policies.md).
  return {"publish-steps", "K", 8, 1, 1e9, true,
          policy + ": steps between the parameters a worker publishes to the shards (what is evaluated)"};
}

inline PolicyEntry allreduce_policy_entry() {
  return {"allreduce",
          "decentralized and synchronous: the workers' gradients are averaged by an all-reduce, no shard on the way",
          "",
          {publish_steps_knob("allreduce")},
          [](const PolicyOptions& o) {
            return std::make_unique<AllreducePolicy>(static_cast<std::uint32_t>(o.at("publish-steps")));
          }};
}

inline PolicyEntry gossip_policy_entry() {
  return {"gossip",
          "decentralized, stale-synchronous: parameters averaged with peers at most S clocks behind (gossip:S)",
          "staleness",
          {{"staleness", "S", 3, 0, 1e9, true, "gossip: how many clocks behind its own a peer's copy may be"},
           publish_steps_knob("gossip"),
           {"random-peer", "0|1", 0, 0, 1, true, "gossip: average with one seeded random peer, not both ring neighbours"}},
          [](const PolicyOptions& o) {
            return std::make_unique<GossipPolicy>(static_cast<std::uint32_t>(o.at("staleness")),
                                                  static_cast<std::uint32_t>(o.at("publish-steps")),
                                                  o.at("random-peer") != 0);
          }};
}

}  // namespace asgd
