// WorkerCore's step under the decentralized policies (allreduce, gossip:S;
// policies/decentralized.hpp): after computing, the worker exchanges with
// the others through the collective instead of a shard round trip, then
// publishes its parameters to the shards every publish-steps steps (what the
// coordinator evaluates and checkpoints).
//
//   allreduce: contribute the gradient (weighted by the step's samples; 0
//     for a dropped step), wait for the mean, apply it with the worker's own
//     optimizer. Every copy takes the same step, so the copies stay equal.
//   gossip:S: apply the own gradient, publish the parameters at the new
//     clock c, wait for the peers' copies from clock c - S or later, and
//     average with them.
//
// The exchange's time is the step's push_pull_s, and all of it is
// policy_wait_s: it is time spent waiting for the other workers.
#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include "actors/worker_core.hpp"

namespace asgd {

void WorkerCore::begin_exchange(Actions& out) {
  drop_nonfinite_gradient();
  exchange_start_ = now_();
  lap(exchange_start_, report_.other_s);
  exchanging_ = true;
  Status called;
  if (policy_->exchange() == Exchange::allreduce) {
    const double weight = step_dropped_ ? 0.0 : static_cast<double>(step_samples_);
    called = collective_->allreduce_mean(id_, step_, model_->grads(), weight, exchanged_);
  } else {
    if (!step_dropped_) {
      local_optimizer_->step(model_->params(), model_->grads(), schedule_.scale(step_));
      ++report_.local_updates;
      ++report_.updates;
    }
    const Clock clock = step_ + 1;
    const Clock bound = policy_->staleness_bound().value_or(0);
    const std::uint32_t n = collective_->size();
    std::vector<messaging::Rank> audience;  // whoever averages with us after this step
    for (WorkerId w = 0; w < n; ++w) {
      const auto theirs = policy_->peers(w, n, step_);
      if (std::find(theirs.begin(), theirs.end(), id_) != theirs.end()) audience.push_back(w);
    }
    called = collective_->gossip(id_, clock, model_->params(), audience, policy_->peers(id_, n, step_),
                                 clock > bound ? clock - bound : 0, exchanged_);
  }
  if (!called.ok()) {
    exchanging_ = false;
    fail(StatusCode::internal, "exchanging with the other workers: " + called.message(), out);
  }
}

void WorkerCore::exchanged(Actions& out) {
  if (finished_ || !exchanging_) return;
  exchanging_ = false;
  const Instant now = now_();
  report_.policy_wait_s += std::chrono::duration<double>(now - exchange_start_).count();
  lap(now, report_.comm_s);
  if (policy_->exchange() == Exchange::allreduce) {
    take_mean();
  } else {
    take_peer_copies();
  }
  lap(now_(), report_.other_s);  // the update or the average
  after_exchange(out);
}

// allreduce: the mean of every worker's gradient, applied to our copy as a
// bsp shard applies a clock's (even when our own step was dropped: the
// copies must stay equal).
void WorkerCore::take_mean() {
  if (collective_->total_weight(id_) > 0) {
    local_optimizer_->step(model_->params(), collective_->mean(id_), schedule_.scale(step_));
    ++report_.local_updates;
    ++report_.updates;
  }
  record_staleness(0);
  for (Clock& b : base_clock_) b = step_ + 1;
}

// gossip: our parameters averaged with the peers' copies, each equally.
void WorkerCore::take_peer_copies() {
  const Clock clock = step_ + 1;
  const auto copies = collective_->peer_copies(id_);
  auto x = model_->params();
  Clock oldest = clock;
  std::size_t used = 0;
  for (const messaging::PeerCopy& c : copies) {
    if (c.params->size() != x.size()) continue;  // another model's copy: never read past ours
    const float* y = c.params->data();
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    record_staleness(clock > c.clock ? clock - c.clock : 0);
    oldest = std::min(oldest, c.clock);
    ++used;
  }
  if (used > 0) {
    const float share = 1.0f / static_cast<float>(used + 1);
    for (float& v : x) v *= share;
  }
  for (Clock& b : base_clock_) b = oldest;
}

// The rest of the step: publish every publish-steps steps (the parameters
// changed even when our own gradient was dropped), then the next.
void WorkerCore::after_exchange(Actions& out) {
  ++unpushed_steps_;
  unpushed_samples_ += step_samples_;
  end_step(policy_->plan(step_), out);
}

}  // namespace asgd
