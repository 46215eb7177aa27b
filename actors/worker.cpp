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
  std::string message = "worker " + std::to_string(st.setup.id) + ": " + what;
  self->send(st.setup.coordinator, failed_atom::value, static_cast<std::int32_t>(code), message);
  // Not a normal exit: whoever watches this actor (a worker process's
  // watcher reports a normal one as "finished") must not read a failure
  // as the end of the data.
  self->quit(caf::make_error(caf::sec::runtime_error, std::move(message)));
}

void fail(Self self, const std::string& what) { fail(self, StatusCode::timeout, what); }

void try_step(Self self);

// Out of data: tell every shard to stop waiting for us, then stop.
void leave(Self self) {
  auto& st = self->state;
  for (auto& shard : st.setup.shards) self->send(shard, leave_atom::value, st.setup.id);
  if (st.setup.shared) st.setup.shared->live[st.setup.id].store(false, std::memory_order_release);
  st.finished = true;
  self->quit();
}

// Copies the parameters shard `shard` sent into our replica and keeps the
// buffer for reuse. `shard` is the index we sent the request to; the reply's
// own shard field is checked against it, never used to index.
void accept_params(Self self, std::size_t shard, ShardReply& reply) {
  auto& st = self->state;
  const KeyRange& r = st.setup.ranges[shard];
  if (reply.shard != shard) {
    fail(self, StatusCode::internal,
         "a reply from shard " + std::to_string(shard) + " claims to come from shard " + std::to_string(reply.shard));
    return;
  }
  if (reply.params.size() != r.size()) {
    fail(self, StatusCode::internal,
         "shard " + std::to_string(shard) + " sent " + std::to_string(reply.params.size()) +
             " parameters for a range of " + std::to_string(r.size()));
    return;
  }
  if (r.size() == st.model->num_params()) {
    st.model->swap_params(reply.params);  // one shard owns everything: trade buffers, copy nothing
  } else {
    std::copy(reply.params.begin(), reply.params.end(),
              st.model->params().begin() + static_cast<std::ptrdiff_t>(r.begin));
  }
  st.base_clock[shard] = reply.clock;
  st.base_version[shard] = reply.version;
  st.buffers[shard] = std::move(reply.params);
}

// The job-long counts: the reported epochs' plus the current one's.
WorkerProgress progress_now(const WorkerState& st) {
  WorkerProgress p = st.finished_epochs;
  const EpochReport& r = st.report;
  p.worker = st.setup.id;
  p.clock = st.step;
  p.epoch = st.step_epoch;
  p.samples += r.samples;
  p.updates += r.updates;
  p.loss_sum += r.loss_sum;
  p.loss_samples += r.samples - r.dropped_samples;
  p.policy_wait_s += r.policy_wait_s;
  Clock base = st.step;
  if (st.setup.shared) {
    base = std::min(base, st.setup.shared->min_live_clock());
  } else {
    for (Clock c : st.base_clock) base = std::min(base, c);
  }
  p.staleness = static_cast<double>(st.step - base);
  p.batches_ready = st.next_batch ? 1 : 0;
  return p;
}

void send_progress(Self self) {
  auto& st = self->state;
  st.last_progress = SteadyClock::now();
  self->send(st.setup.coordinator, progress_now(st));
}

void finish_step(Self self) {
  auto& st = self->state;
  st.report.comm_s += seconds_since(st.comm_start);
  st.report.policy_wait_s += st.held_in_step;
  if (st.applied_in_step == st.setup.shards.size()) ++st.report.updates;
  if (st.step_ends_epoch) {
    st.report.worker = st.setup.id;
    st.report.epoch = st.step_epoch;
    self->send(st.setup.coordinator, st.report);
    st.finished_epochs = progress_now(st);
    st.report = EpochReport{};
    send_progress(self);
  } else if (SteadyClock::now() - st.last_progress >= kProgressEvery) {
    send_progress(self);
  }
  if (st.finishing) {
    leave(self);
    return;
  }
  self->send(self, step_atom::value);
}

std::string rpc_error(Self self, const char* what, std::size_t shard, const caf::error& err) {
  return std::string("no ") + what + " reply from shard " + std::to_string(shard) + " at step " +
         std::to_string(self->state.step) + ": " + self->system().render(err);
}

void on_reply(Self self, std::size_t shard, ShardReply& reply, const char* what) {
  auto& st = self->state;
  if (st.finished) return;
  const auto outcome = static_cast<PushOutcome>(reply.outcome);
  if (outcome == PushOutcome::rejected) {
    fail(self, StatusCode::internal,
         fmt::format("shard {} rejected our {} at step {} (malformed, or we are not one of its workers)", shard, what,
                     st.step));
    return;
  }
  if (outcome == PushOutcome::applied || outcome == PushOutcome::aggregated) ++st.applied_in_step;
  st.held_in_step = std::max(st.held_in_step, reply.held_s);
  if (!reply.params.empty()) {
    accept_params(self, shard, reply);
    if (st.finished) return;
  }
  st.awaiting[shard] = false;
  if (--st.outstanding == 0) finish_step(self);
}

void begin_round_trip(Self self) {
  auto& st = self->state;
  st.outstanding = st.setup.shards.size();
  st.awaiting.assign(st.outstanding, true);
  st.applied_in_step = 0;
  st.held_in_step = 0.0;
  st.comm_start = SteadyClock::now();
}

void send_pulls(Self self) {
  auto& st = self->state;
  begin_round_trip(self);
  for (std::size_t i = 0; i < st.setup.shards.size(); ++i) {
    self->request(st.setup.shards[i], caf::infinite, pull_atom::value, PullRequest{st.setup.id, st.step})
        .then([self, i](ShardReply& reply) { on_reply(self, i, reply, "pull"); },
              [self, i](caf::error& err) { fail(self, rpc_error(self, "pull", i, err)); });
  }
}

// Pushes what accumulated since the last push, tagged with clock `clock`.
// With no samples behind it (every step since was dropped) the push is an
// empty clock tick, so synchronous policies do not wait for us.
void send_pushes(Self self, Clock clock, bool want_params) {
  auto& st = self->state;
  const bool params_payload = st.policy->payload() == Payload::parameters;
  const bool tick = st.unpushed_samples == 0;
  std::span<const float> source = params_payload  ? std::span<const float>(st.model->params())
                                  : st.sum_in_model ? st.model->grads()
                                                    : std::span<const float>(st.accumulated);
  begin_round_trip(self);
  for (std::size_t i = 0; i < st.setup.shards.size(); ++i) {
    const KeyRange& r = st.setup.ranges[i];
    PushRequest req{st.setup.id, clock, st.base_clock[i], st.unpushed_samples, want_params, std::move(st.buffers[i])};
    req.base_version = st.base_version[i];
    if (tick) {
      req.payload.clear();
    } else if (!params_payload && r.size() == st.model->num_params() && source.data() == st.model->grads().data()) {
      // One shard owns everything: hand over the gradient buffer itself.
      req.payload.resize(r.size());
      st.model->swap_grads(req.payload);
    } else {
      req.payload.assign(source.begin() + static_cast<std::ptrdiff_t>(r.begin),
                         source.begin() + static_cast<std::ptrdiff_t>(r.end));
    }
    self->request(st.setup.shards[i], caf::infinite, push_atom::value, std::move(req))
        .then([self, i](ShardReply& reply) { on_reply(self, i, reply, "push"); },
              [self, i](caf::error& err) { fail(self, rpc_error(self, "push", i, err)); });
  }
  st.unpushed_steps = 0;
  st.unpushed_samples = 0;
  st.sum_in_model = false;
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
            try {
              s.model->prefetch(s.next_batch->x, s.next_batch->y);  // a GPU uploads it while we wait for shards
            } catch (const std::exception& e) {  // a bad batch, no memory for a larger one, a CUDA error
              fail(self, StatusCode::internal,
                   "worker " + std::to_string(s.setup.id) + " on " + s.model->device().str() +
                       ": preparing a batch: " + e.what());
              return;
            }
            try_step(self);
          },
          [self](caf::error& err) { fail(self, "no batch from the data feeder: " + self->system().render(err)); });
}

// The hogwild path: apply our gradient to the shared buffer in place and
// record how far behind the slowest live worker's clock our view was.
void update_shared(Self self, Clock base) {
  auto& st = self->state;
  SharedParameters& shared = *st.setup.shared;
  const Clock staleness = st.step > base ? st.step - base : 0;
  auto& h = st.report.staleness_histogram;
  if (h.size() <= staleness) h.resize(staleness + 1, 0);
  ++h[staleness];
  shared.clocks[st.setup.id].store(st.step + 1, std::memory_order_release);
}

// Hogwild: the optimizer writes straight into the buffer that every worker
// of the process shares (the model's parameters are a view of it), without
// locks: that race is the policy's design (actors/shared_parameters.hpp).
// Every write to the buffer happens here, in a frame of its own, so that
// tests/tsan.supp can name this one intended race and no other.
[[gnu::noinline]] void hogwild_step(Self self) {
  auto& st = self->state;
  st.local_optimizer->step(st.model->params(), st.model->grads(), st.setup.schedule.scale(st.step));
}

// Everything a step does after its gradient is computed (and, for a
// simulated straggler, after its delay).
void continue_step(Self self) {
  auto& st = self->state;
  const StepPlan plan = st.policy->plan(st.step);
  const bool carried_by_push = !plan.local_update || st.policy->payload() == Payload::parameters;
  if (!st.step_dropped && plan.local_update && !all_finite(st.model->grads())) {
    // A finite loss can still overflow into a gradient (hogwild and
    // averaging apply it here, where no shard checks it): drop it.
    st.step_dropped = true;
    ++st.report.dropped_batches;
  }
  if (!st.step_dropped) {
    if (plan.local_update) {
      if (st.setup.shared) {
        const Clock base = st.setup.shared->min_live_clock();
        hogwild_step(self);
        update_shared(self, base);
        ++st.report.updates;
      } else {
        st.local_optimizer->step(st.model->params(), st.model->grads(), st.setup.schedule.scale(st.step));
      }
      ++st.report.local_updates;
    }
    if (carried_by_push) {
      if (st.policy->payload() == Payload::gradients) {
        // Downpour's n_push > 1: sum the gradients until the push. A step
        // that pushes its own gradients alone sends them straight from the
        // model.
        auto g = st.model->grads();
        st.sum_in_model = st.unpushed_steps == 0 && plan.push;
        if (st.unpushed_steps == 0) {
          if (!plan.push) st.accumulated.assign(g.begin(), g.end());
        } else {
          for (std::size_t i = 0; i < g.size(); ++i) st.accumulated[i] += g[i];
        }
      }
      ++st.unpushed_steps;
      st.unpushed_samples += st.step_samples;
    }
  }
  if (plan.push) {
    send_pushes(self, st.step, plan.pull);
  } else if (plan.pull) {
    send_pulls(self);
  }
  ++st.step;
  if (st.outstanding == 0) {
    st.comm_start = SteadyClock::now();
    st.held_in_step = 0.0;
    st.applied_in_step = 0;
    finish_step(self);
  }
}

// Every epoch is done: pushes what the plan had not pushed yet, else
// leaves.
void out_of_data(Self self) {
  auto& st = self->state;
  if (st.unpushed_samples == 0) {
    leave(self);
    return;
  }
  // The plan had not pushed our last steps yet (averaging's last partial
  // round, Downpour's n_push): carry them before leaving. Tagged with the
  // clock at which the plan would have pushed next, so under averaging a
  // worker with fewer steps joins the others' next average instead of
  // committing alone.
  st.finishing = true;
  st.step_ends_epoch = false;
  Clock clock = st.step - 1;
  for (Clock s = st.step - 1; s < st.step + 1'000'000; ++s) {
    if (st.policy->plan(s).push) {
      clock = s;
      break;
    }
  }
  send_pushes(self, clock, false);
}

void try_step(Self self) {
  auto& st = self->state;
  if (st.finished || st.finishing || st.straggling || st.outstanding > 0) return;
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
    out_of_data(self);
    return;
  }
  request_batch(self);  // the feeder prepares the next one while we compute

  const auto t0 = SteadyClock::now();
  float loss = 0.0f;
  try {
    loss = st.model->compute_gradients(batch.x, batch.y);
  } catch (const std::exception& e) {  // a device failure (CUDA errors surface as exceptions)
    fail(self, StatusCode::internal,
         "worker " + std::to_string(st.setup.id) + " on " + st.model->device().str() + ": " + e.what());
    return;
  }
  const double compute_s = seconds_since(t0);
  st.report.compute_s += compute_s;
  st.report.samples += batch.size;
  ++st.report.batches;
  // A NaN or infinite loss means a gradient that would poison the
  // parameters: drop it, count it, and stop the job once it is clearly
  // diverging rather than a single bad batch.
  st.step_dropped = !std::isfinite(loss);
  if (st.step_dropped) {
    ++st.report.dropped_batches;
    st.report.dropped_samples += batch.size;
    if (++st.nonfinite_streak >= kMaxNonFiniteSteps) {
      fail(self, StatusCode::diverged,
           "the loss was " + std::to_string(loss) + " for " + std::to_string(kMaxNonFiniteSteps) +
               " steps in a row (up to step " + std::to_string(st.step) + ")");
      return;
    }
  } else {
    st.nonfinite_streak = 0;
    st.report.loss_sum += static_cast<double>(loss) * static_cast<double>(batch.size);
  }
  st.step_samples = static_cast<std::uint32_t>(batch.size);
  st.step_ends_epoch = batch.last_in_epoch;
  st.step_epoch = batch.epoch;
  if (st.setup.straggler_factor > 1.0) {
    // A slower device: the step takes factor x its compute time, spent on a
    // timer so the core stays free for the other workers.
    st.straggling = true;
    const auto delay = std::chrono::duration<double>(compute_s * (st.setup.straggler_factor - 1.0));
    self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(delay), resume_atom::value);
    return;
  }
  continue_step(self);
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
    // Only a policy with a staleness bound holds reads back on purpose;
    // under async a missing reply means the shard itself is not answering.
    const char* why = st.policy->staleness_bound()
                          ? "a synchronous policy holds a read until the slowest worker catches up (the shard's log "
                            "names it), or the shard's process died or stopped"
                          : "the shard's process died, stopped or hung (the coordinator's log says whether it still "
                            "sends heartbeats)";
    fail(self, fmt::format("no reply from shard(s) {} within {:g} s (--rpc-timeout) at step {} under policy {}: {}",
                           who, limit, st.step, st.policy->name(), why));
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
  auto model = Model::build(setup.model, setup.model_spec.get(), setup.sample_shape, setup.classes);
  auto policy = make_policy(setup.policy);
  st.setup = std::move(setup);
  if (!model || !policy) {
    fail(self, StatusCode::invalid_argument, (!model ? model.status() : policy.status()).to_string());
    return {};
  }
  st.model.emplace(std::move(model).value());
  if (st.setup.compute) st.model->use_compute(st.setup.compute);
  st.policy = std::move(policy).value();
  auto device = Device::parse(st.setup.device);
  const Status placed = device ? st.model->set_device(*device) : device.status();
  if (!placed.ok()) {
    fail(self, placed.code() == StatusCode::invalid_argument ? StatusCode::invalid_argument : StatusCode::internal,
         "worker " + std::to_string(st.setup.id) + " cannot compute on " + st.setup.device + ": " + placed.message());
    return {};
  }
  if (st.policy->shares_parameters() && !st.setup.shared) {
    fail(self, StatusCode::invalid_argument,
         "policy " + st.policy->name() + " needs the parameter buffer every worker of this process shares; "
         "it cannot run across processes or devices");
    return {};
  }
  if (st.setup.shared) {
    if (st.setup.shared->values.size() != st.model->num_params() || st.setup.id >= st.setup.shared->clocks.size()) {
      fail(self, StatusCode::invalid_argument, "the shared parameter buffer does not fit the model or the worker");
      return {};
    }
    st.model->use_params(st.setup.shared->values);
  }
  if (st.policy->plan(0).local_update) {  // a policy that updates locally does so on every step
    auto opt = make_optimizer(st.setup.optimizer, st.model->num_params());
    if (!opt) {
      fail(self, StatusCode::invalid_argument, opt.status().to_string());
      return {};
    }
    st.local_optimizer = std::move(opt).value();
  }
  st.step = st.setup.first_clock;
  st.base_clock.assign(st.setup.shards.size(), st.setup.first_clock);
  st.base_version.assign(st.setup.shards.size(), 0);
  st.buffers.resize(st.setup.shards.size());
  auto start = [self] {
    auto& s = self->state;
    // The first step trains on the shards' parameters, not our own
    // (with a shared buffer there is nothing to fetch).
    if (!s.setup.shared) send_pulls(self);
    request_batch(self);
    check_overdue(self);
  };
  return {
      [start](start_atom) { start(); },
      [self, start](start_atom, caf::actor feeder) {
        self->state.setup.feeder = std::move(feeder);
        start();
      },
      [self](calibrate_atom, const data::Batch& probe) {
        // Samples per second on this worker's device, straggling included:
        // one warm-up step, then the mean of a few.
        auto& s = self->state;
        constexpr int kSteps = 5;
        s.model->compute_gradients(probe.x, probe.y);
        const auto t0 = SteadyClock::now();
        for (int i = 0; i < kSteps; ++i) s.model->compute_gradients(probe.x, probe.y);
        const double seconds = seconds_since(t0) * s.setup.straggler_factor;
        return seconds > 0 ? static_cast<double>(probe.size * kSteps) / seconds : 0.0;
      },
      [self](step_atom) { try_step(self); },
      [self](resume_atom) {
        auto& s = self->state;
        if (s.finished) return;
        s.straggling = false;
        continue_step(self);
      },
      [self](tick_atom) { check_overdue(self); },
  };
}

}  // namespace asgd
