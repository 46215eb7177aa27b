#include "actors/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <cmath>

#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"
#include "actors/checkpoint.hpp"

namespace asgd {

namespace {

using Self = caf::stateful_actor<CoordinatorState>*;
using SteadyClock = std::chrono::steady_clock;

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

caf::timespan eval_period(const JobConfig& c) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(c.eval_every_s));
}

void note_accuracy(CoordinatorState& s, double accuracy, double at_s) {
  const auto& target = s.setup.config.target_accuracy;
  if (target && !s.time_to_target_s && accuracy >= *target) s.time_to_target_s = at_s;
  s.last_val_accuracy = accuracy;
  ++s.evaluations;
}

void set_live_state(CoordinatorState& s, const char* state, const std::string& message = {}) {
  if (!s.setup.live) return;
  s.setup.live->update([&](LiveSnapshot& snap) {
    snap.state = state;
    snap.message = message;
  });
}

double training_seconds(const CoordinatorState& s) {
  return s.train_start == SteadyClock::time_point{} ? 0.0 : seconds_between(s.train_start, SteadyClock::now());
}

CoordinatorState::Totals totals_now(const CoordinatorState& s) {
  CoordinatorState::Totals t;
  for (const auto& w : s.seen) {
    t.samples += w.latest.samples;
    t.updates += w.latest.updates;
    t.loss_sum += w.latest.loss_sum;
    t.loss_samples += w.latest.loss_samples;
  }
  t.at_s = training_seconds(s);
  return t;
}

// The mean loss of the batches reported between two totals; NaN for none.
double loss_between(const CoordinatorState::Totals& from, const CoordinatorState::Totals& to) {
  if (to.loss_samples <= from.loss_samples) return std::nan("");
  return (to.loss_sum - from.loss_sum) / static_cast<double>(to.loss_samples - from.loss_samples);
}

void shut_down(Self self) {
  for (auto* group : {&self->state.workers, &self->state.feeders, &self->state.shards})
    for (auto& a : *group) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->quit();
}

void fail(Self self, Status status) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  spdlog::error("job failed: {}", status.message());
  set_live_state(st, "failed", status.message());
  st.setup.outcome->set_value(std::move(status));
  shut_down(self);
}

// Asks every shard for its parameters, copies them into the coordinator's
// model, then calls `then`.
void snapshot(Self self, std::function<void()> then) {
  auto& st = self->state;
  auto remaining = std::make_shared<std::size_t>(st.shards.size());
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    self->request(st.shards[i], rpc_timeout(st.setup.config), snapshot_atom::value)
        .then(
            [self, remaining, then, i](ShardReply& reply) {
              auto& s = self->state;
              const KeyRange& r = s.plan.ranges[i];
              if (reply.shard != i || reply.params.size() != r.size()) {
                fail(self, Status::Internal("shard " + std::to_string(i) + " sent a malformed snapshot"));
                return;
              }
              std::copy(reply.params.begin(), reply.params.end(),
                        s.model->params().begin() + static_cast<std::ptrdiff_t>(r.begin));
              if (--*remaining == 0) then();
            },
            [self, i](caf::error& err) {
              fail(self, Status::Timeout("coordinator: no snapshot from shard " + std::to_string(i) + ": " +
                                         self->system().render(err)));
            });
  }
}

JobSummary make_summary(const CoordinatorState& c, const EvalResult& test, const std::vector<std::uint64_t>& histogram) {
  const JobConfig& cfg = c.setup.config;
  JobSummary sum;
  sum.policy = c.plan.policy_name;
  sum.staleness = c.plan.staleness_bound;
  sum.workers = cfg.workers;
  sum.shards = cfg.shards;
  sum.device = cfg.device;
  sum.model = cfg.model_spec ? cfg.model_spec->name() : cfg.model;
  sum.dataset = c.setup.data->name;
  sum.epochs = cfg.epochs;
  sum.train_s = c.train_s;
  std::uint64_t samples = 0;
  for (const auto& w : c.worker_totals) {
    samples += w.samples;
    sum.worker_wait_s.push_back(w.policy_wait_s);
  }
  for (const auto& w : c.plan.workers) sum.worker_batch.push_back(w.share.batch);
  sum.samples_per_s = c.train_s > 0 ? static_cast<double>(samples) / c.train_s : 0.0;
  sum.final_test_accuracy = test.accuracy;
  sum.time_to_target_s = c.time_to_target_s;
  sum.updates_applied = c.updates;
  const StalenessSummary stale = summarize_staleness(histogram);
  sum.staleness_mean = stale.mean;
  sum.staleness_p99 = stale.p99;
  sum.staleness_max = stale.max;
  sum.staleness_histogram = histogram;
  return sum;
}

// The shards' parameters were never in a model that ran forward, so any
// BatchNorm running statistics the coordinator's model holds belong to
// other parameters: recompute them on a fixed slice of the training split
// (never the split being scored) before evaluating.
constexpr std::size_t kRecalibrationSamples = 2048;

EvalResult evaluate_on(CoordinatorState& st, const data::LabeledImages& split) {
  if (st.model->has_batchnorm()) {
    const auto& train = st.setup.data->train;
    const std::size_t per_sample = train.pixels.size() / std::max<std::size_t>(train.labels.size(), 1);
    const std::size_t n = std::min(kRecalibrationSamples, train.labels.size());
    st.model->recalibrate_batchnorm(std::span<const float>(train.pixels).first(n * per_sample));
  }
  return st.model->evaluate(split.pixels, split.labels);
}

// The evaluated model (its BatchNorm statistics just recalibrated) as
// DIR/model.ckpt, when the job asked for one.
Status save_checkpoint(CoordinatorState& st, const EvalResult& test) {
  const JobConfig& cfg = st.setup.config;
  if (cfg.checkpoint_dir.empty()) return {};
  Checkpoint ckpt = Checkpoint::of(*st.model);
  ckpt.sample_shape = st.model->sample_shape();
  ckpt.classes = st.model->classes();
  if (cfg.model_spec) ckpt.model_spec = cfg.model_spec->to_json();
  ckpt.dataset = st.setup.data->name;
  ckpt.input_mean = st.setup.data->normalization.mean;
  ckpt.input_stddev = st.setup.data->normalization.stddev;
  ckpt.updates = st.updates;
  ckpt.test_accuracy = test.accuracy;
  const Status s = write_checkpoint(cfg.checkpoint_dir, ckpt);
  if (s.ok()) spdlog::info("checkpoint: {}/{}", cfg.checkpoint_dir, kCheckpointFile);
  return s;
}

// Once the last epoch is evaluated and every worker has stopped (so every
// last push has reached its shard): the final parameters, the test
// accuracy, the shards' statistics, the outcome; then stop.
void finish(Self self) {
  auto& st = self->state;
  if (st.finishing || !st.last_epoch_evaluated || st.workers_stopped < st.workers.size()) return;
  st.finishing = true;
  set_live_state(st, "finishing");
  snapshot(self, [self] {
    auto& c = self->state;
    if (c.setup.on_final_params) c.setup.on_final_params(c.model->params());
    const EvalResult result = evaluate_on(c, c.setup.data->test);
    if (const Status saved = save_checkpoint(c, result); !saved.ok()) {
      fail(self, saved);
      return;
    }
    auto stats = std::make_shared<std::vector<ShardStats>>();
    for (std::size_t i = 0; i < c.shards.size(); ++i) {
      self->request(c.shards[i], rpc_timeout(c.setup.config), stats_atom::value)
          .then(
              [self, stats, result](ShardStats& s) {
                stats->push_back(std::move(s));
                auto& c2 = self->state;
                if (stats->size() < c2.shards.size() || c2.done) return;
                std::vector<std::uint64_t> histogram;
                for (const auto& s2 : *stats) merge_histogram(histogram, s2.staleness_histogram);
                for (const auto& w : c2.worker_totals) {
                  merge_histogram(histogram, w.staleness_histogram);
                  spdlog::info("worker {}: {} samples, compute {:.2f} s, shard round trips {:.2f} s (held by the "
                               "policy {:.2f} s), waiting for data {:.2f} s, {} batches dropped (NaN/Inf loss)",
                               w.worker, w.samples, w.compute_s, w.comm_s, w.policy_wait_s, w.data_wait_s,
                               w.dropped_batches);
                }
                std::uint64_t malformed = 0;
                std::uint64_t nonfinite = 0;
                std::uint64_t checkpoint_failures = 0;
                for (const auto& s2 : *stats) {
                  malformed += s2.malformed_frames;
                  checkpoint_failures += s2.checkpoint_failures;
                  if (s2.malformed_frames > 0)
                    spdlog::warn("shard {}'s process dropped {} malformed frames", s2.shard, s2.malformed_frames);
                  if (s2.rejected > 0)
                    spdlog::warn("shard {} rejected {} malformed pushes or pulls", s2.shard, s2.rejected);
                  if (s2.refused_departed > 0)
                    spdlog::info("shard {} refused {} pushes or pulls of workers that had left (finished, or lost "
                                 "while only stalled)",
                                 s2.shard, s2.refused_departed);
                  if (s2.checkpoint_failures > 0)
                    spdlog::warn("shard {}: {} checkpoint writes failed", s2.shard, s2.checkpoint_failures);
                  if (s2.nonfinite > 0)
                    spdlog::warn("shard {} refused {} pushes holding NaN or infinity", s2.shard, s2.nonfinite);
                  nonfinite += s2.nonfinite;
                  if (s2.updates_discarded > 0)
                    spdlog::info("shard {} discarded {} late pushes", s2.shard, s2.updates_discarded);
                }
                c2.done = true;
                set_live_state(c2, "done");
                JobSummary summary = make_summary(c2, result, histogram);
                summary.workers_lost = c2.workers_lost;
                summary.shard_restarts = c2.shard_restarts;
                summary.workers_rejoined = c2.workers_rejoined;
                summary.malformed_frames = malformed;
                summary.nonfinite_rejected = nonfinite;
                summary.checkpoint_failures = checkpoint_failures;
                c2.setup.outcome->set_value(std::move(summary));
                shut_down(self);
              },
              [self, i](caf::error& err) {
                fail(self, Status::Timeout("coordinator: no statistics from shard " + std::to_string(i) + ": " +
                                           self->system().render(err)));
              });
    }
  });
}

void maybe_evaluate(Self self) {
  auto& st = self->state;
  if (st.evaluating || st.to_evaluate.empty() || st.done) return;
  st.evaluating = true;
  snapshot(self, [self] {
    auto& s = self->state;
    const std::uint64_t e = s.to_evaluate.front();
    s.to_evaluate.pop_front();
    const auto& agg = s.epochs.at(e);
    const EvalResult r = evaluate_on(s, s.setup.data->validation);
    EpochMetrics m;
    m.epoch = static_cast<std::uint32_t>(e + 1);
    m.wall_s = agg.end_s;
    const std::uint64_t loss_samples = agg.sum.samples - agg.sum.dropped_samples;
    double loss_sum = 0.0;
    for (double l : agg.loss_by_worker) loss_sum += l;
    m.train_loss = loss_samples ? loss_sum / static_cast<double>(loss_samples) : 0.0;
    if (agg.sum.dropped_batches > 0)
      spdlog::warn("epoch {}: dropped {} batch gradients whose loss was NaN or infinite", e + 1, agg.sum.dropped_batches);
    m.val_accuracy = r.accuracy;
    m.samples_per_s = agg.duration_s > 0 ? static_cast<double>(agg.sum.samples) / agg.duration_s : 0.0;
    s.updates += agg.sum.updates;
    m.updates = s.updates;
    note_accuracy(s, r.accuracy, m.wall_s);
    s.last_point = totals_now(s);
    if (s.setup.on_epoch) s.setup.on_epoch(m);
    s.epochs.erase(e);
    s.evaluating = false;
    if (m.epoch == s.setup.config.epochs) {
      s.last_epoch_evaluated = true;
      finish(self);
    } else {
      maybe_evaluate(self);
    }
  });
}

}  // namespace

caf::timespan rpc_timeout(const JobConfig& c) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(c.rpc_timeout_s));
}

void merge_histogram(std::vector<std::uint64_t>& into, const std::vector<std::uint64_t>& h) {
  if (into.size() < h.size()) into.resize(h.size(), 0);
  for (std::size_t i = 0; i < h.size(); ++i) into[i] += h[i];
}

StalenessSummary summarize_staleness(const std::vector<std::uint64_t>& merged) {
  StalenessSummary out;
  double sum = 0.0;
  for (std::size_t i = 0; i < merged.size(); ++i) {
    out.count += merged[i];
    sum += static_cast<double>(i) * static_cast<double>(merged[i]);
    if (merged[i] > 0) out.max = static_cast<double>(i);
  }
  if (out.count == 0) return out;
  out.mean = sum / static_cast<double>(out.count);
  // p99: the smallest s with at least 99% of applications at or below it.
  const auto needed = static_cast<std::uint64_t>(std::ceil(0.99 * static_cast<double>(out.count)));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < merged.size(); ++i) {
    seen += merged[i];
    if (seen >= needed) {
      out.p99 = static_cast<double>(i);
      break;
    }
  }
  return out;
}

namespace {

// Queues, in order, every epoch that each worker still in the job has
// reported (a lost worker's missing reports are not waited for), and starts
// evaluating them. An epoch a worker has not reported yet holds back the
// later ones that faster workers have, but not the evaluation of those
// before it.
void complete_epochs(Self self) {
  auto& s = self->state;
  auto all_reported = [&s](std::uint64_t e, CoordinatorState::EpochAgg& agg) {
    agg.reported.resize(s.setup.config.workers, false);
    for (std::size_t w = 0; w < agg.reported.size(); ++w) {
      const bool lost = w < s.seen.size() && (s.seen[w].lost || e < s.seen[w].first_epoch);
      if (!agg.reported[w] && !lost) return false;
    }
    return true;
  };
  for (auto& [e, agg] : s.epochs) {
    if (agg.complete) continue;
    if (!all_reported(e, agg)) break;
    agg.complete = true;
    // The epoch ended with the last report it got, which is now unless a
    // lost worker was holding it back: then it ended earlier, and may be
    // completed together with later epochs the others had reported since.
    agg.end_s = std::max(agg.last_report_s, s.last_epoch_end_s);
    agg.duration_s = agg.end_s - s.last_epoch_end_s;
    s.last_epoch_end_s = agg.end_s;
    if (e + 1 == s.setup.config.epochs) s.train_s = agg.end_s;
    s.to_evaluate.push_back(e);
  }
  maybe_evaluate(self);
}

// Worker `w` stopped abnormally: go on without it, unless none is left.
void lose_worker(Self self, std::size_t w, const std::string& why) {
  auto& s = self->state;
  if (w >= s.seen.size() || s.seen[w].lost || s.seen[w].finished) return;
  s.seen[w].lost = true;
  ++s.workers_lost;
  ++s.workers_stopped;
  const std::uint32_t live = s.setup.config.workers - s.workers_lost;
  if (live == 0) {
    fail(self, Status::Internal("every worker was lost; the last, worker " + std::to_string(w) + ": " + why));
    return;
  }
  spdlog::warn("worker {} is lost ({}): the job goes on with {} live worker(s) under policy {}; its data share "
               "is not trained further",
               w, why, live, s.setup.config.policy);
  // The shards stop counting it: a barrier re-forms over the live workers.
  for (auto& shard : s.shards) self->send(shard, leave_atom::value, static_cast<WorkerId>(w));
  if (s.shared) s.shared->live[w].store(false, std::memory_order_release);
  complete_epochs(self);
  finish(self);
}

// A new process registered for worker `w`, whose old one died: it trains
// w's share from the epoch after the furthest live worker's, so no barrier
// waits for it to catch up (a shard's clock for it jumps to that epoch's
// first step, and every policy counts a worker whose clock passed a step
// as done with it).
void rejoin_worker(Self self, std::uint32_t w) {
  auto& s = self->state;
  const JobConfig& cfg = s.setup.config;
  auto refuse = [&](const std::string& why) {
    spdlog::warn("a new process for worker {} is not taken: {}", w, why);
    if (s.setup.remote) s.setup.remote->dismiss_worker(w, why);
  };
  if (!s.setup.remote || w >= s.workers.size() || w >= s.seen.size()) return refuse("no such worker");
  if (s.done || s.finishing) return refuse("the job is ending");
  if (s.seen[w].finished) return refuse("worker " + std::to_string(w) + " had finished its share");
  std::uint64_t furthest = 0;
  for (std::size_t i = 0; i < s.seen.size(); ++i)
    if (i != w && !s.seen[i].lost && !s.seen[i].finished) furthest = std::max(furthest, s.seen[i].latest.epoch);
  const std::uint64_t first = furthest + 1;
  if (first >= cfg.epochs) return refuse("the others are in the last epoch: nothing is left for it to train");
  if (!s.seen[w].lost) {
    // Its old process is dead (silent), though not yet past --heartbeat-timeout.
    self->demonitor(s.workers[w]);
    self->send_exit(s.workers[w], caf::exit_reason::kill);
    lose_worker(self, w, "a new process registered in its place");
    if (s.done || s.finishing) return refuse("the job is ending");
  }
  auto proxy = s.setup.remote->place_worker(self, w);
  if (!proxy) return refuse(proxy.status().message());
  s.workers[w] = *proxy;
  s.names[proxy->address()] = "worker " + std::to_string(w);
  self->monitor(*proxy);
  s.seen[w] = {};
  s.seen[w].first_epoch = first;
  --s.workers_lost;
  --s.workers_stopped;
  ++s.workers_rejoined;
  const Clock clock = first * s.plan.workers[w].steps_per_epoch;
  // Started once every shard has taken the join: a statistics request
  // after it on the same connection is answered after it.
  auto remaining = std::make_shared<std::size_t>(s.shards.size());
  for (auto& shard : s.shards) {
    self->send(shard, join_atom::value, static_cast<WorkerId>(w), clock);
    self->request(shard, rpc_timeout(cfg), stats_atom::value)
        .then(
            [self, w, first, remaining](ShardStats&) {
              if (--*remaining > 0) return;
              auto& c = self->state;
              if (c.done) return;
              c.setup.remote->start_worker(c.plan, w, static_cast<std::uint32_t>(first));
              const double at_s = seconds_between(c.train_start, SteadyClock::now());
              spdlog::warn("worker {} rejoined at {:.1f} s: a new process trains its share from epoch {} of {} on", w,
                           at_s, first + 1, c.setup.config.epochs);
              if (c.setup.on_record)
                c.setup.on_record({{"event", "worker_rejoined"}, {"worker", w}, {"epoch", first + 1}, {"train_s", at_s}});
            },
            [self, w](caf::error& err) {
              fail(self, Status::Timeout("coordinator: a shard did not confirm worker " + std::to_string(w) +
                                         "'s rejoining: " + self->system().render(err)));
            });
  }
}

// Every kLiveEvery while training: Progress for the caller and the live
// status for a status server, from the workers' latest progress; with a
// status server also asks the shards how they stand.
void live_tick(Self self) {
  auto& st = self->state;
  if (st.done) return;
  self->delayed_send(self, kLiveEvery, live_atom::value);
  const auto now = totals_now(st);
  const double dt = now.at_s - st.last_tick.at_s;
  Progress p;
  p.wall_s = now.at_s;
  p.epochs = st.setup.config.epochs;
  p.epoch = p.epochs;
  for (const auto& w : st.seen)
    if (!w.finished) p.epoch = std::min<std::uint32_t>(p.epoch, static_cast<std::uint32_t>(w.latest.epoch + 1));
  p.samples = now.samples;
  p.total_samples = st.total_samples;
  p.train_loss = loss_between(st.last_tick, now);
  p.samples_per_s = dt > 0 ? static_cast<double>(now.samples - st.last_tick.samples) / dt : 0.0;
  p.val_accuracy = st.last_val_accuracy;
  if (now.samples > 0 && now.at_s > 0 && st.total_samples >= now.samples)
    p.eta_s = static_cast<double>(st.total_samples - now.samples) * now.at_s / static_cast<double>(now.samples);
  st.last_tick = now;
  if (st.setup.on_progress) st.setup.on_progress(p);
  if (!st.setup.live) return;

  const auto at = SteadyClock::now();
  st.setup.live->update([&](LiveSnapshot& snap) {
    if (snap.state == "starting") snap.state = "training";
    snap.wall_s = p.wall_s;
    snap.epoch = p.epoch;
    snap.progress = st.total_samples ? std::min(1.0, static_cast<double>(p.samples) / st.total_samples) : 0.0;
    snap.eta_s = p.eta_s;
    snap.samples = p.samples;
    snap.total_samples = p.total_samples;
    snap.samples_per_s = p.samples_per_s;
    snap.updates = now.updates;
    snap.train_loss = std::isfinite(p.train_loss) ? std::optional<double>(p.train_loss) : snap.train_loss;
    snap.val_accuracy = p.val_accuracy;
    snap.evaluations = st.evaluations;
    snap.worker.clear();
    for (std::size_t w = 0; w < st.seen.size(); ++w) {
      const auto& seen = st.seen[w];
      LiveWorker lw;
      lw.worker = static_cast<std::uint32_t>(w);
      lw.clock = seen.latest.clock;
      lw.epoch = seen.latest.epoch + 1;
      lw.samples = seen.latest.samples;
      lw.updates = seen.latest.updates;
      lw.staleness = seen.latest.staleness;
      lw.wait_s = seen.latest.policy_wait_s;
      lw.batches_ready = seen.latest.batches_ready;
      lw.alive = !seen.lost;
      lw.finished = seen.finished;
      lw.last_seen_s = seen.at == SteadyClock::time_point{} ? p.wall_s : seconds_between(seen.at, at);
      snap.worker.push_back(lw);
    }
    snap.shard = st.live_shards;
  });
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    self->request(st.shards[i], rpc_timeout(st.setup.config), stats_atom::value)
        .then(
            [self, i](ShardStats& s) {
              auto& c = self->state;
              if (i >= c.live_shards.size()) return;
              LiveShard& l = c.live_shards[i];
              l.shard = s.shard;
              l.keys = s.keys;
              l.updates_applied = s.updates_applied;
              l.rejected = s.rejected;
              l.refused_departed = s.refused_departed;
              l.malformed_frames = s.malformed_frames;
              l.nonfinite = s.nonfinite;
              l.held = s.held;
              l.queued = s.queued;
              l.checkpoint_failures = s.checkpoint_failures;
              l.checkpoint_age_s.reset();
              if (s.checkpoint_unix_s > 0) l.checkpoint_age_s = std::max(0.0, unix_seconds_now() - s.checkpoint_unix_s);
            },
            [i](caf::error&) { spdlog::debug("live status: no statistics from shard {} this time", i); });
  }
}

void start_live(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  st.seen.assign(cfg.workers, {});
  st.live_shards.assign(st.shards.size(), {});
  st.total_samples = 0;
  const std::uint32_t first_epoch = st.resumed ? st.resumed->first_epoch : 0;
  for (const auto& w : st.plan.workers) st.total_samples += w.share.partition.size() * (cfg.epochs - first_epoch);
  if (st.setup.on_progress || st.setup.live) self->delayed_send(self, kLiveEvery, live_atom::value);
}

// Spawns a data feeder per worker for its share and starts every worker.
void start_training(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  start_live(self);
  if (st.setup.remote) {  // each worker process feeds its own worker
    st.train_start = SteadyClock::now();
    st.last_epoch_end_s = 0.0;
    for (std::uint32_t w = 0; w < cfg.workers; ++w) st.setup.remote->start_worker(st.plan, w, 0);
    if (cfg.eval_every_s > 0) self->delayed_send(self, eval_period(cfg), eval_atom::value);
    return;
  }
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    auto feeder = self->spawn<caf::detached>(
        data_feeder, feeder_setup(st.plan, st.plan.workers[w], st.setup.data, st.resumed ? st.resumed->first_epoch : 0u));
    st.names[feeder.address()] = "data feeder " + std::to_string(w);
    st.feeders.push_back(feeder);
    self->monitor(feeder);
  }
  st.train_start = SteadyClock::now();
  st.last_epoch_end_s = 0.0;
  for (std::uint32_t w = 0; w < cfg.workers; ++w) self->send(st.workers[w], start_atom::value, st.feeders[w]);
  if (cfg.eval_every_s > 0) self->delayed_send(self, eval_period(cfg), eval_atom::value);
}

// --worker-weights auto: asks the workers one at a time (so they do not
// compete for cores) how many samples per second they compute, then sizes
// their shares in proportion and starts training.
void calibrate(Self self, std::size_t next, std::shared_ptr<std::vector<double>> rates) {
  auto& st = self->state;
  if (next == st.workers.size()) {
    for (std::size_t w = 0; w < rates->size(); ++w)
      spdlog::info("worker {}: {:.0f} samples/s in calibration", w, (*rates)[w]);
    replan_shares(st.plan, *rates);
    start_training(self);
    return;
  }
  data::Batch probe;
  const std::size_t n = std::min<std::size_t>(st.setup.config.batch, st.setup.data->train.count);
  std::vector<std::size_t> first(n);
  for (std::size_t i = 0; i < n; ++i) first[i] = i;
  data::gather_batch(st.setup.data->train, first, probe);
  self->request(st.workers[next], rpc_timeout(st.setup.config), calibrate_atom::value, std::move(probe))
      .then(
          [self, next, rates](double samples_per_s) {
            rates->push_back(std::max(samples_per_s, 1e-9));
            calibrate(self, next + 1, rates);
          },
          [self, next](caf::error& err) {
            fail(self, Status::Timeout("coordinator: no calibration from worker " + std::to_string(next) + ": " +
                                       self->system().render(err)));
          });
}

// What to change when training diverged: the step it ran with, where it
// came from, and a smaller one to try.
std::string divergence_hint(const JobConfig& c, const JobPlan& plan) {
  const TrainingSettings& t = plan.training;
  std::string from = c.lr ? "--lr" : "the default";
  for (const auto& a : t.adjusted)
    if (a.size() > 3 && a.rfind("lr ", 0) == 0 && std::isdigit(static_cast<unsigned char>(a[3]))) from = "the default, " + a;
  std::string hint = fmt::format("; the job ran with lr {:g} ({}), momentum {:g}{}, {} workers under {}: try --lr {:g}",
                                 t.lr, from, t.momentum, t.staleness_aware_lr ? ", staleness-aware steps" : "",
                                 c.workers, c.policy, t.lr / 2);
  if (c.optimizer == "momentum" && t.momentum > 0.6) hint += fmt::format(" or --momentum {:g}", t.momentum - 0.3);
  return hint;
}

// What --resume was given is the user's to fix, whatever is wrong with it
// (a damaged, foreign or unreadable checkpoint): a usage error that names
// the folder and the file.
Status resume_refused(const JobConfig& cfg, const Status& why) {
  if (why.code() == StatusCode::invalid_argument || why.code() == StatusCode::not_found) return why;
  return Status::InvalidArgument("--resume " + cfg.resume + ": " + why.message());
}

}  // namespace

Result<ResumePlan> plan_resume(const JobConfig& cfg, const JobPlan& job) {
  const std::vector<WorkerPlan>& workers = job.workers;
  ResumePlan plan;
  std::vector<Clock> done(workers.size(), std::numeric_limits<Clock>::max());  // per worker: steps every shard has
  plan.updates = std::numeric_limits<std::uint64_t>::max();
  plan.written_unix_s = std::numeric_limits<double>::max();
  for (std::uint32_t i = 0; i < cfg.shards; ++i) {
    const std::string path = shard_checkpoint_path(cfg.resume, i);
    auto saved = ShardCore::saved(path);
    if (!saved) {
      if (saved.status().code() == StatusCode::not_found)
        return Status::NotFound("--resume " + cfg.resume + ": no checkpoint of shard " + std::to_string(i) + " (" +
                                path + "); was the job run with --checkpoint-dir and --checkpoint-every?");
      return resume_refused(cfg, saved.status());
    }
    const auto& clocks = saved->stats.worker_clock;
    if (clocks.size() != workers.size())
      return Status::InvalidArgument("--resume " + cfg.resume + ": " + path + " is of a job with " +
                                     std::to_string(clocks.size()) + " workers, not " + std::to_string(workers.size()));
    for (std::size_t w = 0; w < clocks.size(); ++w) done[w] = std::min(done[w], clocks[w]);
    plan.updates = std::min(plan.updates, saved->stats.updates_applied);
    plan.written_unix_s = std::min(plan.written_unix_s, saved->written_unix_s);
  }
  std::uint64_t epochs_done = cfg.epochs;
  for (std::size_t w = 0; w < workers.size(); ++w)
    epochs_done = std::min<std::uint64_t>(epochs_done, done[w] / std::max<std::uint64_t>(workers[w].steps_per_epoch, 1));
  if (epochs_done >= cfg.epochs)
    return Status::InvalidArgument("--resume " + cfg.resume + ": the checkpointed job had trained all " +
                                   std::to_string(cfg.epochs) + " epochs; raise --epochs to train further");
  plan.first_epoch = static_cast<std::uint32_t>(epochs_done);
  for (const auto& w : workers) plan.restart.push_back(plan.first_epoch * w.steps_per_epoch);
  return plan;
}

namespace {

// --resume: where each worker starts again, read from the shards'
// checkpoints. False once the job has failed.
bool resume(Self self) {
  auto& st = self->state;
  auto plan = plan_resume(st.setup.config, st.plan);
  if (!plan) {
    fail(self, plan.status());
    return false;
  }
  st.resumed = std::move(plan).value();
  st.updates = st.resumed->updates;
  for (WorkerPlan& w : st.plan.workers) w.first_clock = st.resumed->restart[w.id];
  return true;
}

// Every shard restored: only now does the metrics file hear of it.
void announce_resume(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  const double now_unix = unix_seconds_now();
  spdlog::info("resuming {} at epoch {} of {}: {} updates restored from checkpoints written {:.0f} s ago", cfg.resume,
               st.resumed->first_epoch + 1, cfg.epochs, st.resumed->updates, now_unix - st.resumed->written_unix_s);
  if (st.setup.on_record)
    st.setup.on_record({{"event", "resume"},
                        {"from", cfg.resume},
                        {"epoch", st.resumed->first_epoch + 1},
                        {"updates", st.resumed->updates},
                        {"checkpoint_age_s", now_unix - st.resumed->written_unix_s},
                        // Updates after the last checkpoint were lost with the stopped job: at most one interval.
                        {"lost_at_most_s", cfg.checkpoint_every_s}});
}

// The plan's shards, each on its slice of the model's initial parameters
// (or its checkpoint, when the job resumes), spawned here or placed in
// their processes. False once the job has failed.
bool start_shards(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  const auto params = st.model->params();
  for (const ShardPlan& plan : st.plan.shards) {
    std::vector<float> initial;
    if (!st.shared)
      initial.assign(params.begin() + static_cast<std::ptrdiff_t>(plan.range.begin),
                     params.begin() + static_cast<std::ptrdiff_t>(plan.range.end));
    ShardSetup ss = shard_setup(st.plan, plan, std::move(initial));
    ss.shared = st.shared;
    auto core = ShardCore::make(ss);  // checks the setup, remote or not
    if (!core) {
      fail(self, core.status());
      return false;
    }
    if (st.resumed) {
      if (const Status s = core->restore(shard_checkpoint_path(cfg.resume, plan.index), st.resumed->restart); !s.ok()) {
        fail(self, resume_refused(cfg, s));
        return false;
      }
    }
    caf::actor shard;
    if (st.setup.remote) {
      auto placed = st.setup.remote->place_shard(self, ss);
      if (!placed) {
        fail(self, placed.status());
        return false;
      }
      shard = *placed;
    } else {
      shard = self->spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
    }
    st.names[shard.address()] = "shard " + std::to_string(plan.index);
    st.shards.push_back(shard);
  }
  return true;
}

// The plan's workers, spawned here or standing for their processes; they
// start training later (start_training). False once the job has failed.
bool start_workers(Self self) {
  auto& st = self->state;
  st.worker_totals.resize(st.plan.workers.size());
  for (const WorkerPlan& plan : st.plan.workers) {
    caf::actor wk;
    if (st.setup.remote) {
      auto placed = st.setup.remote->place_worker(self, plan.id);
      if (!placed) {
        fail(self, placed.status());
        return false;
      }
      wk = *placed;
    } else {
      WorkerSetup ws = worker_setup(st.plan, plan);
      ws.shards = st.shards;
      ws.coordinator = caf::actor_cast<caf::actor>(self);
      ws.shared = st.shared;
      ws.compute = st.setup.compute;
      wk = self->spawn(worker, std::move(ws));
    }
    st.names[wk.address()] = "worker " + std::to_string(plan.id);
    st.workers.push_back(wk);
  }
  return true;
}

}  // namespace

namespace {

// A watched actor stopped: a worker that finished or was lost, or anything
// else, which fails the job.
void on_down(Self self, caf::down_msg& dm) {
  auto& s = self->state;
  if (s.done) return;
  if (dm.reason == caf::exit_reason::normal) {
    if (auto w = std::find(s.workers.begin(), s.workers.end(), dm.source); w != s.workers.end()) {
      if (const auto i = static_cast<std::size_t>(w - s.workers.begin()); i < s.seen.size()) s.seen[i].finished = true;
      ++s.workers_stopped;
      finish(self);
    }
    return;
  }
  if (auto w = std::find(s.workers.begin(), s.workers.end(), dm.source); w != s.workers.end()) {
    lose_worker(self, static_cast<std::size_t>(w - s.workers.begin()), self->system().render(dm.reason));
    return;
  }
  auto it = s.names.find(dm.source);
  const std::string who = it != s.names.end() ? it->second : "an actor";
  fail(self, Status::Internal(who + " stopped unexpectedly: " + self->system().render(dm.reason)));
}

// A worker finished an epoch: its totals, and the epoch's so far.
void take_report(Self self, EpochReport& r) {
  auto& s = self->state;
  if (r.worker >= s.worker_totals.size()) return;
  if (r.worker < s.seen.size() && s.seen[r.worker].lost) return;  // declared dead: its word no longer counts
  auto& total = s.worker_totals[r.worker];
  total.worker = r.worker;
  total.samples += r.samples;
  total.compute_s += r.compute_s;
  total.comm_s += r.comm_s;
  total.data_wait_s += r.data_wait_s;
  total.policy_wait_s += r.policy_wait_s;
  total.dropped_batches += r.dropped_batches;
  merge_histogram(total.staleness_histogram, r.staleness_histogram);
  auto& agg = s.epochs[r.epoch];
  ++agg.reports;
  agg.last_report_s = training_seconds(s);
  agg.reported.resize(s.setup.config.workers, false);
  agg.reported[r.worker] = true;
  agg.sum.samples += r.samples;
  agg.sum.batches += r.batches;
  agg.loss_by_worker.resize(s.setup.config.workers, 0.0);
  agg.loss_by_worker[r.worker] += r.loss_sum;
  agg.sum.dropped_batches += r.dropped_batches;
  agg.sum.dropped_samples += r.dropped_samples;
  agg.sum.updates += r.updates;
  complete_epochs(self);
}

// A worker, or the cluster's watch on a shard's process, says the job cannot
// go on: it fails with that status.
void fail_with(Self self, std::int32_t code, const std::string& what) {
  switch (static_cast<StatusCode>(code)) {
    case StatusCode::diverged:
      fail(self, Status::Diverged(what + divergence_hint(self->state.setup.config, self->state.plan)));
      break;
    case StatusCode::timeout: fail(self, Status::Timeout(what)); break;
    case StatusCode::invalid_argument: fail(self, Status::InvalidArgument(what)); break;
    default: fail(self, Status::Internal(what)); break;
  }
}

// Shard `shard`'s process was restarted: it hears who had left, and the
// metrics file what was lost.
void shard_restarted(Self self, std::uint32_t shard) {
  auto& s = self->state;
  if (s.done || shard >= s.shards.size()) return;
  // The restarted process has the workers that had left by its
  // checkpoint; the leave notices that came after died with the old one.
  for (std::size_t w = 0; w < s.seen.size(); ++w)
    if (s.seen[w].finished || s.seen[w].lost) self->send(s.shards[shard], leave_atom::value, static_cast<WorkerId>(w));
  ++s.shard_restarts;
  const double at_s = seconds_between(s.train_start, SteadyClock::now());
  // What was lost is what the restarted process did not reload: it
  // says which checkpoint it reloaded, if any (checkpoint writes may
  // have been failing for a while, or never have succeeded).
  self->request(s.shards[shard], rpc_timeout(s.setup.config), stats_atom::value)
      .then(
          [self, shard, at_s](ShardStats& reloaded) {
            auto& c = self->state;
            nlohmann::json record = {{"event", "shard_restarted"}, {"shard", shard}, {"train_s", at_s}};
            if (reloaded.restored_unix_s > 0) {
              const double age_s = std::max(0.0, unix_seconds_now() - reloaded.restored_unix_s);
              spdlog::warn("shard {} was restarted at {:.1f} s from its checkpoint of {:.1f} s before, "
                           "holding {} updates: the updates it applied after that checkpoint are lost",
                           shard, at_s, age_s, reloaded.restored_updates);
              record["checkpoint_age_s"] = age_s;
              record["restored_updates"] = reloaded.restored_updates;
              record["lost_at_most_s"] = age_s;
            } else {
              spdlog::warn("shard {} was restarted at {:.1f} s without a checkpoint to reload (none had "
                           "been written): it starts again from the initial parameters, and every update "
                           "it had applied is lost",
                           shard, at_s);
              record["checkpoint_age_s"] = nullptr;
              record["restored_updates"] = 0;
              record["lost_at_most_s"] = at_s;
            }
            if (c.setup.on_record) c.setup.on_record(record);
          },
          [self, shard, at_s](caf::error& err) {
            auto& c = self->state;
            spdlog::warn("shard {} was restarted at {:.1f} s; it did not say which checkpoint it reloaded: {}",
                         shard, at_s, self->system().render(err));
            if (c.setup.on_record)
              c.setup.on_record({{"event", "shard_restarted"}, {"shard", shard}, {"train_s", at_s},
                                 {"checkpoint_age_s", nullptr}, {"restored_updates", nullptr},
                                 {"lost_at_most_s", nullptr}});
          });
}

// Every --eval-every seconds: an evaluation point, unless an epoch's
// evaluation is under way.
void evaluate_now(Self self) {
  auto& s = self->state;
  if (s.done || s.finishing || s.last_epoch_evaluated) return;
  self->delayed_send(self, eval_period(s.setup.config), eval_atom::value);
  if (s.evaluating) return;  // an epoch's evaluation is under way: skip this one
  s.evaluating = true;
  const double taken_s = seconds_between(s.train_start, SteadyClock::now());
  const auto at = totals_now(s);
  snapshot(self, [self, taken_s, at] {
    auto& c = self->state;
    const EvalResult r = evaluate_on(c, c.setup.data->validation);
    note_accuracy(c, r.accuracy, taken_s);
    const EvalPoint point{taken_s, r.accuracy, at.updates, at.samples, loss_between(c.last_point, at)};
    c.last_point = at;
    if (c.setup.on_eval) c.setup.on_eval(point);
    c.evaluating = false;
    maybe_evaluate(self);
  });
}

}  // namespace

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.plan = std::move(st.setup.plan);
  if (!st.setup.model) {
    fail(self, Status::Internal("coordinator: started without its model"));
    return {};
  }
  st.model.emplace(std::move(*st.setup.model));
  st.setup.model.reset();
  if (st.plan.shares_parameters) {
    auto params = st.model->params();
    st.shared = std::make_shared<SharedParameters>(std::vector<float>(params.begin(), params.end()),
                                                   st.setup.config.workers);
  }
  if (!st.setup.config.resume.empty() && !resume(self)) return {};
  if (!start_shards(self)) return {};
  if (st.resumed) announce_resume(self);
  if (!start_workers(self)) return {};
  for (auto* group : {&st.shards, &st.workers})
    for (auto& a : *group) self->monitor(a);

  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });

  if (st.plan.calibrate_weights) {
    calibrate(self, 0, std::make_shared<std::vector<double>>());
  } else {
    start_training(self);
  }

  return {
      [self](EpochReport& r) { take_report(self, r); },
      [self](failed_atom, std::int32_t code, const std::string& what) { fail_with(self, code, what); },
      [self](cancel_atom) { fail(self, Status::Cancelled("the job was cancelled")); },
      [self](WorkerProgress& p) {
        auto& s = self->state;
        if (p.worker >= s.seen.size() || s.seen[p.worker].lost) return;
        auto& seen = s.seen[p.worker];
        // Cumulative counts: a late one must not move them back.
        if (p.samples < seen.latest.samples) return;
        seen.latest = p;
        seen.at = SteadyClock::now();
      },
      [self](live_atom) { live_tick(self); },
      [self](rejoin_atom, std::uint32_t w) { rejoin_worker(self, w); },
      // A supervisor saw worker w's process end: no heartbeat wait.
      [self](lost_atom, std::uint32_t w, const std::string& why) {
        auto& s = self->state;
        if (s.done || w >= s.workers.size() || w >= s.seen.size() || s.seen[w].lost || s.seen[w].finished) return;
        self->demonitor(s.workers[w]);
        self->send_exit(s.workers[w], caf::exit_reason::kill);
        lose_worker(self, w, why);
      },
      [self](restarted_atom, std::uint32_t shard) { shard_restarted(self, shard); },
      [self](eval_atom) { evaluate_now(self); },
  };
}

}  // namespace asgd
