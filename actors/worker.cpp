#include "actors/worker.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

namespace asgd {

namespace {

using Self = caf::stateful_actor<WorkerState>*;
using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

void fail(Self self, StatusCode code, const std::string& what) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  self->send(st.setup.coordinator, failed_atom::value, static_cast<std::int32_t>(code),
             "worker " + std::to_string(st.setup.id) + ": " + what);
  self->quit();
}

void fail(Self self, const std::string& what) { fail(self, StatusCode::timeout, what); }

void try_step(Self self);

// Copies the parameters shard `shard` sent into our replica and keeps the
// buffer for reuse. `shard` is the index we sent the request to; the reply's
// own shard field is checked against it, never used to index.
void accept_params(Self self, std::size_t shard, std::uint32_t claimed, std::uint64_t version,
                   std::vector<float>& params) {
  auto& st = self->state;
  const KeyRange& r = st.setup.ranges[shard];
  if (claimed != shard) {
    fail(self, StatusCode::internal,
         "a reply from shard " + std::to_string(shard) + " claims to come from shard " + std::to_string(claimed));
    return;
  }
  if (params.size() != r.size()) {
    fail(self, StatusCode::internal,
         "shard " + std::to_string(shard) + " sent " + std::to_string(params.size()) +
             " parameters for a range of " + std::to_string(r.size()));
    return;
  }
  if (r.size() == st.model->num_params()) {
    st.model->swap_params(params);  // one shard owns everything: trade buffers, copy nothing
  } else {
    std::copy(params.begin(), params.end(), st.model->params().begin() + static_cast<std::ptrdiff_t>(r.begin));
  }
  st.base_version[shard] = version;
  st.buffers[shard] = std::move(params);
}

void finish_step(Self self) {
  auto& st = self->state;
  st.report.comm_s += seconds_since(st.comm_start);
  if (st.applied_in_step == st.setup.shards.size()) ++st.report.updates;
  if (st.step_ends_epoch) {
    st.report.worker = st.setup.id;
    st.report.epoch = st.step_epoch;
    self->send(st.setup.coordinator, st.report);
    st.report = EpochReport{};
  }
  self->send(self, step_atom::value);
}

void on_reply_done(Self self, std::size_t shard) {
  auto& st = self->state;
  if (st.finished) return;
  st.awaiting[shard] = false;
  if (--st.outstanding == 0) finish_step(self);
}

std::string rpc_error(Self self, const char* what, std::size_t shard, const caf::error& err) {
  return std::string("no ") + what + " reply from shard " + std::to_string(shard) + " at step " +
         std::to_string(self->state.step) + ": " + self->system().render(err);
}

void send_pulls(Self self) {
  auto& st = self->state;
  st.outstanding = st.setup.shards.size();
  st.awaiting.assign(st.outstanding, true);
  st.comm_start = SteadyClock::now();
  for (std::size_t i = 0; i < st.setup.shards.size(); ++i) {
    self->request(st.setup.shards[i], caf::infinite, pull_atom::value, PullRequest{st.setup.id, st.step})
        .then(
            [self, i](ParamsReply& reply) {
              accept_params(self, i, reply.shard, reply.version, reply.params);
              on_reply_done(self, i);
            },
            [self, i](caf::error& err) { fail(self, rpc_error(self, "pull", i, err)); });
  }
}

void send_pushes(Self self, std::span<const float> grads, bool want_params) {
  auto& st = self->state;
  st.outstanding = st.setup.shards.size();
  st.awaiting.assign(st.outstanding, true);
  st.comm_start = SteadyClock::now();
  for (std::size_t i = 0; i < st.setup.shards.size(); ++i) {
    const KeyRange& r = st.setup.ranges[i];
    PushRequest req{st.setup.id, st.step, st.base_version[i], want_params, std::move(st.buffers[i])};
    if (r.size() == st.model->num_params() && grads.data() == st.model->grads().data()) {
      // One shard owns everything: hand over the gradient buffer itself.
      req.grad.resize(r.size());
      st.model->swap_grads(req.grad);
    } else {
      req.grad.assign(grads.begin() + static_cast<std::ptrdiff_t>(r.begin),
                      grads.begin() + static_cast<std::ptrdiff_t>(r.end));
    }
    self->request(st.setup.shards[i], caf::infinite, push_atom::value, std::move(req))
        .then(
            [self, i](PushReply& reply) {
              auto& s = self->state;
              if (reply.applied) ++s.applied_in_step;
              if (!reply.params.empty()) accept_params(self, i, reply.shard, reply.version, reply.params);
              on_reply_done(self, i);
            },
            [self, i](caf::error& err) { fail(self, rpc_error(self, "push", i, err)); });
  }
}

void request_batch(Self self) {
  auto& st = self->state;
  st.batch_requested = true;
  st.batch_requested_at = SteadyClock::now();
  self->request(st.setup.feeder, caf::infinite, next_atom::value)
      .then(
          [self](data::Batch& batch) {
            auto& s = self->state;
            s.batch_requested = false;
            s.next_batch = std::move(batch);
            try_step(self);
          },
          [self](caf::error& err) { fail(self, "no batch from the data feeder: " + self->system().render(err)); });
}

void try_step(Self self) {
  auto& st = self->state;
  if (st.finished || st.outstanding > 0) return;
  if (!st.next_batch) {
    if (!st.idle_since) st.idle_since = SteadyClock::now();
    if (!st.batch_requested) request_batch(self);
    return;
  }
  if (st.idle_since) {
    st.report.data_wait_s += seconds_since(*st.idle_since);
    st.idle_since.reset();
  }
  data::Batch batch = std::move(*st.next_batch);
  st.next_batch.reset();
  if (batch.size == 0) {  // every epoch done
    st.finished = true;
    self->quit();
    return;
  }
  request_batch(self);  // the feeder prepares the next one while we compute

  const auto t0 = SteadyClock::now();
  const float loss = st.model->compute_gradients(batch.x, batch.y);
  st.report.compute_s += seconds_since(t0);
  st.report.samples += batch.size;
  ++st.report.batches;
  // A NaN or infinite loss means a gradient that would poison the shards'
  // parameters: drop it, count it, and stop the job once it is clearly
  // diverging rather than a single bad batch.
  const bool drop = !std::isfinite(loss);
  if (drop) {
    ++st.report.dropped_batches;
    st.report.dropped_samples += batch.size;
    if (++st.nonfinite_streak >= kMaxNonFiniteSteps) {
      fail(self, StatusCode::diverged,
           "the loss was " + std::to_string(loss) + " for " + std::to_string(kMaxNonFiniteSteps) +
               " steps in a row (up to step " + std::to_string(st.step) + "); try a lower --lr");
      return;
    }
  } else {
    st.nonfinite_streak = 0;
    st.report.loss_sum += static_cast<double>(loss) * static_cast<double>(batch.size);
  }

  StepPlan plan = st.policy->plan(st.step);
  std::span<const float> grads = st.model->grads();
  if (drop) {
    plan.push = false;  // keep what was accumulated so far; add nothing
  } else if (st.setup.policy.push_every > 1) {
    // Downpour's n_push > 1: sum the gradients until the push.
    if (st.accumulated_steps++ == 0) {
      st.accumulated.assign(grads.begin(), grads.end());
    } else {
      for (std::size_t i = 0; i < grads.size(); ++i) st.accumulated[i] += grads[i];
    }
    grads = st.accumulated;
  }
  st.step_ends_epoch = batch.last_in_epoch;
  st.step_epoch = batch.epoch;
  st.applied_in_step = 0;
  // With push_every > 1 a push step may find nothing accumulated (every
  // gradient since the last push was dropped): then there is nothing to send.
  const bool have_gradient = st.setup.policy.push_every > 1 ? st.accumulated_steps > 0 : !drop;
  if (plan.push && have_gradient) {
    st.accumulated_steps = 0;
    send_pushes(self, grads, plan.pull);
  } else if (plan.pull) {
    send_pulls(self);
  }
  ++st.step;
  if (st.outstanding == 0) {
    st.comm_start = SteadyClock::now();
    finish_step(self);
  }
}

// The watchdog: fails the job, naming who did not answer, once a reply is
// overdue; otherwise re-arms itself.
void check_overdue(Self self) {
  auto& st = self->state;
  if (st.finished) return;
  const auto now = SteadyClock::now();
  const double limit = std::chrono::duration<double>(st.setup.rpc_timeout).count();
  if (st.outstanding > 0 && std::chrono::duration<double>(now - st.comm_start).count() > limit) {
    std::string who;
    for (std::size_t i = 0; i < st.awaiting.size(); ++i)
      if (st.awaiting[i]) who += (who.empty() ? "" : ", ") + std::to_string(i);
    fail(self, fmt::format("no reply from shard(s) {} within {:g} s (--rpc-timeout) at step {}", who, limit, st.step));
    return;
  }
  if (st.batch_requested && std::chrono::duration<double>(now - st.batch_requested_at).count() > limit) {
    fail(self, fmt::format("no batch from the data feeder within {:g} s (--rpc-timeout) at step {}", limit, st.step));
    return;
  }
  self->delayed_send(self, std::min<caf::timespan>(st.setup.rpc_timeout / 4, std::chrono::seconds(1)),
                     tick_atom::value);
}

}  // namespace

caf::behavior worker(caf::stateful_actor<WorkerState>* self, WorkerSetup setup) {
  auto& st = self->state;
  auto model = Model::build(setup.model, setup.sample_shape, setup.classes);
  auto policy = make_policy(setup.policy);
  st.setup = std::move(setup);
  if (!model || !policy) {
    fail(self, (!model ? model.status() : policy.status()).to_string());
    return {};
  }
  st.model.emplace(std::move(model).value());
  st.policy = std::move(policy).value();
  st.base_version.assign(st.setup.shards.size(), 0);
  st.buffers.resize(st.setup.shards.size());
  return {
      [self](start_atom) {
        // The first step trains on the shards' parameters, not our own.
        send_pulls(self);
        request_batch(self);
        check_overdue(self);
      },
      [self](step_atom) { try_step(self); },
      [self](tick_atom) { check_overdue(self); },
  };
}

}  // namespace asgd
