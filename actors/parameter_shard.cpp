#include "actors/parameter_shard.hpp"
#include "policies/registry.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <filesystem>

#include "compute/tensor.hpp"
#include "messaging/wire.hpp"  // crc32c: a remote push's reply is checksummed in the update's pass
#include "actors/checkpoint.hpp"
#include "base/scoped_seconds.hpp"

namespace asgd {

namespace {

// How a step staler than usual is taken (ShardCore::lr_scale).
constexpr float kStaleMomentum = 0.5f;
constexpr float kStaleRateFactor = 2.0f;

}  // namespace

Result<ShardCore> ShardCore::make(ShardSetup setup) {
  if (setup.workers == 0) return Status::InvalidArgument("shard " + std::to_string(setup.index) + ": no workers");
  if (setup.shared && setup.shared->values.size() < setup.range.end)
    return Status::InvalidArgument("shard " + std::to_string(setup.index) + ": the shared buffer is smaller than its range");
  if (!setup.shared && setup.initial.size() != setup.range.size())
    return Status::InvalidArgument("shard " + std::to_string(setup.index) + ": initial parameters have " +
                                   std::to_string(setup.initial.size()) + " values for a range of " +
                                   std::to_string(setup.range.size()));
  auto optimizer = make_optimizer(setup.optimizer, setup.range.size());
  if (!optimizer) return optimizer.status();
  auto policy = make_policy(setup.policy);
  if (!policy) return policy.status();
  if ((*policy)->shares_parameters() && !setup.shared)
    return Status::InvalidArgument("shard " + std::to_string(setup.index) + ": policy " + (*policy)->name() +
                                   " needs the parameter buffer the workers of one process share; it cannot run "
                                   "across processes");
  ShardCore core;
  if (setup.shared) {
    core.params_ = std::span(setup.shared->values).subspan(setup.range.begin, setup.range.size());
  } else {
    core.owned_ = std::move(setup.initial);
    core.params_ = core.owned_;
  }
  core.setup_ = std::move(setup);
  core.optimizer_ = std::move(optimizer).value();
  core.policy_ = std::move(policy).value();
  if (auto options = resolve_policy_options(core.setup_.policy); options && options->contains("push-every"))
    core.push_every_ = static_cast<Clock>(options->at("push-every"));
  core.clock_.assign(core.setup_.workers, 0);
  core.live_.assign(core.setup_.workers, true);
  core.stats_.shard = core.setup_.index;
  return core;
}

ClockView ShardCore::view() const {
  ClockView v;
  Clock lowest = std::numeric_limits<Clock>::max(), highest = 0;
  for (std::size_t w = 0; w < clock_.size(); ++w) {
    highest = std::max(highest, clock_[w]);
    if (live_[w]) {
      ++v.live_workers;
      lowest = std::min(lowest, clock_[w]);
    }
  }
  v.min_clock = v.live_workers > 0 ? lowest : highest;
  v.committed = committed_;
  return v;
}

// Updates enter the parameters either as they arrive (then every clock below
// the slowest live worker's is in) or through commits (then every committed
// clock is); a policy uses one way or the other, and the further is the truth.
Clock ShardCore::complete_clock() const { return std::max(committed_, view().min_clock); }

ShardReply ShardCore::reply(PushOutcome outcome, std::vector<float> buffer, bool with_params) const {
  ShardReply r;
  r.shard = setup_.index;
  r.outcome = static_cast<std::uint8_t>(outcome);
  r.clock = complete_clock();
  r.version = version_;
  r.applied = stats_.updates_applied;
  if (with_params) {
    buffer.assign(params_.begin(), params_.end());
    r.params = std::move(buffer);
  }
  return r;
}

void ShardCore::record_staleness(Clock clock, Clock base) {
  // A base clock from the future can only come from a confused peer; count
  // it as fresh rather than wrapping around.
  const Clock staleness = clock > base ? clock - base : 0;
  auto& h = stats_.staleness_histogram;
  if (h.size() <= staleness) h.resize(staleness + 1, 0);
  ++h[staleness];
}

float ShardCore::lr_scale(Clock clock, std::uint64_t staleness) {
  float scale = setup_.schedule.scale(clock);
  // The rate is chosen for the staleness of a two-worker job's steps, about
  // 1 update; with N workers about N / 2 times that is usual. A step staler
  // than that (N processes pushing at once: about N - 1) takes twice the
  // rate divided by how much staler it is (Zhang et al. 2016), and a step
  // over N / 4 stale takes momentum 0.5, since asynchrony acts as momentum
  // of its own (Mitliagkas et al. 2016). The factors and thresholds are
  // measured: docs/policies.md.
  const float usual = std::max(1.0f, static_cast<float>(setup_.workers) / 2.0f);
  const bool stale = setup_.staleness_aware_lr && static_cast<float>(staleness) > usual;
  if (stale) scale *= kStaleRateFactor * usual / static_cast<float>(staleness);
  const bool damp = setup_.staleness_aware_lr && static_cast<float>(staleness) > std::max(1.0f, usual / 2.0f);
  const float mu = setup_.optimizer.momentum;
  optimizer_->set_momentum_scale(damp && mu > kStaleMomentum ? kStaleMomentum / mu : 1.0f);
  return scale;
}

void ShardCore::fold(std::span<const float> pushed, float scale, std::span<float> reply, const Written& written) {
  const ScopedSeconds timed(stats_.optimizer_s);
  const Combine how = policy_->combine();
  switch (how.rule) {
    case Combine::Rule::optimizer_step:
      if (written && !reply.empty()) optimizer_->step_visiting(params_, pushed, scale, reply, written);
      else optimizer_->step(params_, pushed, scale, reply);
      return;
    case Combine::Rule::replace:
      std::copy(pushed.begin(), pushed.end(), params_.begin());
      if (!reply.empty() && reply.data() != pushed.data()) std::copy(pushed.begin(), pushed.end(), reply.begin());
      break;
    case Combine::Rule::elastic:
      // Each pushed value is read before its reply slot (which may be the
      // same memory) is written.
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const float x = pushed[i];
        const float d = how.moving_rate * (x - params_[i]);
        params_[i] += d;
        if (!reply.empty()) reply[i] = x - d;
      }
      break;
  }
  if (written && !reply.empty()) written(0, reply.size());
}

void ShardCore::answer_or_hold(Ticket ticket, PullInfo read, PushOutcome outcome, std::vector<float> buffer,
                               Instant now, std::vector<Answer>& out) {
  if (policy_->may_answer_pull(read, view())) {
    out.push_back({ticket, reply(outcome, std::move(buffer), true)});
  } else {
    held_.push_back({ticket, read, outcome, std::move(buffer), now});
  }
}

void ShardCore::release_held(Instant now, std::vector<Answer>& out) {
  if (held_.empty()) return;
  const ClockView v = view();
  auto still_held = std::stable_partition(held_.begin(), held_.end(),
                                          [&](const Held& h) { return !policy_->may_answer_pull(h.read, v); });
  for (auto it = still_held; it != held_.end(); ++it) {
    ShardReply r = reply(it->outcome, std::move(it->buffer), true);
    r.held_s = it->since == Instant{} ? 0.0 : std::chrono::duration<double>(now - it->since).count();
    out.push_back({it->ticket, std::move(r)});
  }
  held_.erase(still_held, held_.end());
}

std::optional<std::string> ShardCore::describe_overdue_reads(Instant now, std::chrono::duration<double> after) {
  const Held* oldest = nullptr;
  std::size_t overdue = 0;
  for (Held& h : held_) {
    if (h.described || h.since == Instant{} || now - h.since < after) continue;
    h.described = true;
    ++overdue;
    if (!oldest || h.since < oldest->since) oldest = &h;
  }
  if (!oldest) return std::nullopt;
  // Every policy that holds reads waits for the slowest live workers (bsp
  // and averaging for their pushes to complete a clock, ssp for their clock
  // to come within the bound), so they are whom to look at.
  const ClockView v = view();
  std::string slowest;
  std::size_t named = 0;
  for (std::size_t w = 0; w < clock_.size(); ++w)
    if (live_[w] && clock_[w] == v.min_clock) slowest += (named++ ? ", " : "") + std::to_string(w);
  return fmt::format("shard {}: {} read(s) held by policy {} for over {:g} s; the oldest, worker {}'s at clock {}, "
                     "for {:.1f} s: waiting for the slowest live worker{} {}, at clock {}",
                     setup_.index, overdue, policy_->name(), after.count(), oldest->read.worker, oldest->read.clock,
                     std::chrono::duration<double>(now - oldest->since).count(), named == 1 ? "" : "s", slowest,
                     v.min_clock);
}

void ShardCore::commit_ready_aggregates() {
  // Strictly in clock order: a later clock never overtakes an earlier one.
  while (!pending_.empty()) {
    auto it = pending_.begin();
    const Clock t = it->first;
    Aggregate& agg = it->second;
    // Only live workers' pushes count towards completeness (one that left
    // after pushing must not stand in for one still computing), but every
    // push in the aggregate is applied. A live worker whose clock passed t
    // without a push for t never will push for it (averaging's partial last
    // round of a worker with fewer steps): it counts as done, not awaited.
    std::uint32_t live_contributions = 0;
    for (std::size_t w = 0; w < agg.present.size(); ++w)
      live_contributions += live_[w] && (agg.present[w] || clock_[w] > t);
    if (!policy_->commit_ready(t, live_contributions, view())) return;
    double total = 0.0;
    for (auto n : agg.samples) total += n;
    if (total == 0) {  // only clock ticks: nothing to apply
      committed_ = t + 1;
      pending_.erase(it);
      continue;
    }
    // Summed in worker order, so a run is bitwise reproducible whatever
    // order the pushes arrived in. Weighted by samples: with unequal
    // batches this is the mean over every sample of the clock.
    mean_.assign(params_.size(), 0.0f);
    for (std::size_t w = 0; w < agg.slots.size(); ++w) {
      if (agg.samples[w] == 0) continue;
      const float weight = static_cast<float>(agg.samples[w] / total);
      const float* g = agg.slots[w].data();
      for (std::size_t i = 0; i < mean_.size(); ++i) mean_[i] += weight * g[i];
      record_staleness(t, agg.base[w]);
      ++stats_.updates_applied;
    }
    fold(mean_, lr_scale(t, 0), {}, {});
    ++version_;
    ++stats_.commits;
    committed_ = t + 1;
    pending_.erase(it);
  }
}

void ShardCore::push(PushRequest&& req, Ticket ticket, Instant now, std::vector<Answer>& out) {
  const bool known = req.worker < setup_.workers && live_[req.worker];
  const auto slot = pending_.find(req.clock);
  const bool duplicate = known && slot != pending_.end() && slot->second.present[req.worker];
  std::span<const float> payload = req.values();
  bool remote = req.received.owner != nullptr;
  bool tick = req.samples == 0 && payload.empty();
  if (!known || duplicate || (!tick && payload.size() != params_.size())) {
    // A worker declared lost that was only stalled (SIGSTOP, a long pause)
    // pushes on: refused like a malformed push, but counted apart.
    ++(req.worker < setup_.workers && !live_[req.worker] ? stats_.refused_departed : stats_.rejected);
    out.push_back({ticket, reply(PushOutcome::rejected, {}, false)});
    return;
  }
  // A NaN or infinity would poison the parameters for good: such a push
  // changes nothing, but still counts as the worker's clock tick, so
  // synchronous policies do not wait for a push that will never come.
  const bool nonfinite = !tick && !(remote && req.received.finite ? *req.received.finite : all_finite(payload));
  if (nonfinite) {
    ++stats_.nonfinite;
    req.samples = 0;
    req.payload.clear();
    req.received = {};
    payload = {};
    remote = false;
    tick = true;
  }
  // The steps the push sums (async's --push-every n: the gradients of n
  // steps), whose weight decay its optimizer step takes n times.
  // At most push-every: a shard restarted from its checkpoint holds clocks
  // behind the workers', and took the decay of every step since (a kill
  // 14 s into a --weight-decay 0.1 job sent validation accuracy to 0.105).
  const Clock next = req.clock + 1, had = clock_[req.worker];
  const Clock summed = next > had ? std::min(next - had, push_every_) : 1;
  clock_[req.worker] = std::max(had, next);
  const PushInfo info{req.worker, req.clock, req.base_clock};
  const PullInfo read{req.worker, req.clock + 1};
  PushOutcome outcome = PushOutcome::applied;
  switch (policy_->admit_push(info, view())) {
    case PushAction::apply:
      if (tick) break;
      if (apply(req, payload, remote, summed, ticket, out)) {
        release_held(now, out);
        return;
      }
      break;
    case PushAction::aggregate:
      aggregate(req, payload, remote);
      outcome = PushOutcome::aggregated;
      break;
    case PushAction::discard:
      ++stats_.updates_discarded;
      outcome = PushOutcome::discarded;
      break;
  }
  if (tick && outcome != PushOutcome::discarded) outcome = nonfinite ? PushOutcome::nonfinite : PushOutcome::none;
  if (req.want_params) {
    answer_or_hold(ticket, read, outcome, remote ? std::move(req.received.spare) : std::move(req.payload), now, out);
  } else {
    out.push_back({ticket, reply(outcome, {}, false)});
  }
  release_held(now, out);
}

bool ShardCore::apply(PushRequest& req, std::span<const float> payload, bool remote, Clock summed, Ticket ticket,
                      std::vector<Answer>& out) {
  // Staleness for the step size counts the updates this shard applied
  // since the worker read the parameters (Zhang et al. 2016): with N
  // workers pushing at once it is about N - 1, whatever the clocks say.
  const std::uint64_t behind = version_ > req.base_version ? version_ - req.base_version : 0;
  if (policy_->exchange() != Exchange::none) return publish(req, payload);
  record_staleness(req.clock, req.base_clock);
  ++stats_.updates_applied;
  ++stats_.commits;
  ++version_;
  // The schedule follows the model's progress, not this worker's: under
  // async a straggler's late pushes must not get an early, larger rate.
  Clock progress = 0;
  for (Clock c : clock_) progress += c;
  progress /= clock_.size();
  const float scale = lr_scale(progress > 0 ? progress - 1 : 0, behind);
  optimizer_->set_decay_scale(static_cast<float>(summed));
  if (!req.want_params || !policy_->may_answer_pull(PullInfo{req.worker, req.clock + 1}, view())) {
    fold(payload, scale, {}, {});
    return false;
  }
  // The common async case: write the fresh parameters into the reply in the
  // optimizer's pass (it reads g[i] before it writes the slot) and answer at
  // once. A local push's buffer becomes the reply. A remote push's reply
  // goes over its gradient in the frame's buffer when that is ours alone,
  // else into the spare buffer, and is checksummed block by block while each
  // block is in cache, which saves the sending process a pass.
  ShardReply r = reply(PushOutcome::applied, {}, false);
  if (remote) {
    ReceivedFloats& in = req.received;
    if (in.writable.empty()) in.spare.resize(payload.size());
    const std::span<float> fresh = in.writable.empty() ? std::span<float>(in.spare) : in.writable;
    std::uint32_t crc = 0;
    fold(payload, scale, fresh, [&](std::size_t begin, std::size_t end) {
      crc = messaging::crc32c(std::as_bytes(fresh.subspan(begin, end - begin)), crc);
    });
    if (in.writable.empty()) {
      r.params = std::move(in.spare);
    } else {
      r.params_in_frame = {std::move(in.owner), in.values, in.writable, {}, std::nullopt};
    }
    r.params_crc = crc;
  } else {
    fold(req.payload, scale, req.payload, {});
    r.params = std::move(req.payload);
  }
  out.push_back({ticket, std::move(r)});
  return true;
}

// A decentralized policy's workers count their staleness themselves; what
// they push here only publishes their parameters. The newest copy stays: one
// of an earlier clock that arrives late changes nothing (it replaced a newer
// one). The updates counted are the workers' optimizer steps the copies
// published carry, the unit of the summary and of bsp's pushes (a copy
// each publish-steps steps was counted as one, which put allreduce eight
// times ahead of bsp on a report's updates axis for the same steps).
bool ShardCore::publish(const PushRequest& req, std::span<const float> payload) {
  stats_.updates_applied = 0;
  for (Clock c : clock_) stats_.updates_applied += c;
  if (req.clock + 1 < newest_copy_) return false;
  newest_copy_ = req.clock + 1;
  ++stats_.commits;
  ++version_;
  fold(payload, 1.0f, {}, {});
  return false;
}

void ShardCore::aggregate(PushRequest& req, std::span<const float> payload, bool remote) {
  Aggregate& agg = pending_[req.clock];
  if (agg.slots.empty()) {
    agg.slots.resize(setup_.workers);
    agg.samples.assign(setup_.workers, 0);
    agg.base.assign(setup_.workers, 0);
    agg.present.assign(setup_.workers, false);
  }
  agg.present[req.worker] = true;
  ++agg.count;
  agg.samples[req.worker] = req.samples;
  agg.base[req.worker] = req.base_clock;
  // A remote payload is copied out: an aggregate may wait a long time, and
  // should not keep a frame's buffer alive meanwhile.
  if (remote) {
    agg.slots[req.worker].assign(payload.begin(), payload.end());
  } else {
    agg.slots[req.worker] = std::move(req.payload);
  }
  commit_ready_aggregates();
}

void ShardCore::pull(const PullRequest& pull, Ticket ticket, Instant now, std::vector<Answer>& out) {
  if (pull.worker >= setup_.workers || !live_[pull.worker]) {
    ++(pull.worker < setup_.workers ? stats_.refused_departed : stats_.rejected);
    out.push_back({ticket, reply(PushOutcome::rejected, {}, false)});
    return;
  }
  answer_or_hold(ticket, {pull.worker, pull.clock}, PushOutcome::none, {}, now, out);
}

void ShardCore::leave(WorkerId worker, Instant now, std::vector<Answer>& out) {
  if (worker >= setup_.workers || !live_[worker]) return;
  live_[worker] = false;
  commit_ready_aggregates();
  release_held(now, out);
}

void ShardCore::rejoin(WorkerId worker, Clock clock) {
  if (worker >= setup_.workers) return;
  live_[worker] = true;
  clock_[worker] = std::max(clock_[worker], clock);
}

ShardReply ShardCore::snapshot() const { return reply(PushOutcome::none, {}, true); }

namespace {

constexpr char kShardMagic[8] = {'A', 'S', 'G', 'D', 'S', 'H', 'R', 'D'};
constexpr std::uint32_t kShardCheckpointVersion = 1;

}  // namespace

std::string shard_checkpoint_path(const std::string& dir, std::uint32_t index) {
  return (std::filesystem::path(dir) / ("shard-" + std::to_string(index) + ".ckpt")).string();
}

Status ShardCore::save(const std::string& path) const {
  return write_atomically(path, checkpoint_bytes(unix_seconds_now()));
}

std::string ShardCore::checkpoint_bytes(double taken_unix_s) const {
  ShardCore& self = const_cast<ShardCore&>(*this);  // state() hands out writable views; we only read them
  std::vector<std::span<const float>> blocks = {params_};
  for (auto s : self.optimizer_->state()) blocks.emplace_back(s);
  std::vector<int> live(live_.begin(), live_.end());
  const nlohmann::json header = {
      {"shard", setup_.index},
      {"range", {setup_.range.begin, setup_.range.end}},
      {"workers", setup_.workers},
      {"optimizer", setup_.optimizer.kind},
      {"optimizer_buffers", blocks.size() - 1},
      {"optimizer_steps", optimizer_->steps()},
      {"version", version_},
      {"committed", committed_},
      {"clock", worker_clocks()},
      {"live", live},
      {"updates_applied", updates_applied()},
      {"commits", stats_.commits},
      {"updates_discarded", stats_.updates_discarded},
      {"rejected", stats_.rejected},
      {"refused_departed", stats_.refused_departed},
      {"nonfinite", stats_.nonfinite},
      {"staleness_histogram", stats_.staleness_histogram},
      {"optimizer_s", stats_.optimizer_s},
      {"train_fingerprint", setup_.train_fingerprint},
      {"written_unix_s", taken_unix_s}};
  return framed_bytes(kShardMagic, kShardCheckpointVersion, header, blocks);
}

Result<ShardCore::Saved> ShardCore::saved(const std::string& path) {
  auto file = read_framed(path, kShardMagic, kShardCheckpointVersion);
  if (!file) return file.status();
  try {
    const auto& h = file->header;
    Saved saved;
    saved.written_unix_s = h.at("written_unix_s").get<double>();
    saved.optimizer = h.at("optimizer").get<std::string>();
    saved.train_fingerprint = h.value("train_fingerprint", std::uint32_t{0});  // absent before 2026-11-29
    ShardStats& s = saved.stats;
    s.shard = h.at("shard").get<std::uint32_t>();
    s.updates_applied = h.at("updates_applied").get<std::uint64_t>();
    s.commits = h.at("commits").get<std::uint64_t>();
    s.updates_discarded = h.at("updates_discarded").get<std::uint64_t>();
    s.rejected = h.at("rejected").get<std::uint64_t>();
    s.refused_departed = h.value("refused_departed", std::uint64_t{0});  // absent before protocol 4
    s.nonfinite = h.at("nonfinite").get<std::uint64_t>();
    s.staleness_histogram = h.at("staleness_histogram").get<std::vector<std::uint64_t>>();
    s.worker_clock = h.at("clock").get<std::vector<Clock>>();
    s.keys = h.at("range").at(1).get<std::uint64_t>() - h.at("range").at(0).get<std::uint64_t>();
    return saved;
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(path + ": bad header: " + e.what());
  }
}

Status ShardCore::restore(const std::string& path, std::span<const Clock> restart) {
  if (!restart.empty() && restart.size() != setup_.workers)
    return Status::InvalidArgument("shard " + std::to_string(setup_.index) + ": restart clocks for " +
                                   std::to_string(restart.size()) + " workers, it has " +
                                   std::to_string(setup_.workers));
  auto file = read_framed(path, kShardMagic, kShardCheckpointVersion);
  if (!file) return file.status();
  auto mismatch = [&](const std::string& what) {
    return Status::InvalidArgument(path + " is not this job's shard " + std::to_string(setup_.index) + ": " + what);
  };
  try {
    const auto& h = file->header;
    if (h.at("shard").get<std::uint32_t>() != setup_.index) return mismatch("it is shard " + h.at("shard").dump() + "'s");
    if (h.at("range").at(0).get<std::uint64_t>() != setup_.range.begin ||
        h.at("range").at(1).get<std::uint64_t>() != setup_.range.end)
      return mismatch("its key range is " + h.at("range").dump());
    if (h.at("workers").get<std::uint32_t>() != setup_.workers)
      return mismatch("it had " + h.at("workers").dump() + " workers");
    if (h.at("optimizer").get<std::string>() != setup_.optimizer.kind)
      return mismatch("its optimizer is " + h.at("optimizer").dump());
    auto state = optimizer_->state();
    if (h.at("optimizer_buffers").get<std::size_t>() != state.size() ||
        file->values.size() != params_.size() * (1 + state.size()))
      return Status::Corruption(path + ": its values do not match the key range and optimizer");
    const float* at = file->values.data();
    std::copy(at, at + params_.size(), params_.begin());
    at += params_.size();
    for (auto s : state) {
      std::copy(at, at + s.size(), s.begin());
      at += s.size();
    }
    optimizer_->set_steps(h.at("optimizer_steps").get<std::uint64_t>());
    version_ = h.at("version").get<std::uint64_t>();
    const auto live = h.at("live").get<std::vector<int>>();
    if (live.size() != setup_.workers) return Status::Corruption(path + ": its worker list has the wrong length");
    if (restart.empty()) {
      // A shard restarted mid-job: the workers go on, and their pushes
      // move the clocks on from where the checkpoint has them.
      const auto clocks = h.at("clock").get<std::vector<Clock>>();
      if (clocks.size() != setup_.workers) return Status::Corruption(path + ": its clock table has the wrong length");
      live_.assign(live.begin(), live.end());
      clock_ = clocks;
      committed_ = h.at("committed").get<Clock>();
    } else {
      // Every worker of the resumed job starts again, the ones lost before too.
      live_.assign(setup_.workers, true);
      clock_.assign(restart.begin(), restart.end());
      committed_ = *std::min_element(restart.begin(), restart.end());
      if (setup_.shared)  // hogwild's workers count their steps there
        for (std::size_t w = 0; w < restart.size(); ++w)
          setup_.shared->clocks[w].store(restart[w], std::memory_order_release);
    }
    stats_.updates_applied = h.at("updates_applied").get<std::uint64_t>();
    stats_.commits = h.at("commits").get<std::uint64_t>();
    stats_.updates_discarded = h.at("updates_discarded").get<std::uint64_t>();
    stats_.rejected = h.at("rejected").get<std::uint64_t>();
    stats_.refused_departed = h.value("refused_departed", std::uint64_t{0});
    stats_.restored_unix_s = h.at("written_unix_s").get<double>();
    stats_.restored_updates = stats_.updates_applied;
    stats_.nonfinite = h.at("nonfinite").get<std::uint64_t>();
    stats_.staleness_histogram = h.at("staleness_histogram").get<std::vector<std::uint64_t>>();
    // A shard restarted mid-job goes on from its checkpoint's (it began at 0
    // again beside cumulative counts); a resumed job counts its own time,
    // as its train_s does. Absent before 2026-11-29.
    if (restart.empty()) stats_.optimizer_s = h.value("optimizer_s", 0.0);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(path + ": bad header: " + e.what());
  }
  pending_.clear();
  held_.clear();
  return {};
}

std::vector<Clock> ShardCore::worker_clocks() const {
  if (!setup_.shared) return clock_;
  std::vector<Clock> out;
  for (const auto& c : setup_.shared->clocks) out.push_back(c.load(std::memory_order_acquire));
  return out;
}

std::uint64_t ShardCore::updates_applied() const {
  if (!setup_.shared) return stats_.updates_applied;
  std::uint64_t steps = 0;
  for (Clock c : worker_clocks()) steps += c;
  return steps;
}

ShardStats ShardCore::stats() const {
  ShardStats s = stats_;
  s.keys = setup_.range.size();
  s.held = held_.size();
  s.worker_clock = worker_clocks();
  s.updates_applied = updates_applied();
  return s;
}

}  // namespace asgd
