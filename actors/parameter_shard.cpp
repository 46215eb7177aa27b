#include "actors/parameter_shard.hpp"

#include <algorithm>

namespace asgd {

Result<ShardCore> ShardCore::make(ShardSetup setup) {
  if (setup.initial.size() != setup.range.size())
    return Status::InvalidArgument("shard " + std::to_string(setup.index) + ": initial parameters have " +
                                   std::to_string(setup.initial.size()) + " values for a range of " +
                                   std::to_string(setup.range.size()));
  auto optimizer = make_optimizer(setup.optimizer, setup.range.size());
  if (!optimizer) return optimizer.status();
  auto policy = make_policy(setup.policy);
  if (!policy) return policy.status();
  ShardCore core;
  core.params_ = std::move(setup.initial);
  core.setup_ = std::move(setup);
  core.optimizer_ = std::move(optimizer).value();
  core.policy_ = std::move(policy).value();
  core.stats_.shard = core.setup_.index;
  return core;
}

PushReply ShardCore::push(PushRequest&& request) {
  PushReply reply;
  reply.shard = setup_.index;
  if (request.grad.size() != params_.size()) {
    ++stats_.rejected;
    reply.version = version_;
    return reply;
  }
  const PushInfo info{request.worker, request.clock, request.base_version, version_};
  if (policy_->admit_push(info) == PushAction::apply) {
    // A base version from the future can only come from a confused peer;
    // count it as fresh rather than wrapping around.
    const std::uint64_t staleness = version_ > request.base_version ? version_ - request.base_version : 0;
    if (stats_.staleness_histogram.size() <= staleness) stats_.staleness_histogram.resize(staleness + 1, 0);
    ++stats_.staleness_histogram[staleness];
    // The reply reuses the gradient's buffer: the optimizer reads g[i]
    // before it writes the updated p[i] into the same slot.
    std::span<float> out = request.want_params ? std::span<float>(request.grad) : std::span<float>();
    optimizer_->step(params_, request.grad, setup_.schedule.scale(version_), out);
    ++version_;
    ++stats_.updates_applied;
    reply.applied = true;
    if (request.want_params) reply.params = std::move(request.grad);
  } else {
    ++stats_.updates_discarded;
    if (request.want_params) {
      reply.params = std::move(request.grad);
      std::copy(params_.begin(), params_.end(), reply.params.begin());
    }
  }
  reply.version = version_;
  return reply;
}

bool ShardCore::may_answer(const PullRequest& pull) const {
  return policy_->may_answer_pull({pull.worker, pull.clock});
}

ParamsReply ShardCore::params_reply(std::vector<float> buffer) const {
  buffer.assign(params_.begin(), params_.end());
  return {setup_.index, version_, std::move(buffer)};
}

ShardStats ShardCore::stats() const { return stats_; }

caf::behavior parameter_shard(caf::stateful_actor<ShardState>* self, std::shared_ptr<ShardCore> core) {
  self->state.core = std::make_unique<ShardCore>(std::move(*core));
  // Answers every held pull the policy now allows.
  auto release_held = [self] {
    auto& held = self->state.held;
    auto ready = std::stable_partition(held.begin(), held.end(),
                                       [&](const auto& h) { return !self->state.core->may_answer(h.request); });
    for (auto it = ready; it != held.end(); ++it) it->promise.deliver(self->state.core->params_reply());
    held.erase(ready, held.end());
  };
  return {
      [self, release_held](push_atom, PushRequest& request) {
        PushReply reply = self->state.core->push(std::move(request));
        if (reply.applied && !self->state.held.empty()) release_held();
        return reply;
      },
      [self](pull_atom, const PullRequest& request) -> caf::result<ParamsReply> {
        if (self->state.core->may_answer(request)) return self->state.core->params_reply();
        auto promise = self->make_response_promise();
        self->state.held.push_back({request, promise});
        return caf::delegated<ParamsReply>();
      },
      [self](snapshot_atom) { return self->state.core->params_reply(); },
      [self](stats_atom) { return self->state.core->stats(); },
  };
}

}  // namespace asgd
