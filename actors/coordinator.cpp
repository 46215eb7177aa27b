#include "actors/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"

namespace asgd {

namespace {

using Self = caf::stateful_actor<CoordinatorState>*;
using SteadyClock = std::chrono::steady_clock;

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

caf::timespan rpc_timeout(const JobConfig& c) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(c.rpc_timeout_s));
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
            [self, remaining, then, i](ParamsReply& reply) {
              auto& s = self->state;
              const KeyRange& r = s.ranges[i];
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

JobSummary make_summary(const CoordinatorState& c, const EvalResult& test, const std::vector<ShardStats>& stats) {
  const JobConfig& cfg = c.setup.config;
  auto policy = make_policy({cfg.policy, cfg.fetch_every, cfg.push_every, std::nullopt});
  JobSummary sum;
  sum.policy = cfg.policy;
  sum.staleness = policy ? (*policy)->staleness_bound() : std::nullopt;
  sum.workers = cfg.workers;
  sum.shards = cfg.shards;
  sum.device = cfg.device;
  sum.model = cfg.model;
  sum.dataset = cfg.dataset;
  sum.epochs = cfg.epochs;
  sum.train_s = c.train_s;
  std::uint64_t samples = 0;
  for (const auto& w : c.worker_totals) samples += w.samples;
  sum.samples_per_s = c.train_s > 0 ? static_cast<double>(samples) / c.train_s : 0.0;
  sum.final_test_accuracy = test.accuracy;
  sum.time_to_target_s = c.time_to_target_s;
  sum.updates_applied = c.updates;
  const StalenessSummary stale = summarize_staleness(stats);
  sum.staleness_mean = stale.mean;
  sum.staleness_p99 = stale.p99;
  sum.staleness_max = stale.max;
  return sum;
}

// After the last epoch: test accuracy, shard statistics, the outcome, stop.
void finish(Self self) {
  auto& st = self->state;
  const auto& test = st.setup.data->test;
  const EvalResult result = st.model->evaluate(test.pixels, test.labels);
  auto stats = std::make_shared<std::vector<ShardStats>>();
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    self->request(st.shards[i], rpc_timeout(st.setup.config), stats_atom::value)
        .then(
            [self, stats, result](ShardStats& s) {
              stats->push_back(std::move(s));
              auto& c = self->state;
              if (stats->size() < c.shards.size() || c.done) return;
              for (const auto& w : c.worker_totals)
                spdlog::info("worker {}: {} samples, compute {:.2f} s, shard round trips {:.2f} s, waiting for data "
                             "{:.2f} s, {} batches dropped (NaN/Inf loss)",
                             w.worker, w.samples, w.compute_s, w.comm_s, w.data_wait_s, w.dropped_batches);
              for (const auto& s2 : *stats)
                if (s2.rejected > 0) spdlog::warn("shard {} rejected {} malformed pushes", s2.shard, s2.rejected);
              c.done = true;
              c.setup.outcome->set_value(make_summary(c, result, *stats));
              shut_down(self);
            },
            [self, i](caf::error& err) {
              fail(self, Status::Timeout("coordinator: no statistics from shard " + std::to_string(i) + ": " +
                                         self->system().render(err)));
            });
  }
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
    const auto& val = s.setup.data->validation;
    const EvalResult r = s.model->evaluate(val.pixels, val.labels);
    EpochMetrics m;
    m.epoch = static_cast<std::uint32_t>(e + 1);
    m.wall_s = agg.end_s;
    const std::uint64_t loss_samples = agg.sum.samples - agg.sum.dropped_samples;
    m.train_loss = loss_samples ? agg.sum.loss_sum / static_cast<double>(loss_samples) : 0.0;
    if (agg.sum.dropped_batches > 0)
      spdlog::warn("epoch {}: dropped {} batch gradients whose loss was NaN or infinite", e + 1, agg.sum.dropped_batches);
    m.val_accuracy = r.accuracy;
    m.samples_per_s = agg.duration_s > 0 ? static_cast<double>(agg.sum.samples) / agg.duration_s : 0.0;
    s.updates += agg.sum.updates;
    m.updates = s.updates;
    const auto& target = s.setup.config.target_accuracy;
    if (target && !s.time_to_target_s && r.accuracy >= *target) s.time_to_target_s = m.wall_s;
    if (s.setup.on_epoch) s.setup.on_epoch(m);
    s.epochs.erase(e);
    s.evaluating = false;
    if (m.epoch == s.setup.config.epochs) {
      finish(self);
    } else {
      maybe_evaluate(self);
    }
  });
}

}  // namespace

std::uint64_t planned_pushes(const JobConfig& cfg, std::size_t train_count) {
  std::uint64_t total = 0;
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    const std::uint64_t samples = data::partition_for(train_count, w, cfg.workers).size();
    const std::uint64_t steps = cfg.epochs * ((samples + cfg.batch - 1) / cfg.batch);
    total += steps / cfg.push_every;  // a worker pushes after every push_every-th step
  }
  return total;
}

StalenessSummary summarize_staleness(const std::vector<ShardStats>& stats) {
  std::vector<std::uint64_t> merged;
  for (const auto& s : stats) {
    if (merged.size() < s.staleness_histogram.size()) merged.resize(s.staleness_histogram.size(), 0);
    for (std::size_t i = 0; i < s.staleness_histogram.size(); ++i) merged[i] += s.staleness_histogram[i];
  }
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

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  const JobConfig& cfg = st.setup.config;
  const auto& train = st.setup.data->train;
  const Shape sample_shape = {train.channels, train.rows, train.cols};

  auto model = Model::build(cfg.model, sample_shape, st.setup.data->num_classes);
  if (!model) {
    fail(self, model.status());
    return {};
  }
  st.model.emplace(std::move(model).value());
  st.model->init_params(cfg.seed);
  if (cfg.shards > st.model->num_params()) {
    fail(self, Status::InvalidArgument("--shards " + std::to_string(cfg.shards) + " exceeds the model's " +
                                       std::to_string(st.model->num_params()) + " parameters"));
    return {};
  }
  st.ranges = partition_keys(st.model->num_params(), cfg.shards);

  const PolicyConfig policy{cfg.policy, cfg.fetch_every, cfg.push_every, std::nullopt};
  const OptimizerConfig optimizer{cfg.optimizer, static_cast<float>(cfg.lr), static_cast<float>(cfg.momentum),
                                  static_cast<float>(cfg.weight_decay)};
  LrSchedule schedule;
  LrSchedule::parse(cfg.lr_schedule, schedule.kind);  // validated by run_job
  schedule.total_steps = planned_pushes(cfg, train.count);
  for (std::uint32_t i = 0; i < cfg.shards; ++i) {
    const KeyRange r = st.ranges[i];
    auto params = st.model->params();
    auto core = ShardCore::make({i, r, std::vector<float>(params.begin() + static_cast<std::ptrdiff_t>(r.begin),
                                                         params.begin() + static_cast<std::ptrdiff_t>(r.end)),
                                 optimizer, policy, schedule});
    if (!core) {
      fail(self, core.status());
      return {};
    }
    auto shard = self->spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
    st.names[shard.address()] = "shard " + std::to_string(i);
    st.shards.push_back(shard);
  }
  st.worker_totals.resize(cfg.workers);
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    FeederSetup fs{st.setup.data, data::partition_for(train.count, w, cfg.workers), cfg.epochs, cfg.batch,
                   cfg.prefetch, cfg.seed, w + 1};
    auto feeder = self->spawn<caf::detached>(data_feeder, std::move(fs));
    st.names[feeder.address()] = "data feeder " + std::to_string(w);
    st.feeders.push_back(feeder);
    WorkerSetup ws{w, cfg.model, sample_shape, st.setup.data->num_classes, st.shards, st.ranges,
                   feeder, caf::actor_cast<caf::actor>(self), policy, rpc_timeout(cfg)};
    auto wk = self->spawn(worker, std::move(ws));
    st.names[wk.address()] = "worker " + std::to_string(w);
    st.workers.push_back(wk);
  }
  for (auto* group : {&st.shards, &st.feeders, &st.workers})
    for (auto& a : *group) self->monitor(a);

  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.done || dm.reason == caf::exit_reason::normal) return;
    auto it = s.names.find(dm.source);
    const std::string who = it != s.names.end() ? it->second : "an actor";
    fail(self, Status::Internal(who + " stopped unexpectedly: " + self->system().render(dm.reason)));
  });

  st.train_start = SteadyClock::now();
  st.last_epoch_end = st.train_start;
  for (auto& w : st.workers) self->send(w, start_atom::value);

  return {
      [self](EpochReport& r) {
        auto& s = self->state;
        auto& total = s.worker_totals.at(r.worker);
        total.worker = r.worker;
        total.samples += r.samples;
        total.compute_s += r.compute_s;
        total.comm_s += r.comm_s;
        total.data_wait_s += r.data_wait_s;
        auto& agg = s.epochs[r.epoch];
        ++agg.reports;
        agg.sum.samples += r.samples;
        agg.sum.batches += r.batches;
        agg.sum.loss_sum += r.loss_sum;
        agg.sum.dropped_batches += r.dropped_batches;
        agg.sum.dropped_samples += r.dropped_samples;
        total.dropped_batches += r.dropped_batches;
        agg.sum.updates += r.updates;
        if (agg.reports == s.setup.config.workers) {
          const auto now = SteadyClock::now();
          agg.end_s = seconds_between(s.train_start, now);
          agg.duration_s = seconds_between(s.last_epoch_end, now);
          s.last_epoch_end = now;
          if (r.epoch + 1 == s.setup.config.epochs) s.train_s = agg.end_s;
          s.to_evaluate.push_back(r.epoch);
          maybe_evaluate(self);
        }
      },
      [self](failed_atom, std::int32_t code, const std::string& what) {
        switch (static_cast<StatusCode>(code)) {
          case StatusCode::diverged: fail(self, Status::Diverged(what)); break;
          case StatusCode::timeout: fail(self, Status::Timeout(what)); break;
          default: fail(self, Status::Internal(what)); break;
        }
      },
      [self](cancel_atom) { fail(self, Status::Cancelled("the job was cancelled")); },
  };
}

}  // namespace asgd
