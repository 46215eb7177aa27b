#include "actors/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"
#include "runtime/checkpoint.hpp"

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
            [self, remaining, then, i](ShardReply& reply) {
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

JobSummary make_summary(const CoordinatorState& c, const EvalResult& test, const std::vector<std::uint64_t>& histogram) {
  const JobConfig& cfg = c.setup.config;
  auto policy = make_policy(policy_config(cfg));
  JobSummary sum;
  sum.policy = policy ? (*policy)->name() : cfg.policy;
  sum.staleness = policy ? (*policy)->staleness_bound() : std::nullopt;
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
  for (const auto& share : c.shares) sum.worker_batch.push_back(share.batch);
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
                for (const auto& s2 : *stats) {
                  malformed += s2.malformed_frames;
                  if (s2.malformed_frames > 0)
                    spdlog::warn("shard {}'s process dropped {} malformed frames", s2.shard, s2.malformed_frames);
                  if (s2.rejected > 0) spdlog::warn("shard {} rejected {} malformed pushes", s2.shard, s2.rejected);
                  if (s2.updates_discarded > 0)
                    spdlog::info("shard {} discarded {} late pushes", s2.shard, s2.updates_discarded);
                }
                c2.done = true;
                JobSummary summary = make_summary(c2, result, histogram);
                summary.malformed_frames = malformed;
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

OptimizerConfig optimizer_config(const JobConfig& c) {
  return {c.optimizer, static_cast<float>(c.lr), static_cast<float>(c.momentum), static_cast<float>(c.weight_decay)};
}

LrSchedule lr_schedule(const JobConfig& c, std::uint64_t total_steps) {
  LrSchedule s;
  LrSchedule::parse(c.lr_schedule, s.kind);
  s.total_steps = total_steps;
  return s;
}

PolicyConfig policy_config(const JobConfig& c) {
  PolicyConfig p;
  p.name = c.policy;
  p.fetch_every = c.fetch_every;
  p.push_every = c.push_every;
  p.staleness = c.staleness;
  p.backup_workers = c.backup_workers;
  p.local_steps = c.local_steps;
  return p;
}

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

bool parse_number(const std::string& text, double& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && ec == std::errc() && ptr == end && std::isfinite(out);
}

}  // namespace

Result<std::vector<double>> parse_worker_weights(const std::string& text, std::uint32_t workers) {
  if (text.empty()) return std::vector<double>(workers, 1.0);
  const auto parts = split(text, ',');
  if (parts.size() != workers)
    return Status::InvalidArgument("--worker-weights " + text + ": expected " + std::to_string(workers) +
                                   " comma-separated weights (one per worker) or 'auto', got " +
                                   std::to_string(parts.size()));
  std::vector<double> weights;
  for (const auto& p : parts) {
    double w = 0;
    if (!parse_number(p, w) || !(w > 0))
      return Status::InvalidArgument("--worker-weights " + text + ": '" + p + "' is not a positive number");
    weights.push_back(w);
  }
  return weights;
}

Result<std::vector<double>> parse_stragglers(const std::string& text, std::uint32_t workers) {
  std::vector<double> factors(workers, 1.0);
  if (text.empty()) return factors;
  for (const auto& item : split(text, ',')) {
    const auto colon = item.find(':');
    std::uint32_t w = 0;
    double f = 0;
    const std::string index = item.substr(0, colon == std::string::npos ? 0 : colon);
    auto [ptr, ec] = std::from_chars(index.data(), index.data() + index.size(), w);
    if (colon == std::string::npos || index.empty() || ec != std::errc() || ptr != index.data() + index.size() ||
        !parse_number(item.substr(colon + 1), f))
      return Status::InvalidArgument("--straggler " + text + ": '" + item + "' is not WORKER:FACTOR");
    if (w >= workers)
      return Status::InvalidArgument("--straggler " + text + ": there is no worker " + std::to_string(w) + " of " +
                                     std::to_string(workers) + " (workers count from 0)");
    if (!(f >= 1.0)) return Status::InvalidArgument("--straggler " + text + ": the factor must be >= 1");
    factors[w] = f;
  }
  return factors;
}

std::vector<WorkerShare> assign_shares(std::size_t n, std::uint32_t batch, const std::vector<double>& weights) {
  const std::size_t count = weights.size();
  std::vector<WorkerShare> shares(count);
  const bool equal = std::all_of(weights.begin(), weights.end(), [&](double w) { return w == weights.front(); });
  double total = 0;
  for (double w : weights) total += w;
  double cumulative = 0;
  std::size_t begin = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (equal) {
      shares[i] = {data::partition_for(n, i, count), batch};
      continue;
    }
    cumulative += weights[i];
    // Boundaries from the cumulative weight: sizes add up to n exactly.
    const std::size_t end = i + 1 == count ? n : static_cast<std::size_t>(std::llround(cumulative / total * static_cast<double>(n)));
    shares[i].partition = {begin, std::max(end, begin)};
    begin = shares[i].partition.end;
    const double b = static_cast<double>(batch) * static_cast<double>(count) * weights[i] / total;
    shares[i].batch = static_cast<std::uint32_t>(std::max(1.0, std::round(b)));
  }
  return shares;
}

std::uint64_t planned_clocks(const std::vector<WorkerShare>& shares, std::uint32_t epochs) {
  std::uint64_t most = 0;
  for (const auto& s : shares)
    most = std::max<std::uint64_t>(most, epochs * ((s.partition.size() + s.batch - 1) / s.batch));
  return most;
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

// Spawns a data feeder per worker for its share and starts every worker.
void start_training(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  if (st.setup.remote) {  // each worker process feeds its own worker
    st.train_start = SteadyClock::now();
    st.last_epoch_end = st.train_start;
    for (std::uint32_t w = 0; w < cfg.workers; ++w)
      st.setup.remote->start_worker(w, st.shares[w], st.stragglers[w], st.schedule_steps);
    if (cfg.eval_every_s > 0) self->delayed_send(self, eval_period(cfg), eval_atom::value);
    return;
  }
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    FeederSetup fs{st.setup.data, st.shares[w].partition, cfg.epochs, st.shares[w].batch, cfg.prefetch, cfg.seed, w + 1};
    auto feeder = self->spawn<caf::detached>(data_feeder, std::move(fs));
    st.names[feeder.address()] = "data feeder " + std::to_string(w);
    st.feeders.push_back(feeder);
    self->monitor(feeder);
  }
  st.train_start = SteadyClock::now();
  st.last_epoch_end = st.train_start;
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
    st.shares = assign_shares(st.setup.data->train.count, st.setup.config.batch, *rates);
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

}  // namespace

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  const JobConfig& cfg = st.setup.config;
  const auto& train = st.setup.data->train;
  const Shape sample_shape = {train.channels, train.rows, train.cols};

  auto model = Model::build(cfg.model, cfg.model_spec.get(), sample_shape, st.setup.data->num_classes);
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

  const PolicyConfig policy = policy_config(cfg);
  auto made = make_policy(policy);
  const bool auto_weights = cfg.worker_weights == "auto";
  auto weights = parse_worker_weights(auto_weights ? "" : cfg.worker_weights, cfg.workers);
  auto stragglers = parse_stragglers(cfg.straggler, cfg.workers);
  for (const Status* s : {&made.status(), &weights.status(), &stragglers.status()}) {
    if (!s->ok()) {
      fail(self, *s);
      return {};
    }
  }
  st.stragglers = std::move(stragglers).value();
  st.shares = assign_shares(train.count, cfg.batch, *weights);
  if ((*made)->shares_parameters()) {
    auto params = st.model->params();
    st.shared = std::make_shared<SharedParameters>(std::vector<float>(params.begin(), params.end()), cfg.workers);
  }

  const OptimizerConfig optimizer = optimizer_config(cfg);
  // By clock: equal shares give the length; weights aim at the same number
  // of steps per epoch, so auto weights leave it (within a step) unchanged.
  const LrSchedule schedule = lr_schedule(cfg, planned_clocks(st.shares, cfg.epochs));
  st.schedule_steps = schedule.total_steps;
  for (std::uint32_t i = 0; i < cfg.shards; ++i) {
    const KeyRange r = st.ranges[i];
    ShardSetup ss;
    ss.index = i;
    ss.range = r;
    if (!st.shared) {
      auto params = st.model->params();
      ss.initial.assign(params.begin() + static_cast<std::ptrdiff_t>(r.begin),
                        params.begin() + static_cast<std::ptrdiff_t>(r.end));
    }
    ss.optimizer = optimizer;
    ss.policy = policy;
    ss.schedule = schedule;
    ss.workers = cfg.workers;
    ss.staleness_aware_lr = cfg.staleness_aware_lr;
    ss.shared = st.shared;
    auto core = ShardCore::make(ss);  // checks the setup, remote or not
    if (!core) {
      fail(self, core.status());
      return {};
    }
    caf::actor shard;
    if (st.setup.remote) {
      auto placed = st.setup.remote->place_shard(self, ss);
      if (!placed) {
        fail(self, placed.status());
        return {};
      }
      shard = *placed;
    } else {
      shard = self->spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
    }
    st.names[shard.address()] = "shard " + std::to_string(i);
    st.shards.push_back(shard);
  }
  st.worker_totals.resize(cfg.workers);
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    WorkerSetup ws;
    ws.id = w;
    ws.model = cfg.model;
    ws.model_spec = cfg.model_spec;
    ws.device = cfg.device;
  ws.device = cfg.device;
    ws.sample_shape = sample_shape;
    ws.classes = st.setup.data->num_classes;
    ws.shards = st.shards;
    ws.ranges = st.ranges;
    ws.coordinator = caf::actor_cast<caf::actor>(self);
    ws.policy = policy;
    ws.rpc_timeout = rpc_timeout(cfg);
    ws.optimizer = optimizer;
    ws.schedule = schedule;
    ws.straggler_factor = st.stragglers[w];
    ws.shared = st.shared;
    caf::actor wk;
    if (st.setup.remote) {
      auto placed = st.setup.remote->place_worker(self, w);
      if (!placed) {
        fail(self, placed.status());
        return {};
      }
      wk = *placed;
    } else {
      wk = self->spawn(worker, std::move(ws));
    }
    st.names[wk.address()] = "worker " + std::to_string(w);
    st.workers.push_back(wk);
  }
  for (auto* group : {&st.shards, &st.workers})
    for (auto& a : *group) self->monitor(a);

  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.done) return;
    if (dm.reason == caf::exit_reason::normal) {
      if (std::find(s.workers.begin(), s.workers.end(), dm.source) != s.workers.end()) {
        ++s.workers_stopped;
        finish(self);
      }
      return;
    }
    auto it = s.names.find(dm.source);
    const std::string who = it != s.names.end() ? it->second : "an actor";
    fail(self, Status::Internal(who + " stopped unexpectedly: " + self->system().render(dm.reason)));
  });

  if (auto_weights) {
    calibrate(self, 0, std::make_shared<std::vector<double>>());
  } else {
    start_training(self);
  }

  return {
      [self](EpochReport& r) {
        auto& s = self->state;
        if (r.worker >= s.worker_totals.size()) return;
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
        agg.sum.samples += r.samples;
        agg.sum.batches += r.batches;
        agg.loss_by_worker.resize(s.setup.config.workers, 0.0);
        agg.loss_by_worker[r.worker] += r.loss_sum;
        agg.sum.dropped_batches += r.dropped_batches;
        agg.sum.dropped_samples += r.dropped_samples;
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
          case StatusCode::invalid_argument: fail(self, Status::InvalidArgument(what)); break;
          default: fail(self, Status::Internal(what)); break;
        }
      },
      [self](cancel_atom) { fail(self, Status::Cancelled("the job was cancelled")); },
      [self](eval_atom) {
        auto& s = self->state;
        if (s.done || s.finishing || s.last_epoch_evaluated) return;
        self->delayed_send(self, eval_period(s.setup.config), eval_atom::value);
        if (s.evaluating) return;  // an epoch's evaluation is under way: skip this one
        s.evaluating = true;
        const double taken_s = seconds_between(s.train_start, SteadyClock::now());
        snapshot(self, [self, taken_s] {
          auto& c = self->state;
          const EvalResult r = evaluate_on(c, c.setup.data->validation);
          note_accuracy(c, r.accuracy, taken_s);
          if (c.setup.on_eval) c.setup.on_eval({taken_s, r.accuracy});
          c.evaluating = false;
          maybe_evaluate(self);
        });
      },
  };
}

}  // namespace asgd
