// Membership: which workers are live, lost or finished (coordinator_membership.hpp).
#include <algorithm>
#include <cmath>

#include "actors/coordinator_membership.hpp"

namespace asgd {

bool Membership::awaited(std::size_t w, std::uint64_t epoch) const {
  return w >= seen_.size() || (!seen_[w].lost && epoch >= seen_[w].first_epoch);
}

void Membership::finish(std::size_t w) {
  if (w < seen_.size()) seen_[w].finished = true;
  ++stopped_;
}

bool Membership::lose(std::size_t w) {
  if (w >= seen_.size() || seen_[w].lost || seen_[w].finished) return false;
  seen_[w].lost = true;
  ++lost_;
  ++stopped_;
  return true;
}

void Membership::rejoin(std::size_t w, std::uint64_t first_epoch) {
  Worker& seen = seen_.at(w);
  const ProgressTotals before = seen.counted();
  seen = {};
  seen.before = before;
  seen.first_epoch = first_epoch;
  seen.latest.epoch = first_epoch;  // until it reports: where it starts, not the job's first epoch
  --lost_;
  --stopped_;
  ++rejoined_;
}

void Membership::progress(const WorkerProgress& p, CoordinatorInstant now) {
  if (p.worker >= seen_.size() || seen_[p.worker].lost) return;
  auto& seen = seen_[p.worker];
  // Cumulative counts: a late one must not move them back.
  if (p.samples < seen.latest.samples) return;
  seen.latest = p;
  seen.at = now;
}

void Membership::completed(std::size_t w, std::uint64_t epoch) {
  if (w < seen_.size() && !seen_[w].lost) seen_[w].latest.epoch = std::max(seen_[w].latest.epoch, epoch + 1);
}

std::uint64_t Membership::furthest_epoch_besides(std::size_t w) const {
  std::uint64_t furthest = 0;
  for (std::size_t i = 0; i < seen_.size(); ++i)
    if (i != w && !seen_[i].lost) furthest = std::max(furthest, seen_[i].latest.epoch);  // finished ones too
  return furthest;
}

ProgressTotals Membership::totals(double at_s) const {
  ProgressTotals t;
  for (const auto& w : seen_) {
    const ProgressTotals c = w.counted();
    t.samples += c.samples;
    t.updates += c.updates;
    t.loss_sum += c.loss_sum;
    t.loss_samples += c.loss_samples;
  }
  t.at_s = at_s;
  return t;
}

double loss_between(const ProgressTotals& from, const ProgressTotals& to) {
  if (to.loss_samples <= from.loss_samples) return std::nan("");
  return (to.loss_sum - from.loss_sum) / static_cast<double>(to.loss_samples - from.loss_samples);
}

}  // namespace asgd
