// EpochTracker and EvalSchedule: epoch reports, when an epoch is complete,
// its metrics, and when to evaluate (coordinator_epochs.hpp).
#include "base/log.hpp"

#include <algorithm>
#include <cmath>

#include "actors/coordinator_epochs.hpp"

namespace asgd {

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

WorkerPhases phases_of(const EpochReport& r) {
  WorkerPhases p;
  p.wall_s = r.wall_s;
  p.data_wait_s = r.data_wait_s;
  p.forward_s = r.forward_s;
  p.backward_s = r.backward_s;
  p.copy_s = r.copy_s;
  p.device_s = r.device_s;
  p.delay_s = r.delay_s;
  p.push_pull_s = r.comm_s;
  p.policy_wait_s = r.policy_wait_s;
  p.other_s = r.other_s;
  return p;
}

void EpochTracker::report(const EpochReport& r, double at_s) {
  if (r.worker >= totals_.size()) return;
  auto& total = totals_[r.worker];
  total.worker = r.worker;
  total.samples += r.samples;
  total.compute_s += r.compute_s;
  total.comm_s += r.comm_s;
  total.data_wait_s += r.data_wait_s;
  total.policy_wait_s += r.policy_wait_s;
  total.forward_s += r.forward_s;
  total.backward_s += r.backward_s;
  total.copy_s += r.copy_s;
  total.device_s += r.device_s;
  total.delay_s += r.delay_s;
  total.other_s += r.other_s;
  total.wall_s += r.wall_s;
  total.dropped_batches += r.dropped_batches;
  merge_histogram(total.staleness_histogram, r.staleness_histogram);
  // The pushes a worker sent after its last epoch's report (averaging's
  // last partial round, Downpour's n_push) come in a report of no batches:
  // they count in the job's updates, and reopen no epoch nor replace the
  // worker's phases in it.
  if (evaluated_.contains(r.epoch)) {
    updates_ += r.updates;
    return;
  }
  if (auto seen = epochs_seen_.find(r.epoch); r.batches == 0 && seen != epochs_seen_.end() &&
                                              r.worker < seen->second.reported.size() &&
                                              seen->second.reported[r.worker]) {
    seen->second.sum.updates += r.updates;
    return;
  }
  auto& e = epochs_seen_[r.epoch];
  e.last_report_s = at_s;
  latest_report_s_ = std::max(latest_report_s_, at_s);
  e.reported.resize(workers_, false);
  e.reported[r.worker] = true;
  e.sum.samples += r.samples;
  e.sum.batches += r.batches;
  e.loss_by_worker.resize(workers_, 0.0);
  e.loss_by_worker[r.worker] += r.loss_sum;
  e.sum.dropped_batches += r.dropped_batches;
  e.sum.dropped_samples += r.dropped_samples;
  e.sum.updates += r.updates;
  e.busiest_s = std::max(e.busiest_s, r.compute_s + r.comm_s + r.data_wait_s);
  e.phases.resize(workers_);
  e.phases[r.worker] = phases_of(r);
}

std::uint64_t EpochTracker::pending_updates() const {
  std::uint64_t n = 0;
  for (const auto& [e, agg] : epochs_seen_) n += agg.sum.updates;
  return n;
}

std::vector<std::uint64_t> EpochTracker::complete(const Membership& members) {
  std::vector<std::uint64_t> completed;
  auto all_reported = [&](std::uint64_t e, Epoch& agg) {
    agg.reported.resize(workers_, false);
    for (std::size_t w = 0; w < agg.reported.size(); ++w)
      if (!agg.reported[w] && members.awaited(w, e)) return false;
    return true;
  };
  for (auto& [e, agg] : epochs_seen_) {
    if (agg.complete) continue;
    if (!all_reported(e, agg)) break;
    agg.complete = true;
    // The epoch ended with the last report it got, which is now unless a
    // lost worker was holding it back: then it ended earlier, and may be
    // completed together with later epochs the others had reported since.
    agg.end_s = std::max(agg.last_report_s, last_end_s_);
    agg.duration_s = agg.end_s - last_end_s_;
    last_end_s_ = agg.end_s;
    if (e + 1 == epochs_) train_s_ = agg.end_s;
    completed.push_back(e);
  }
  return completed;
}

EpochMetrics EpochTracker::evaluated(std::uint64_t e, double val_accuracy) {
  const Epoch& agg = epochs_seen_.at(e);
  EpochMetrics m;
  m.epoch = static_cast<std::uint32_t>(e + 1);
  m.wall_s = agg.end_s;
  const std::uint64_t loss_samples = agg.sum.samples - agg.sum.dropped_samples;
  double loss_sum = 0.0;
  for (double l : agg.loss_by_worker) loss_sum += l;
  // No loss at all when every batch was dropped (not 0: "loss 0.0000"
  // read as a perfect fit).
  m.train_loss = loss_samples ? loss_sum / static_cast<double>(loss_samples) : std::nan("");
  if (agg.sum.dropped_batches > 0)
    logger().warn("epoch {}: dropped {} batch gradients whose loss was NaN or infinite", e + 1, agg.sum.dropped_batches);
  m.val_accuracy = val_accuracy;
  // Never faster than its busiest worker trained: with a step or two per
  // epoch, reports of several epochs arrive within microseconds.
  const double took_s = std::max(agg.duration_s, agg.busiest_s);
  m.samples_per_s = took_s > 0 ? static_cast<double>(agg.sum.samples) / took_s : 0.0;
  updates_ += agg.sum.updates;
  m.updates = updates_;
  m.worker_phases = agg.phases;
  epochs_seen_.erase(e);
  evaluated_.insert(e);
  return m;
}

const EpochTracker::Epoch* EpochTracker::epoch(std::uint64_t e) const {
  auto it = epochs_seen_.find(e);
  return it == epochs_seen_.end() ? nullptr : &it->second;
}

EvalSchedule::EvalSchedule(double every_s) {
  if (every_s > 0)
    period_ = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(every_s));
}

bool EvalSchedule::tick(CoordinatorInstant now) {
  if (now < due_) return false;
  due_ = now + period_;
  return true;
}

std::optional<std::uint64_t> EvalSchedule::begin_epoch() {
  if (evaluating_ || queue_.empty()) return std::nullopt;
  evaluating_ = true;
  epoch_ = queue_.front();
  queue_.pop_front();
  return epoch_;
}

bool EvalSchedule::begin_point(const ProgressTotals& at) {
  if (evaluating_) return false;
  evaluating_ = true;
  point_ = at;
  return true;
}

}  // namespace asgd
