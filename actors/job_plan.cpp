#include "actors/job_plan.hpp"

#include <algorithm>
#include <cmath>

#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"
#include "base/flag_text.hpp"
#include "compute/device.hpp"

namespace asgd {

namespace {

// The schedule runs by clock, `total_steps` of them over the job: the
// warm-up's epochs are a share of it each.
std::uint64_t warmup_steps(double warmup_epochs, std::uint64_t total_steps, std::uint32_t epochs) {
  return static_cast<std::uint64_t>(std::llround(warmup_epochs * static_cast<double>(total_steps) /
                                                 static_cast<double>(std::max<std::uint32_t>(epochs, 1))));
}

}  // namespace

PolicyConfig policy_config(const JobConfig& c) {
  PolicyConfig p;
  p.name = c.policy;
  // What the worker count changes, then what was given.
  p.options = training_settings(c).policy_options;
  for (const auto& [knob, value] : c.policy_options) p.options[knob] = value;
  return p;
}

OptimizerConfig optimizer_config(const JobConfig& c, Placement where) {
  const TrainingSettings t = training_settings(c, where);
  return {c.optimizer, static_cast<float>(t.lr), static_cast<float>(t.momentum), static_cast<float>(c.weight_decay)};
}

LrSchedule lr_schedule(const JobConfig& c, std::uint64_t total_steps) {
  LrSchedule s;
  LrSchedule::parse(c.lr_schedule, s.kind);
  s.total_steps = total_steps;
  s.warmup_steps = warmup_steps(training_settings(c).lr_warmup_epochs, total_steps, c.epochs);
  return s;
}

Result<std::vector<std::string>> parse_worker_devices(const std::string& text, std::uint32_t workers) {
  if (text.empty()) return Status::InvalidArgument("--device: an empty value (give cpu, cuda or cuda:K)");
  const std::vector<std::string> items = split(text, ',');
  if (items.size() != 1 && items.size() != workers)
    return Status::InvalidArgument("--device " + text + ": " + std::to_string(items.size()) + " devices for " +
                                   std::to_string(workers) + " workers: give one for all of them, or one per worker");
  for (std::size_t w = 0; w < items.size(); ++w)
    if (auto d = Device::parse(items[w]); !d)
      return Status::InvalidArgument("--device " + text + ": " +
                                     (items.size() == 1 ? std::string() : "worker " + std::to_string(w) + "'s ") +
                                     d.status().message());
  return items.size() == 1 ? std::vector<std::string>(workers, items.front()) : items;
}

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
    const std::size_t end =
        i + 1 == count ? n : static_cast<std::size_t>(std::llround(cumulative / total * static_cast<double>(n)));
    shares[i].partition = {begin, std::max(end, begin)};
    begin = shares[i].partition.end;
    const double b = static_cast<double>(batch) * static_cast<double>(count) * weights[i] / total;
    shares[i].batch = static_cast<std::uint32_t>(std::max(1.0, std::round(b)));
  }
  return shares;
}

std::uint64_t steps_per_epoch(const WorkerShare& share) {
  return (share.partition.size() + share.batch - 1) / std::max<std::uint32_t>(share.batch, 1);
}

std::uint64_t planned_clocks(const std::vector<WorkerShare>& shares, std::uint32_t epochs) {
  std::uint64_t most = 0;
  for (const auto& s : shares) most = std::max<std::uint64_t>(most, epochs * steps_per_epoch(s));
  return most;
}

unsigned compute_threads(const JobConfig& c, unsigned cores, unsigned sharers) {
  return c.threads > 0 ? c.threads : std::max(1u, std::max(1u, cores) / std::max(1u, sharers));
}

Result<JobPlan> plan_settings(const JobConfig& c, Placement where, unsigned cores) {
  JobPlan p;
  p.model = c.model;
  p.model_spec = c.model_spec;
  p.device = c.device;
  p.placement = where;
  p.policy = policy_config(c);
  auto made = make_policy(p.policy);
  if (!made) return made.status();
  p.policy_name = (*made)->name();
  p.staleness_bound = (*made)->staleness_bound();
  p.shares_parameters = (*made)->shares_parameters();
  p.exchange = (*made)->exchange();
  p.training = training_settings(c, where);
  p.optimizer = optimizer_config(c, where);
  LrSchedule::parse(c.lr_schedule, p.schedule.kind);
  p.epochs = c.epochs;
  p.batch = p.training.batch;
  p.calibrate_weights = c.worker_weights == "auto";
  p.worker_count = c.workers;
  p.compute_threads = compute_threads(c, cores, c.workers);
  // Workers compute inside their handlers: one scheduler thread each, up
  // to the cores (run_job says why no more).
  p.actor_threads = std::clamp(c.workers, 1u, std::max(1u, cores));
  p.rpc_timeout_s = c.rpc_timeout_s;
  p.hold_warning_s = c.rpc_timeout_s / 2;
  if (!c.checkpoint_dir.empty() && c.checkpoint_every_s > 0) p.checkpoint_every_s = c.checkpoint_every_s;
  p.checkpoint_dir = p.checkpoint_every_s > 0 ? c.checkpoint_dir : "";
  p.prefetch = c.prefetch;
  auto augment = data::parse_augment(c.augment, c.dataset);
  if (!augment) return augment.status();
  p.augment = *augment;
  p.seed = c.seed;
  plan_clocks(p, 0);
  return p;
}

Result<JobPlan> plan_job(const JobConfig& c, const JobFacts& f) {
  if (c.workers > f.train_count)
    return Status::InvalidArgument("--workers " + std::to_string(c.workers) + ": more workers than the " +
                                   std::to_string(f.train_count) + " training samples");
  if (c.shards > f.num_params)
    return Status::InvalidArgument("--shards " + std::to_string(c.shards) + " exceeds the model's " +
                                   std::to_string(f.num_params) + " parameters");
  auto settings = plan_settings(c, f.placement, f.cores);
  if (!settings) return settings.status();
  JobPlan p = std::move(settings).value();
  auto weights = parse_worker_weights(p.calibrate_weights ? "" : c.worker_weights, c.workers);
  if (!weights) return weights.status();
  auto stragglers = parse_stragglers(c.straggler, c.workers, c.seed);
  if (!stragglers) return stragglers.status();
  if (!c.resume.empty() && p.calibrate_weights)
    return Status::InvalidArgument("--resume: not available with --worker-weights auto (give the weights)");
  p.sample_shape = f.sample_shape;
  p.classes = f.classes;
  p.num_params = f.num_params;
  p.train_count = f.train_count;
  p.train_fingerprint = f.train_fingerprint;
  p.ranges = partition_keys(f.num_params, c.shards);
  for (std::uint32_t i = 0; i < c.shards; ++i) p.shards.push_back(plan_shard(p, i, p.ranges[i]));
  const std::vector<WorkerShare> shares = assign_shares(f.train_count, p.batch, *weights);
  // A share smaller than its batch trains one short step an epoch: a job
  // that looks fine and learns nothing useful.
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    const std::size_t share = shares[w].partition.size();
    if (share >= shares[w].batch) continue;
    const bool weighted = !c.worker_weights.empty() && !p.calibrate_weights;
    const std::string what = weighted ? "--worker-weights " + c.worker_weights
                                      : "--workers " + std::to_string(c.workers) + " with --batch " +
                                            std::to_string(p.batch);
    const std::size_t steps = std::max<std::size_t>(f.train_count / c.workers / p.batch, 1);
    const std::string advice = weighted ? "give each worker a weight within a factor of about " +
                                              std::to_string(steps) + " of the others'"
                                        : "use fewer workers or a --batch of at most " +
                                              std::to_string(f.train_count / c.workers);
    return Status::InvalidArgument(what + ": worker " + std::to_string(w) + "'s share of the " +
                                   std::to_string(f.train_count) + " training samples is " + std::to_string(share) +
                                   ", less than its batch of " + std::to_string(shares[w].batch) +
                                   ", so it would take one short step an epoch (or none); " + advice);
  }
  auto devices = parse_worker_devices(c.device, c.workers);
  if (!devices) return devices.status();
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    p.workers.push_back(plan_worker(w, shares[w], (*stragglers)[w]));
    p.workers.back().device = (*devices)[w];
  }
  // By clock: equal shares give the length; weights aim at the same number
  // of steps per epoch, so auto weights leave it (within a step) unchanged.
  plan_clocks(p, planned_clocks(shares, c.epochs));
  return p;
}

void plan_clocks(JobPlan& p, std::uint64_t clocks) {
  p.planned_clocks = clocks;
  p.schedule.total_steps = clocks;
  p.schedule.warmup_steps = warmup_steps(p.training.lr_warmup_epochs, clocks, p.epochs);
}

ShardPlan plan_shard(const JobPlan& p, std::uint32_t index, KeyRange range) {
  ShardPlan s;
  s.index = index;
  s.range = range;
  if (!p.checkpoint_dir.empty()) s.checkpoint_path = shard_checkpoint_path(p.checkpoint_dir, index);
  return s;
}

WorkerPlan plan_worker(std::uint32_t id, const WorkerShare& share, const Straggler& straggler,
                       std::uint32_t first_epoch) {
  WorkerPlan w;
  w.id = id;
  w.share = share;
  w.steps_per_epoch = steps_per_epoch(share);
  w.straggler = straggler;
  w.first_clock = Clock{first_epoch} * w.steps_per_epoch;
  return w;
}

std::vector<double> balanced_batches(const std::vector<StepCost>& costs, double total_batch) {
  const std::size_t n = costs.size();
  // A measurement of zero (or noise below it) counts as next to nothing.
  std::vector<double> fixed(n), per_sample(n);
  for (std::size_t w = 0; w < n; ++w) {
    fixed[w] = std::max(costs[w].fixed_s, 0.0);
    per_sample[w] = std::max(costs[w].per_sample_s, 1e-12);
  }
  std::vector<double> batch(n, 1.0);
  std::vector<bool> floor(n, false);  // held at one sample: too slow to keep up even so
  // Solve for T over the workers not held at the floor; a worker whose
  // batch comes out under one sample is held there, and T solved again.
  for (std::size_t round = 0; round <= n; ++round) {
    double free_batch = total_batch, sum_inv = 0.0, sum_fixed = 0.0;
    for (std::size_t w = 0; w < n; ++w) {
      if (floor[w]) {
        free_batch -= 1.0;
        continue;
      }
      sum_inv += 1.0 / per_sample[w];
      sum_fixed += fixed[w] / per_sample[w];
    }
    if (sum_inv == 0.0) break;
    const double t = (free_batch + sum_fixed) / sum_inv;
    bool changed = false;
    for (std::size_t w = 0; w < n; ++w) {
      if (floor[w]) continue;
      batch[w] = (t - fixed[w]) / per_sample[w];
      if (batch[w] < 1.0) {
        floor[w] = changed = true;
        batch[w] = 1.0;
      }
    }
    if (!changed) break;
  }
  return batch;
}

void replan_shares(JobPlan& p, const std::vector<double>& weights) {
  const std::vector<WorkerShare> shares = assign_shares(p.train_count, p.batch, weights);
  for (std::size_t w = 0; w < p.workers.size() && w < shares.size(); ++w) {
    p.workers[w].share = shares[w];
    p.workers[w].steps_per_epoch = steps_per_epoch(shares[w]);
  }
}

ShardSetup shard_setup(const JobPlan& p, const ShardPlan& shard, std::vector<float> initial) {
  ShardSetup s;
  s.index = shard.index;
  s.range = shard.range;
  s.initial = std::move(initial);
  s.optimizer = p.optimizer;
  s.policy = p.policy;
  s.schedule = p.schedule;
  s.workers = p.worker_count;
  s.staleness_aware_lr = p.training.staleness_aware_lr;
  s.hold_warning_s = p.hold_warning_s;
  s.train_fingerprint = p.train_fingerprint;
  if (!shard.checkpoint_path.empty()) {
    s.checkpoint_path = shard.checkpoint_path;
    s.checkpoint_every_s = p.checkpoint_every_s;
  }
  return s;
}

WorkerSetup worker_setup(const JobPlan& p, const WorkerPlan& worker) {
  WorkerSetup s;
  s.id = worker.id;
  s.model = p.model;
  s.model_spec = p.model_spec;
  s.device = worker.device;
  s.sample_shape = p.sample_shape;
  s.classes = p.classes;
  s.ranges = p.ranges;
  s.policy = p.policy;
  s.rpc_timeout = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(p.rpc_timeout_s));
  s.optimizer = p.optimizer;
  s.schedule = p.schedule;
  s.straggler = worker.straggler;
  s.first_clock = worker.first_clock;
  return s;
}

FeederSetup feeder_setup(const JobPlan& p, const WorkerPlan& worker, std::shared_ptr<const data::DatasetSplits> data,
                         std::uint32_t first_epoch) {
  return FeederSetup{std::move(data),  worker.share.partition, p.epochs,  worker.share.batch, p.prefetch, p.seed,
                     worker.id + 1,    first_epoch,            p.augment};
}

}  // namespace asgd
