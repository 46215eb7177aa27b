// CoordinatorCore: the coordinator's parts tied together, and how the job
// ends (coordinator_core.hpp).
#include "actors/coordinator_core.hpp"

#include <utility>

#include "base/log.hpp"
#include "policies/registry.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace asgd {

namespace act = coordinator_action;

CoordinatorCore::CoordinatorCore(JobConfig config, JobPlan plan, std::string dataset)
    : config_(std::move(config)),
      plan_(std::move(plan)),
      dataset_(std::move(dataset)),
      epochs_(config_.workers, config_.epochs),
      evals_(config_.eval_every_s) {}

double CoordinatorCore::training_seconds(Instant now) const {
  return train_start_ == Instant{} ? 0.0 : std::chrono::duration<double>(now - train_start_).count();
}

void CoordinatorCore::resume(ResumePlan r) {
  resumed_ = std::move(r);
  epochs_.set_updates(resumed_->updates);
  for (WorkerPlan& w : plan_.workers) w.first_clock = resumed_->restart[w.id];
}

void CoordinatorCore::calibrated(const std::vector<StepCost>& costs) {
  const double total = static_cast<double>(plan_.batch) * static_cast<double>(costs.size());
  const std::vector<double> batches = balanced_batches(costs, total);
  for (std::size_t w = 0; w < costs.size(); ++w)
    logger().info("worker {}: a step of B samples takes {:.3g} ms + B x {:.3g} us in calibration ({:.0f} samples/s "
                  "at batch {}); batch {:.0f}",
                  w, costs[w].fixed_s * 1e3, costs[w].per_sample_s * 1e6,
                  plan_.batch / costs[w].seconds_at(plan_.batch), plan_.batch, batches[w]);
  replan_shares(plan_, batches);
}

void CoordinatorCore::start_training(Instant now, Actions& out) {
  members_.start(config_.workers);
  // Workers whose processes ended before training began: lost now (the job
  // waited out --join-timeout for their heartbeats, then went on).
  for (const auto& [w, why] : std::exchange(gone_before_training_, {})) {
    out.push_back(act::Kill{w});
    lose(w, why + ", before training began", out);
  }
  const std::uint32_t first_epoch = resumed_ ? resumed_->first_epoch : 0;
  std::vector<std::uint64_t> per_epoch;
  for (const auto& w : plan_.workers) per_epoch.push_back(w.share.partition.size());
  live_.set_plan(std::move(per_epoch), first_epoch, config_.epochs);
  train_start_ = now;
  if (evals_.periodic()) {
    evals_.start(now);
    out.push_back(act::ArmEval{evals_.period()});
  }
}

// ---- reports and evaluations -------------------------------------------------

void CoordinatorCore::report(const EpochReport& r, Instant now, Actions& out) {
  if (members_.lost(r.worker)) return;  // declared dead: its word no longer counts
  members_.completed(r.worker, r.epoch);
  epochs_.report(r, training_seconds(now));
  complete_epochs(out);
}

// Queues, in order, every epoch that each worker still in the job has
// reported (a lost worker's missing reports are not waited for), and starts
// evaluating them.
void CoordinatorCore::complete_epochs(Actions& out) {
  for (std::uint64_t e : epochs_.complete(members_)) evals_.epoch_completed(e);
  maybe_evaluate(out);
}

void CoordinatorCore::maybe_evaluate(Actions& out) {
  if (done_ || stopped_) return;
  if (evals_.begin_epoch()) out.push_back(act::Evaluate{});
}

// Every --eval-every seconds: an evaluation point, unless an epoch's
// evaluation is under way. A tick before the point is due (a timer that
// fired early) waits for the rest.
void CoordinatorCore::eval_tick(Instant now, Actions& out) {
  if (done_ || finishing_ || last_epoch_evaluated_ || stopped_) return;
  if (!evals_.tick(now)) {
    out.push_back(act::ArmEval{evals_.due() - now});
    return;
  }
  out.push_back(act::ArmEval{evals_.period()});
  if (evals_.begin_point(members_.totals(training_seconds(now)))) out.push_back(act::Evaluate{});
}

void CoordinatorCore::evaluated(double accuracy, std::optional<std::uint64_t> applied, Instant now, Actions& out) {
  if (done_) return;
  if (const auto at = evals_.point()) {
    const bool reached = note_accuracy(accuracy, at->at_s);
    const EvalPoint point{at->at_s, accuracy, applied.value_or(at->updates), at->samples,
                          loss_between(last_point_, *at)};
    last_point_ = *at;
    out.push_back(act::PointDone{point});
    evals_.end();
    if (reached) stop_at_target(accuracy, at->at_s, out);
    maybe_evaluate(out);
    return;
  }
  const auto e = evals_.epoch();
  if (!e) return;
  EpochMetrics m = epochs_.evaluated(*e, accuracy);
  if (applied) m.updates = shards_applied_ = *applied;  // what the evaluated parameters hold
  warn_if_diverging(m);
  const bool reached = note_accuracy(accuracy, m.wall_s);
  last_point_ = members_.totals(training_seconds(now));
  out.push_back(act::EpochDone{m});
  evals_.end();
  if (reached && m.epoch < config_.epochs) stop_at_target(accuracy, m.wall_s, out);
  if (m.epoch == config_.epochs) {
    last_epoch_evaluated_ = true;
    maybe_finish(out);
  } else {
    maybe_evaluate(out);
  }
}

// True when this evaluation is the first to reach the target.
bool CoordinatorCore::note_accuracy(double accuracy, double at_s) {
  const auto& target = config_.target_accuracy;
  last_val_accuracy_ = accuracy;
  ++evaluations_;
  if (!target || time_to_target_s_ || accuracy < *target) return false;
  time_to_target_s_ = at_s;
  return true;
}

// --stop-at-target: the workers stop after their current steps; once every
// one has, the job finishes as after its last epoch.
void CoordinatorCore::stop_at_target(double accuracy, double at_s, Actions& out) {
  if (!config_.stop_at_target || stopped_ || done_ || finishing_) return;
  stopped_ = true;
  logger().info("validation accuracy {:.4f} reached the target {:g} at {:.2f} s of training: the workers stop "
                "(--stop-at-target)",
                accuracy, *config_.target_accuracy, at_s);
  out.push_back(act::StopTraining{});
  maybe_finish(out);
}

// ---- membership --------------------------------------------------------------

void CoordinatorCore::worker_finished(std::uint32_t w, Actions& out) {
  if (done_) return;
  members_.finish(w);
  maybe_finish(out);
}

void CoordinatorCore::worker_lost(std::uint32_t w, const std::string& why, Actions& out) {
  if (done_) return;
  lose(w, why, out);
}

void CoordinatorCore::worker_gone(std::uint32_t w, const std::string& why, Actions& out) {
  if (done_ || w >= config_.workers) return;
  if (!members_.started()) {  // placing or calibrating: lost once training begins
    gone_before_training_.emplace(w, why);
    return;
  }
  if (!members_.in_training(w)) return;
  out.push_back(act::Kill{w});
  lose(w, why, out);
}

// Worker `w` stopped abnormally: go on without it, unless none is left.
void CoordinatorCore::lose(std::uint32_t w, const std::string& why, Actions& out) {
  if (!members_.lose(w)) return;
  const std::uint32_t live = config_.workers - members_.lost_count();
  if (live == 0) {
    // Not asgd's fault (it said "internal error"): its processes are gone.
    fail(Status::Unavailable("every worker was lost; the last, worker " + std::to_string(w) + ": " + why), out);
    return;
  }
  // A supervisor (asgd cluster) may start a new process for it at once:
  // then "worker w rejoined" follows.
  logger().warn("worker {} is lost ({}): the job goes on with {} live worker(s) under policy {}; its data share "
               "is not trained further unless a new process takes its place",
               w, why, live, config_.policy);
  // The shards stop counting it: a barrier re-forms over the live workers
  // (under allreduce and gossip, the workers' ring).
  out.push_back(act::Leave{w});
  complete_epochs(out);
  maybe_finish(out);
}

// A new process registered for worker `w`, whose old one died: it trains
// w's share from the epoch after the furthest live worker's, so no barrier
// waits for it to catch up (a shard's clock for it jumps to that epoch's
// first step, and every policy counts a worker whose clock passed a step
// as done with it).
void CoordinatorCore::rejoin(std::uint32_t w, bool placeable, Actions& out) {
  auto refuse = [&](const std::string& why) { refuse_rejoin(w, why, out); };
  if (w >= config_.workers) return refuse("no such worker");
  if (!placeable || w >= members_.size())  // (it said "no such worker")
    return refuse("worker " + std::to_string(w) + "'s process ended while the job was being placed: the job goes "
                  "on without it");
  if (done_ || finishing_ || stopped_) return refuse("the job is ending");
  if (plan_.exchange != Exchange::none)
    return refuse("under policy " + config_.policy +
                  " the workers' ring goes on without it: a new process cannot join it mid-job");
  if (members_.finished(w)) return refuse("worker " + std::to_string(w) + " had finished its share");
  const std::uint64_t first = members_.furthest_epoch_besides(w) + 1;
  // (A worker that finished counts at its last epoch: with every other one
  // done, a new process was taken for the last epoch of a job that was
  // ending, when a slow worker was killed as the others finished.)
  if (first >= config_.epochs) return refuse("the others are in the last epoch: nothing is left for it to train");
  if (!members_.lost(w)) {
    // Its old process is dead (silent), though not yet past --heartbeat-timeout.
    out.push_back(act::Kill{w});
    lose(w, "a new process registered in its place", out);
    if (done_ || finishing_) return refuse("the job is ending");
  }
  out.push_back(act::Place{w, first});
}

void CoordinatorCore::refuse_rejoin(std::uint32_t w, const std::string& why, Actions& out) {
  logger().warn("a new process for worker {} is not taken: {}", w, why);
  out.push_back(act::Dismiss{w, why});
}

void CoordinatorCore::rejoined(std::uint32_t w, std::uint64_t first_epoch, Actions& out) {
  members_.rejoin(w, first_epoch);
  // Started once every shard has taken the join (rejoin_confirmed).
  out.push_back(act::Join{w, first_epoch * plan_.workers.at(w).steps_per_epoch, first_epoch});
}

void CoordinatorCore::rejoin_confirmed(std::uint32_t w, std::uint64_t first, Instant now, Actions& out) {
  if (done_) return;
  out.push_back(act::StartWorker{w, static_cast<std::uint32_t>(first)});
  const double at_s = training_seconds(now);
  logger().warn("worker {} rejoined at {:.1f} s: a new process trains its share from epoch {} of {} on", w, at_s,
               first + 1, config_.epochs);
  out.push_back(act::Record{{{"event", "worker_rejoined"}, {"worker", w}, {"epoch", first + 1}, {"train_s", at_s}}});
}

double CoordinatorCore::shard_restarted(Instant now) {
  ++shard_restarts_;
  return training_seconds(now);
}

// ---- how the job ends --------------------------------------------------------

// Once the last epoch is evaluated and every worker has stopped (so every
// last push has reached its shard).
void CoordinatorCore::maybe_finish(Actions& out) {
  if (done_ || finishing_ || !(last_epoch_evaluated_ || stopped_) || members_.stopped() < config_.workers) return;
  finishing_ = true;
  out.push_back(act::Finish{});
}

void CoordinatorCore::fail(Status status, Actions& out) {
  if (done_) return;
  done_ = true;
  // A stop asked for (Ctrl-C, cancel()) is not an error of the job's.
  if (status.code() == StatusCode::cancelled)
    logger().info("job stopped: {}", status.message());
  else
    logger().error("job failed: {}", status.message());
  out.push_back(act::Fail{std::move(status)});
}

// A worker, or the cluster's watch on a shard's process, says the job cannot
// go on: it fails with that status.
void CoordinatorCore::failed(StatusCode code, const std::string& what, Actions& out) {
  fail(Status::WithCode(code, code == StatusCode::diverged ? what + divergence_hint() : what), out);
}

// What to change when training diverged: the step it ran with, where it
// came from, and a smaller one to try.
std::string CoordinatorCore::divergence_hint() const {
  const JobConfig& c = config_;
  const TrainingSettings& t = plan_.training;
  std::string from = c.lr ? "--lr" : "the default";
  for (const auto& a : t.adjusted)
    if (a.size() > 3 && a.rfind("lr ", 0) == 0 && std::isdigit(static_cast<unsigned char>(a[3]))) from = "the default, " + a;
  const std::string momentum =
      c.optimizer == "momentum" ? fmt::format("momentum {:g}", t.momentum) : "optimizer " + c.optimizer;
  std::string hint = fmt::format("; the job ran with lr {:g} ({}), {}{}, {} workers under {}: try --lr {:g}", t.lr, from,
                                 momentum, t.staleness_aware_lr ? ", staleness-aware steps" : "", c.workers, c.policy,
                                 t.lr / 2);
  if (c.optimizer == "momentum" && t.momentum > 0.6) hint += fmt::format(" or --momentum {:g}", t.momentum - 0.3);
  return hint;
}

JobSummary CoordinatorCore::finished(double test_accuracy, const std::vector<ShardStats>& stats) {
  std::vector<std::uint64_t> histogram;
  for (const auto& s : stats) merge_histogram(histogram, s.staleness_histogram);
  // allreduce, gossip: the time is the exchange with the other workers
  // (and the publishes to the shards), the wait the peers' part of it.
  const char* exchange = plan_.exchange == Exchange::none ? "shard round trips" : "exchange with the other workers";
  const char* held = plan_.exchange == Exchange::none ? "held by the policy" : "waiting for them";
  for (const auto& w : epochs_.worker_totals()) {
    merge_histogram(histogram, w.staleness_histogram);
    logger().info("worker {}: {} samples, compute {:.2f} s, {} {:.2f} s ({} {:.2f} s), waiting for data {:.2f} s, {} "
                  "batches dropped (NaN/Inf loss)",
                  w.worker, w.samples, w.compute_s, exchange, w.comm_s, held, w.policy_wait_s, w.data_wait_s,
                  w.dropped_batches);
  }
  JobSummary summary = this->summary(test_accuracy, histogram);
  for (const auto& s : stats) {
    summary.shard_optimizer_s.push_back(s.optimizer_s);
    summary.malformed_frames += s.malformed_frames;
    summary.checkpoint_failures += s.checkpoint_failures;
    if (s.malformed_frames > 0) logger().warn("shard {}'s process dropped {} malformed frames", s.shard, s.malformed_frames);
    if (s.rejected > 0) logger().warn("shard {} rejected {} malformed pushes or pulls", s.shard, s.rejected);
    if (s.refused_departed > 0)
      logger().info("shard {} refused {} pushes or pulls of workers that had left (finished, or lost "
                   "while only stalled)",
                   s.shard, s.refused_departed);
    if (s.checkpoint_failures > 0) logger().warn("shard {}: {} checkpoint writes failed", s.shard, s.checkpoint_failures);
    if (s.nonfinite > 0) logger().warn("shard {} refused {} pushes holding NaN or infinity", s.shard, s.nonfinite);
    summary.nonfinite_rejected += s.nonfinite;
    if (s.updates_discarded > 0) logger().info("shard {} discarded {} late pushes", s.shard, s.updates_discarded);
  }
  done_ = true;
  return summary;
}

// A loss that stays finite but far above a uniform guess's (ln classes):
// the job ran to its end, exit 0, at a loss of 6e21 without a word (only
// a NaN or infinite one stops it).
void CoordinatorCore::warn_if_diverging(const EpochMetrics& m) const {
  const double guess = std::log(static_cast<double>(std::max<std::size_t>(2, plan_.classes)));
  if (std::isfinite(m.train_loss) && m.train_loss > kDivergedLossFactor * guess)
    logger().warn("epoch {}: training loss {:.4g}, over {:g} times a uniform guess's ({:.2f}): the job is likely "
                  "diverging (a smaller --lr)",
                  m.epoch, m.train_loss, kDivergedLossFactor, guess);
}

JobSummary CoordinatorCore::summary(double test_accuracy, const std::vector<std::uint64_t>& histogram) const {
  const JobConfig& cfg = config_;
  JobSummary sum;
  sum.policy = plan_.policy_name;
  if (auto options = resolve_policy_options(plan_.policy)) sum.policy_options = std::move(options).value();
  sum.lr = plan_.training.lr;
  if (config_.optimizer == "momentum") sum.momentum = plan_.training.momentum;
  sum.optimizer = cfg.optimizer;
  sum.lr_schedule = cfg.lr_schedule;
  sum.weight_decay = cfg.weight_decay;
  sum.seed = cfg.seed;
  sum.compress = plan_.placement == Placement::one_process ? "none" : cfg.compress;
  if (plan_.placement == Placement::one_process) sum.threads = static_cast<std::uint32_t>(plan_.compute_threads);
  sum.staleness = plan_.staleness_bound;
  sum.workers = cfg.workers;
  sum.shards = cfg.shards;
  sum.device = cfg.device;
  sum.model = cfg.model_spec ? cfg.model_spec->name() : cfg.model;
  sum.dataset = dataset_;
  sum.epochs = cfg.epochs;
  // Stopped at the target: training ended when the last worker stopped
  // (its last report), in the middle of an epoch.
  sum.train_s = stopped_ ? epochs_.latest_report_s() : epochs_.train_s();
  sum.stopped_at_target = stopped_;
  std::uint64_t samples = 0;
  for (const auto& w : epochs_.worker_totals()) {
    samples += w.samples;
    sum.worker_wait_s.push_back(w.policy_wait_s);
    sum.worker_phases.push_back(phases_of(w));
  }
  for (const auto& w : plan_.workers) sum.worker_batch.push_back(w.share.batch);
  sum.samples_per_s = sum.train_s > 0 ? static_cast<double>(samples) / sum.train_s : 0.0;
  sum.final_test_accuracy = test_accuracy;
  sum.time_to_target_s = time_to_target_s_;
  // Never fewer than the last epoch's record said the shards held.
  sum.updates_applied = std::max(updates(), shards_applied_);
  const StalenessSummary stale = summarize_staleness(histogram);
  sum.staleness_mean = stale.mean;
  sum.staleness_p99 = stale.p99;
  sum.staleness_max = stale.max;
  sum.staleness_histogram = histogram;
  sum.workers_lost = members_.lost_count();
  sum.shard_restarts = shard_restarts_;
  sum.workers_rejoined = members_.rejoined();
  return sum;
}

}  // namespace asgd
