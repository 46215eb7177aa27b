// LiveView: Progress and the live status from the workers' latest progress
// (coordinator_live.hpp).
#include <algorithm>
#include <cmath>

#include "actors/coordinator_live.hpp"

namespace asgd {

void LiveView::set_plan(std::vector<std::uint64_t> per_epoch, std::uint64_t first_epoch, std::uint64_t epochs) {
  per_epoch_ = std::move(per_epoch);
  first_epoch_ = first_epoch;
  epochs_ = std::max(epochs, first_epoch);
}

std::uint64_t LiveView::total_samples(const Membership& members) const {
  std::uint64_t total = 0;
  const auto& workers = members.workers();
  for (std::size_t w = 0; w < per_epoch_.size(); ++w) {
    const std::uint64_t planned = per_epoch_[w] * (epochs_ - first_epoch_);
    if (w >= workers.size()) {
      total += planned;
    } else if (workers[w].lost) {
      total += std::min(planned, workers[w].counted().samples);
    } else if (workers[w].first_epoch > first_epoch_) {  // rejoined
      const std::uint64_t from = std::min(workers[w].first_epoch, epochs_);
      total += std::min(planned, workers[w].before.samples + per_epoch_[w] * (epochs_ - from));
    } else {
      total += planned;
    }
  }
  return total;
}

Progress LiveView::tick(const Membership& members, const ProgressTotals& now, std::uint32_t epochs,
                        std::optional<double> val_accuracy) {
  const double dt = now.at_s - last_.at_s;
  Progress p;
  p.wall_s = now.at_s;
  p.epochs = epochs;
  p.epoch = p.epochs;
  for (const auto& w : members.workers())  // a lost worker's epoch holds no one back
    if (!w.finished && !w.lost) p.epoch = std::min<std::uint32_t>(p.epoch, static_cast<std::uint32_t>(w.latest.epoch + 1));
  p.samples = now.samples;
  p.total_samples = total_samples(members);
  p.train_loss = loss_between(last_, now);
  p.samples_per_s = dt > 0 && now.samples >= last_.samples ? static_cast<double>(now.samples - last_.samples) / dt : 0.0;
  p.val_accuracy = val_accuracy;
  if (now.samples > 0 && now.at_s > 0 && p.total_samples >= now.samples)
    p.eta_s = static_cast<double>(p.total_samples - now.samples) * now.at_s / static_cast<double>(now.samples);
  last_ = now;
  return p;
}

void LiveView::fill(LiveSnapshot& snap, const Progress& p, const Membership& members, std::uint64_t evaluations,
                    CoordinatorInstant now) const {
  if (snap.state == "starting") snap.state = "training";
  snap.wall_s = p.wall_s;
  snap.epoch = p.epoch;
  snap.progress = p.total_samples ? std::min(1.0, static_cast<double>(p.samples) / p.total_samples) : 0.0;
  snap.eta_s = p.eta_s;
  snap.samples = p.samples;
  snap.total_samples = p.total_samples;
  snap.samples_per_s = p.samples_per_s;
  snap.updates = last_.updates;  // the totals p came from
  snap.train_loss = std::isfinite(p.train_loss) ? std::optional<double>(p.train_loss) : snap.train_loss;
  snap.val_accuracy = p.val_accuracy;
  snap.evaluations = evaluations;
  snap.worker.clear();
  for (std::size_t w = 0; w < members.size(); ++w) {
    const auto& seen = members.worker(w);
    LiveWorker lw;
    lw.worker = static_cast<std::uint32_t>(w);
    lw.clock = seen.latest.clock;
    lw.epoch = std::min<std::uint64_t>(seen.latest.epoch + 1, p.epochs);  // past its last: it has finished
    const ProgressTotals counted = seen.counted();
    lw.samples = counted.samples;
    lw.updates = counted.updates;
    lw.staleness = seen.latest.staleness;
    lw.wait_s = seen.latest.policy_wait_s;
    lw.batches_ready = seen.latest.batches_ready;
    lw.alive = !seen.lost;
    lw.finished = seen.finished;
    lw.last_seen_s = seen.at == CoordinatorInstant{} ? p.wall_s : std::chrono::duration<double>(now - seen.at).count();
    snap.worker.push_back(lw);
  }
}

LiveShard live_shard(const ShardStats& s, double now_unix) {
  LiveShard l;
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
  if (s.checkpoint_unix_s > 0) l.checkpoint_age_s = std::max(0.0, now_unix - s.checkpoint_unix_s);
  return l;
}

}  // namespace asgd
