#include "actors/worker_core.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "actors/worker.hpp"

namespace asgd {


Result<WorkerCore> WorkerCore::make(const WorkerSetup& setup, TimeSource now) {
  auto model = Model::build(setup.model, setup.model_spec.get(), setup.sample_shape, setup.classes);
  if (!model) return model.status();
  auto policy = make_policy(setup.policy);
  if (!policy) return policy.status();
  WorkerCore core;
  core.now_ = std::move(now);
  core.id_ = setup.id;
  core.ranges_ = setup.ranges;
  core.rpc_timeout_ = setup.rpc_timeout;
  core.straggler_ = setup.straggler;
  core.schedule_ = setup.schedule;
  core.shared_ = setup.shared;
  core.model_ = std::make_unique<Model>(std::move(model).value());
  // The shards' ranges cut the model's parameters into consecutive pieces
  // (a worker process takes them from the coordinator's assignment): other
  // ranges would push and take in values past the model's end. None: a
  // worker that only measures its step (--worker-weights auto).
  std::size_t next = 0;
  for (const KeyRange& r : core.ranges_) {
    if (r.begin != next || r.end <= r.begin) break;
    next = r.end;
  }
  if (!core.ranges_.empty() && next != core.model_->num_params())
    return Status::Internal("the shards' key ranges do not cut the model's " +
                            std::to_string(core.model_->num_params()) + " parameters into consecutive pieces");
  core.policy_ = std::move(policy).value();
  if (setup.compute) core.model_->use_compute(setup.compute);
  auto device = Device::parse(setup.device);
  const Status placed = device ? core.model_->set_device(*device) : device.status();
  if (!placed.ok()) {
    std::string what = "cannot compute on " + setup.device + ": " + placed.message();
    return placed.code() == StatusCode::invalid_argument ? Status::InvalidArgument(std::move(what))
                                                         : Status::Internal(std::move(what));
  }
  if (core.policy_->shares_parameters() && !core.shared_) {
    return Status::InvalidArgument("policy " + core.policy_->name() +
                                   " needs the parameter buffer every worker of this process shares; "
                                   "it cannot run across processes or devices");
  }
  if (core.policy_->exchange() != Exchange::none) {
    if (!setup.collective || !setup.exchanged || setup.collective->size() <= setup.id)
      return Status::InvalidArgument("policy " + core.policy_->name() +
                                     " needs the collective its workers exchange through, with a rank for worker " +
                                     std::to_string(setup.id));
    core.collective_ = setup.collective;
    core.exchanged_ = setup.exchanged;
  }
  if (core.shared_) {
    if (core.shared_->values.size() != core.model_->num_params() || core.id_ >= core.shared_->clocks.size())
      return Status::InvalidArgument("the shared parameter buffer does not fit the model or the worker");
    core.model_->use_params(core.shared_->values);
  }
  if (core.policy_->plan(0).local_update) {  // a policy that updates locally does so on every step
    auto opt = make_optimizer(setup.optimizer, core.model_->num_params());
    if (!opt) return opt.status();
    core.local_optimizer_ = std::move(opt).value();
  }
  core.step_ = setup.first_clock;
  core.base_clock_.assign(core.ranges_.size(), setup.first_clock);
  core.base_version_.assign(core.ranges_.size(), 0);
  core.buffers_.resize(core.ranges_.size());
  core.last_progress_ = core.now_();
  return core;
}

double WorkerCore::seconds_since(Instant t) const { return std::chrono::duration<double>(now_() - t).count(); }

void WorkerCore::fail(StatusCode code, const std::string& what, Actions& out) {
  if (finished_) return;
  finished_ = true;
  if (collective_) collective_->leave(id_);  // the others must not wait for us
  out.emplace_back(worker_action::Fail{code, "worker " + std::to_string(id_) + ": " + what});
}

void WorkerCore::lap(Instant t, double& phase) {
  if (t > lap_) phase += std::chrono::duration<double>(t - lap_).count();
  lap_ = std::max(lap_, t);
}

void WorkerCore::start(Actions& out) {
  lap_ = epoch_start_ = now_();
  // The first step trains on the shards' parameters, not our own (with a
  // shared buffer there is nothing to fetch).
  if (!shared_) send_pulls(out);
  request_batch(out);
  check_overdue(out);
}

// Out of data: every shard stops waiting for us. Stopped mid-epoch (the
// feeder was told to serve no more: --stop-at-target), what it did of that
// epoch is reported first; so are the updates of the pushes sent after
// the last epoch's report (out_of_data), which the job's count left out.
void WorkerCore::leave(Actions& out) {
  if (report_.batches > 0 || report_.updates > 0) report_epoch(now_(), out);
  if (shared_) shared_->live[id_].store(false, std::memory_order_release);
  if (collective_) collective_->leave(id_);
  finished_ = true;
  out.emplace_back(worker_action::Leave{});
}

// Copies the parameters shard `shard` sent into our replica and keeps the
// buffer for reuse. `shard` is the index we sent the request to; the reply's
// own shard field is checked against it, never used to index.
void WorkerCore::accept_params(std::size_t shard, ShardReply& reply, Actions& out) {
  const std::size_t begin = ranges_[shard].begin;
  const std::size_t size = ranges_[shard].size();
  if (reply.shard != shard) {
    fail(StatusCode::internal,
         fmt::format("a reply from shard {} claims to come from shard {}", shard, reply.shard), out);
    return;
  }
  if (reply.params.size() != size) {
    fail(StatusCode::internal,
         fmt::format("shard {} sent {} parameters for a range of {}", shard, reply.params.size(), size), out);
    return;
  }
  if (size == model_->num_params()) {
    model_->swap_params(reply.params);  // one shard owns everything: trade buffers, copy nothing
  } else {
    std::copy(reply.params.begin(), reply.params.end(),
              model_->params().begin() + static_cast<std::ptrdiff_t>(begin));
  }
  base_clock_[shard] = reply.clock;
  base_version_[shard] = reply.version;
  buffers_[shard] = std::move(reply.params);
}

WorkerProgress WorkerCore::progress() const {
  WorkerProgress p = finished_epochs_;
  const EpochReport& r = report_;
  p.worker = id_;
  p.clock = step_;
  p.epoch = step_epoch_;
  p.samples += r.samples;
  p.updates += r.updates;
  p.loss_sum += r.loss_sum;
  p.loss_samples += r.samples - r.dropped_samples;
  p.policy_wait_s += r.policy_wait_s;
  Clock base = step_;
  if (shared_) {
    base = std::min(base, shared_->min_live_clock());
  } else {
    for (Clock c : base_clock_) base = std::min(base, c);
  }
  p.staleness = static_cast<double>(step_ - base);
  p.batches_ready = next_batch_ ? 1 : 0;
  return p;
}

// The epoch's counts (all of it, or what a worker stopped mid-epoch did of
// it) go to the coordinator; the next epoch's start from zero at `now`.
void WorkerCore::report_epoch(Instant now, Actions& out) {
  report_.worker = id_;
  report_.epoch = step_epoch_;
  report_.wall_s = std::chrono::duration<double>(now - epoch_start_).count();
  epoch_start_ = now;
  out.emplace_back(worker_action::Report{report_});
  finished_epochs_ = progress();
  report_ = EpochReport{};
}

void WorkerCore::send_progress(Actions& out) {
  last_progress_ = now_();
  out.emplace_back(worker_action::Progress{progress()});
}

void WorkerCore::finish_step(Actions& out) {
  const Instant now = now_();
  lap(comm_start_, report_.other_s);
  lap(now, report_.comm_s);  // the round trip (includes taking in the parameters)
  report_.policy_wait_s += held_in_step_;
  // A decentralized policy's pushes only publish: its updates are counted
  // where they are made.
  if (applied_in_step_ == ranges_.size() && !collective_) ++report_.updates;
  if (step_ends_epoch_) {
    report_epoch(now, out);
    send_progress(out);
  } else if (now_() - last_progress_ >= kProgressEvery) {
    send_progress(out);
  }
  if (finishing_) {
    leave(out);
    return;
  }
  out.emplace_back(worker_action::NextStep{});
}

void WorkerCore::request_failed(const char* what, std::size_t shard, const std::string& error, Actions& out,
                                StatusCode code) {
  fail(code, fmt::format("no {} reply from shard {} at step {}: {}", what, shard, step_, error), out);
}

void WorkerCore::feeder_failed(const std::string& error, Actions& out) {
  fail(StatusCode::timeout, "no batch from the data feeder: " + error, out);
}

void WorkerCore::reply(std::size_t shard, ShardReply& reply, Actions& out) {
  if (finished_) return;
  if (shard >= awaiting_.size() || !awaiting_[shard]) {
    fail(StatusCode::internal, fmt::format("an unexpected reply from shard {} at step {}", shard, step_), out);
    return;
  }
  const auto outcome = static_cast<PushOutcome>(reply.outcome);
  if (outcome == PushOutcome::rejected) {
    fail(StatusCode::internal,
         fmt::format("shard {} rejected our {} at step {} (malformed, or we are not one of its workers)", shard,
                     in_flight_, step_),
         out);
    return;
  }
  if (outcome == PushOutcome::applied || outcome == PushOutcome::aggregated) ++applied_in_step_;
  held_in_step_ = std::max(held_in_step_, reply.held_s);
  if (!reply.params.empty()) {
    accept_params(shard, reply, out);
    if (finished_) return;
  }
  awaiting_[shard] = false;
  if (--outstanding_ == 0) finish_step(out);
}

void WorkerCore::begin_round_trip() {
  outstanding_ = ranges_.size();
  awaiting_.assign(ranges_.size(), true);
  applied_in_step_ = 0;
  held_in_step_ = 0.0;
  comm_start_ = now_();
  lap(comm_start_, report_.other_s);  // preparing the pushes (or nothing, for pulls)
}

void WorkerCore::send_pulls(Actions& out) {
  begin_round_trip();
  in_flight_ = "pull";
  for (std::size_t i = 0; i < ranges_.size(); ++i) out.emplace_back(worker_action::Pull{i, PullRequest{id_, step_}});
}

// Pushes what accumulated since the last push, tagged with clock `clock`.
// With no samples behind it (every step since was dropped) the push is an
// empty clock tick, so synchronous policies do not wait for us.
void WorkerCore::send_pushes(Clock clock, bool want_params, Actions& out) {
  const bool params_payload = policy_->payload() == Payload::parameters;
  const bool tick = unpushed_samples_ == 0;
  std::span<const float> source = params_payload ? std::span<const float>(model_->params())
                                  : sum_in_model_ ? model_->grads()
                                                  : std::span<const float>(accumulated_);
  begin_round_trip();
  in_flight_ = "push";
  for (std::size_t i = 0; i < ranges_.size(); ++i) {
    const std::size_t begin = ranges_[i].begin;
    const std::size_t size = ranges_[i].size();
    PushRequest req{id_, clock, base_clock_[i], unpushed_samples_, want_params, std::move(buffers_[i])};
    req.base_version = base_version_[i];
    if (tick) {
      req.payload.clear();
    } else if (!params_payload && size == model_->num_params() && source.data() == model_->grads().data()) {
      // One shard owns everything: hand over the gradient buffer itself.
      req.payload.resize(size);
      model_->swap_grads(req.payload);
    } else {
      const auto first = source.begin() + static_cast<std::ptrdiff_t>(begin);
      req.payload.assign(first, first + static_cast<std::ptrdiff_t>(size));
    }
    out.emplace_back(worker_action::Push{i, std::move(req)});
  }
  unpushed_steps_ = 0;
  unpushed_samples_ = 0;
  sum_in_model_ = false;
}

void WorkerCore::request_batch(Actions& out) {
  batch_requested_ = true;
  batch_requested_at_ = now_();
  out.emplace_back(worker_action::RequestBatch{});
}

void WorkerCore::batch(data::Batch&& batch, Actions& out) {
  if (finished_) return;
  batch_requested_ = false;
  next_batch_ = std::move(batch);
  try {
    model_->prefetch(next_batch_->x, next_batch_->y);  // a GPU uploads it while we wait for shards
  } catch (const std::exception& e) {  // a bad batch, no memory for a larger one, a CUDA error
    fail(StatusCode::internal, "on " + model_->device().str() + ": preparing a batch: " + e.what(), out);
    return;
  }
  try_step(out);
}

// Hogwild: the optimizer writes straight into the buffer that every worker
// of the process shares (the model's parameters are a view of it), without
// locks: that race is the policy's design (actors/shared_parameters.hpp).
// Every write to the buffer happens here, in a frame of its own, so that
// tests/tsan.supp can name this one intended race and no other.
[[gnu::noinline]] void WorkerCore::hogwild_step() {
  const Clock base = shared_->min_live_clock();
  local_optimizer_->step(model_->params(), model_->grads(), schedule_.scale(step_));
  // How far behind the slowest live worker's clock our view was.
  record_staleness(step_ > base ? step_ - base : 0);
  shared_->clocks[id_].store(step_ + 1, std::memory_order_release);
}

void WorkerCore::record_staleness(Clock staleness) {
  auto& h = report_.staleness_histogram;
  if (h.size() <= staleness) h.resize(staleness + 1, 0);
  ++h[staleness];
}

// Downpour's n_push > 1: sums the gradients until the push. A step that
// pushes its own gradients alone sends them straight from the model.
void WorkerCore::accumulate(bool push_now) {
  auto g = model_->grads();
  sum_in_model_ = unpushed_steps_ == 0 && push_now;
  if (unpushed_steps_ == 0) {
    if (!push_now) accumulated_.assign(g.begin(), g.end());
  } else {
    for (std::size_t i = 0; i < g.size(); ++i) accumulated_[i] += g[i];
  }
}

// Everything a step does after its gradient is computed (and, for a
// simulated straggler, after its delay).
void WorkerCore::continue_step(Actions& out) {
  if (collective_) {
    begin_exchange(out);  // actors/worker_exchange.cpp
    return;
  }
  const StepPlan plan = policy_->plan(step_);
  const bool carried_by_push = !plan.local_update || policy_->payload() == Payload::parameters;
  if (plan.local_update) drop_nonfinite_gradient();
  if (!step_dropped_) {
    if (plan.local_update) {
      if (shared_) {
        hogwild_step();
        ++report_.updates;
      } else {
        local_optimizer_->step(model_->params(), model_->grads(), schedule_.scale(step_));
      }
      ++report_.local_updates;
    }
    if (carried_by_push) {
      if (policy_->payload() == Payload::gradients) accumulate(plan.push);
      ++unpushed_steps_;
      unpushed_samples_ += step_samples_;
    }
  }
  end_step(plan, out);
}

// A finite loss can still overflow into a gradient, and a policy that
// applies it on the worker (hogwild, averaging, the decentralized ones) has
// no shard to check it: the step is dropped.
void WorkerCore::drop_nonfinite_gradient() {
  if (step_dropped_ || all_finite(model_->grads())) return;
  step_dropped_ = true;
  ++report_.dropped_batches;
}

// The step's pushes or pulls as the plan says; the step ends once no reply
// is awaited (at once for a local step).
void WorkerCore::end_step(const StepPlan& plan, Actions& out) {
  if (plan.push) {
    send_pushes(step_, plan.pull, out);
  } else if (plan.pull) {
    send_pulls(out);
  }
  ++step_;
  if (outstanding_ == 0) {
    comm_start_ = now_();
    lap(comm_start_, report_.other_s);  // a local step: its update
    held_in_step_ = 0.0;
    applied_in_step_ = 0;
    finish_step(out);
  }
}

// Every epoch is done: pushes what the plan had not pushed yet, else
// leaves.
void WorkerCore::out_of_data(Actions& out) {
  if (unpushed_samples_ == 0) {
    leave(out);
    return;
  }
  // The plan had not pushed our last steps yet (averaging's last partial
  // round, Downpour's n_push): carry them before leaving. Parameters are
  // tagged with the clock at which the plan would have pushed next, so
  // under averaging a worker with fewer steps joins the others' next
  // average instead of committing alone; gradients, and the copies
  // allreduce and gossip publish, with the clock of their last step (a
  // later one would count them that much staler, or count steps never
  // taken).
  finishing_ = true;
  step_ends_epoch_ = false;
  Clock clock = step_ - 1;
  const bool rounds = policy_->payload() == Payload::parameters && policy_->exchange() == Exchange::none;
  for (Clock s = step_ - 1; rounds && s < step_ + 1'000'000; ++s) {
    if (policy_->plan(s).push) {
      clock = s;
      break;
    }
  }
  send_pushes(clock, false, out);
}

// A NaN or infinite loss means a gradient that would poison the
// parameters: drop it, count it, and stop the job once it is clearly
// diverging rather than a single bad batch; with epochs shorter than that,
// two whole epochs of them are as clear (a job of one step an epoch had
// trained on with loss nan). True when it failed the job.
bool WorkerCore::count_loss(float loss, const data::Batch& batch, Actions& out) {
  step_dropped_ = !std::isfinite(loss);
  const std::uint32_t epoch_steps = ++epoch_steps_;
  if (batch.last_in_epoch) epoch_steps_ = 0;
  if (!step_dropped_) {
    nonfinite_streak_ = 0;
    report_.loss_sum += static_cast<double>(loss) * static_cast<double>(batch.size);
    return false;
  }
  ++report_.dropped_batches;
  report_.dropped_samples += batch.size;
  ++nonfinite_streak_;
  const bool two_epochs = batch.last_in_epoch && nonfinite_streak_ >= 2 * epoch_steps;
  if (nonfinite_streak_ < kMaxNonFiniteSteps && !two_epochs) return false;
  // (a NaN's sign means nothing: "-nan" read as a different failure)
  const char* what = std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf";
  fail(StatusCode::diverged,
       fmt::format("the loss was {} for {} steps in a row (up to step {}{})", what, nonfinite_streak_, step_,
                   nonfinite_streak_ < kMaxNonFiniteSteps ? ": every step of two epochs" : ""),
       out);
  return true;
}

void WorkerCore::try_step(Actions& out) {
  if (finished_ || finishing_ || straggling_ || exchanging_ || outstanding_ > 0) return;
  if (!next_batch_) {
    if (!idle_since_) idle_since_ = now_();
    if (!batch_requested_) request_batch(out);
    return;
  }
  if (idle_since_) {
    lap(*idle_since_, report_.other_s);
    idle_since_.reset();
    lap(now_(), report_.data_wait_s);
  } else {
    lap(now_(), report_.other_s);  // waiting for a thread since the last step
  }
  data::Batch batch = std::move(*next_batch_);
  next_batch_.reset();
  if (batch.size == 0) {  // every epoch done
    out_of_data(out);
    return;
  }
  request_batch(out);  // the feeder prepares the next one while we compute

  const auto t0 = now_();
  float loss = 0.0f;
  try {
    loss = model_->compute_gradients(batch.x, batch.y);
  } catch (const std::exception& e) {  // a device failure (CUDA errors surface as exceptions)
    fail(StatusCode::internal, "on " + model_->device().str() + ": " + e.what(), out);
    return;
  }
  const Instant computed = now_();
  const double compute_s = std::chrono::duration<double>(computed - t0).count();
  report_.compute_s += compute_s;
  // The feeder's reply may sit in our mailbox behind a watchdog tick while
  // we computed: its time runs from now, or a step longer than
  // --rpc-timeout (resnet18 on a slow CPU) would time out a batch that came.
  if (batch_requested_) batch_requested_at_ = computed;
  const Model::StepTimes& took = model_->last_step_times();
  report_.forward_s += took.forward_s;
  report_.backward_s += took.backward_s;
  report_.copy_s += took.copy_s;
  report_.device_s += took.device_s;
  double between = 0.0;  // the step's own overhead around the model's passes
  lap(computed, between);
  report_.other_s += std::max(0.0, between - took.forward_s - took.backward_s - took.copy_s - took.device_s);
  report_.samples += batch.size;
  ++report_.batches;
  if (count_loss(loss, batch, out)) return;  // diverged
  step_samples_ = static_cast<std::uint32_t>(batch.size);
  step_ends_epoch_ = batch.last_in_epoch;
  step_epoch_ = batch.epoch;
  if (const double delay_s = straggler_.delay_s(step_ + 1, compute_s); delay_s > 0) {
    // A simulated straggler: the step's extra time is spent on a timer, so
    // the core stays free for the other workers.
    straggling_ = true;
    const auto delay = std::chrono::duration<double>(delay_s);
    out.emplace_back(worker_action::Delay{std::chrono::duration_cast<std::chrono::steady_clock::duration>(delay)});
    return;
  }
  continue_step(out);
}

void WorkerCore::resume(Actions& out) {
  if (finished_ || !straggling_) return;
  straggling_ = false;
  lap(now_(), report_.delay_s);
  if (batch_requested_) batch_requested_at_ = now_();  // as after computing
  continue_step(out);
}

void WorkerCore::check_overdue(Actions& out) {
  if (finished_) return;
  const double limit = std::chrono::duration<double>(rpc_timeout_).count();
  if (outstanding_ > 0 && seconds_since(comm_start_) > limit) {
    std::string who;
    for (std::size_t i = 0; i < awaiting_.size(); ++i)
      if (awaiting_[i]) who += (who.empty() ? "" : ", ") + std::to_string(i);
    // Only a policy with a staleness bound holds reads back on purpose;
    // under async a missing reply means the shard itself is not answering.
    const char* why = policy_->staleness_bound()
                          ? "a synchronous policy holds a read until the slowest worker catches up (the shard's log "
                            "names it), or the shard's process died or stopped"
                          : "the shard's process died, stopped or hung (the coordinator's log says whether it still "
                            "sends heartbeats)";
    fail(StatusCode::timeout,
         fmt::format("no reply from shard(s) {} within {:g} s (--rpc-timeout) at step {} under policy {}: {}", who,
                     limit, step_, policy_->name(), why),
         out);
    return;
  }
  if (exchanging_) {
    // Another worker does not admit this one's key: no exchange with it completes.
    if (std::string why = collective_->refused(); !why.empty()) {
      fail(StatusCode::invalid_argument,
           fmt::format("no exchange with the other workers at step {} under policy {}: {}", step_, policy_->name(), why),
           out);
      return;
    }
  }
  if (exchanging_ && seconds_since(exchange_start_) > limit) {
    fail(StatusCode::timeout,
         fmt::format("no exchange with the other workers within {:g} s (--rpc-timeout) at step {} under policy {}: "
                     "waiting for {}",
                     limit, step_, policy_->name(), collective_->waiting_for(id_)),
         out);
    return;
  }
  if (batch_requested_ && seconds_since(batch_requested_at_) > limit) {
    fail(StatusCode::timeout,
         fmt::format("no batch from the data feeder within {:g} s (--rpc-timeout) at step {}", limit, step_), out);
    return;
  }
  out.emplace_back(worker_action::Watch{std::min<std::chrono::steady_clock::duration>(rpc_timeout_ / 4, std::chrono::seconds(1))});
}

StepCost WorkerCore::calibrate(const data::Batch& probe) {
  constexpr int kSteps = 5;
  const std::size_t small = std::max<std::size_t>(1, probe.size / 4);
  const std::size_t sample = probe.size == 0 ? 0 : probe.x.size() / probe.size;
  const auto step_s = [&](std::size_t b) {  // the fastest of kSteps steps on the first b samples
    const std::span<const float> x(probe.x.data(), b * sample);
    const std::span<const std::int32_t> y(probe.y.data(), b);
    model_->compute_gradients(x, y);
    double fastest = std::numeric_limits<double>::infinity();
    for (int i = 0; i < kSteps; ++i) {  // load from elsewhere only slows a step: the fastest is the truest
      const auto t0 = now_();
      model_->compute_gradients(x, y);
      fastest = std::min(fastest, seconds_since(t0));
    }
    return fastest * straggler_.mean_factor();
  };
  if (probe.size == 0) return {};
  const double t_small = step_s(small), t_all = step_s(probe.size);
  if (probe.size <= small || t_all <= t_small)  // one size, or noise: no fixed part to tell apart
    return {0.0, t_all / static_cast<double>(probe.size)};
  const double per_sample = (t_all - t_small) / static_cast<double>(probe.size - small);
  return {std::max(0.0, t_small - per_sample * static_cast<double>(small)), per_sample};
}

}  // namespace asgd
