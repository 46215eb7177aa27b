// The in-process collective (messaging/collective.hpp): the ranks are worker
// actors of one process. Every contribution is a view of the rank's own
// buffer; the last rank in sums them (in rank order) into one mean that every
// rank then reads in place. Gossip copies are published into buffers the
// readers share, each recycled once nobody holds it.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <mutex>

#include "messaging/collective.hpp"

namespace asgd::messaging {

namespace {

class LocalCollective final : public Collective {
 public:
  explicit LocalCollective(Rank ranks)
      : n_(ranks), left_(ranks, false), pending_(ranks), board_(ranks), spare_(ranks), waits_(ranks), delivered_(ranks) {}

  Rank size() const override { return n_; }

  Status allreduce_mean(Rank rank, Round round, std::span<const float> data, double weight, Ready ready) override {
    std::vector<Ready> wake;
    {
      std::lock_guard lock(mu_);
      if (Status s = check_call(rank); !s.ok()) return s;
      if (contributed_ > 0 && round != round_)
        return Status::InvalidArgument(fmt::format("rank {} contributed to all-reduce round {} while the others are in round {}",
                                                   rank, round, round_));
      if (weight > 0 && length_ > 0 && data.size() != length_)
        return Status::InvalidArgument(
            fmt::format("rank {} contributed {} values to an all-reduce of {}", rank, data.size(), length_));
      if (weight > 0) length_ = data.size();
      round_ = round;
      pending_[rank] = {true, data, weight, std::move(ready)};
      ++contributed_;
      complete_round(wake);
    }
    for (auto& r : wake) r();
    return {};
  }

  std::span<const float> mean(Rank) const override {
    std::lock_guard lock(mu_);
    return mean_;
  }

  double total_weight(Rank) const override {
    std::lock_guard lock(mu_);
    return total_;
  }

  // Every rank reads the board: the audience needs no sending.
  Status gossip(Rank rank, Round clock, std::span<const float> params, const std::vector<Rank>& /*audience*/,
                const std::vector<Rank>& peers, Round min_clock, Ready ready) override {
    std::shared_ptr<std::vector<float>> copy;
    {
      std::lock_guard lock(mu_);
      if (Status s = check_call(rank); !s.ok()) return s;
      for (Rank p : peers)
        if (p >= n_ || p == rank) return Status::InvalidArgument(fmt::format("rank {} named peer {} of {}", rank, p, n_));
      delivered_[rank].clear();
      if (spare_[rank] && spare_[rank].use_count() == 1) copy = std::move(spare_[rank]);
    }
    // The copy is made outside the lock: the other ranks go on meanwhile.
    if (!copy) copy = std::make_shared<std::vector<float>>();
    copy->assign(params.begin(), params.end());
    std::vector<Ready> wake;
    {
      std::lock_guard lock(mu_);
      spare_[rank] = std::move(board_[rank].params);
      board_[rank] = {clock, std::move(copy)};
      waits_[rank] = {true, peers, min_clock, std::move(ready)};
      release_waits(wake);
    }
    for (auto& r : wake) r();
    return {};
  }

  std::vector<PeerCopy> peer_copies(Rank rank) const override {
    std::lock_guard lock(mu_);
    return rank < n_ ? delivered_[rank] : std::vector<PeerCopy>{};
  }

  void leave(Rank rank) override {
    std::vector<Ready> wake;
    {
      std::lock_guard lock(mu_);
      if (rank >= n_ || left_[rank]) return;
      left_[rank] = true;
      complete_round(wake);
      release_waits(wake);
    }
    for (auto& r : wake) r();
  }

  std::string waiting_for(Rank rank) const override {
    std::lock_guard lock(mu_);
    if (rank >= n_) return {};
    std::string who;
    if (pending_[rank].in) {
      for (Rank r = 0; r < n_; ++r)
        if (!left_[r] && !pending_[r].in) who += (who.empty() ? "" : ", ") + std::to_string(r);
      return fmt::format("the all-reduce of step {}: worker(s) {} have not contributed", round_, who);
    }
    const Wait& w = waits_[rank];
    if (!w.active) return {};
    for (Rank p : w.peers)
      if (!usable(p, w.min_clock) && !left_[p])
        who += fmt::format("{}worker {} (its copy is from clock {})", who.empty() ? "" : ", ", p, board_[p].clock);
    return fmt::format("gossip: a copy from clock {} or later from {}", w.min_clock, who);
  }

 private:
  struct Contribution {
    bool in = false;
    std::span<const float> data;
    double weight = 0;
    Ready ready;
  };
  struct Published {
    Round clock = 0;
    std::shared_ptr<std::vector<float>> params;
  };
  struct Wait {
    bool active = false;
    std::vector<Rank> peers;
    Round min_clock = 0;
    Ready ready;
  };

  Status check_call(Rank rank) const {
    if (rank >= n_) return Status::InvalidArgument(fmt::format("rank {} of a collective of {}", rank, n_));
    if (left_[rank]) return Status::InvalidArgument(fmt::format("rank {} called the collective after it left", rank));
    if (pending_[rank].in || waits_[rank].active)
      return Status::InvalidArgument(fmt::format("rank {} called the collective with a call in flight", rank));
    return {};
  }

  bool usable(Rank peer, Round min_clock) const {
    return board_[peer].params != nullptr && board_[peer].clock >= min_clock;
  }

  // Once every rank still in has contributed: the weighted mean, summed in
  // rank order as a bsp shard sums a clock (the same bits).
  void complete_round(std::vector<Ready>& wake) {
    Rank live = 0;
    for (Rank r = 0; r < n_; ++r) live += !left_[r];
    if (contributed_ == 0 || contributed_ < live) return;
    double total = 0;
    for (const Contribution& c : pending_)
      if (c.in) total += c.weight;
    mean_.clear();
    if (total > 0) {
      mean_.assign(length_, 0.0f);
      for (const Contribution& c : pending_) {
        if (!c.in || c.weight <= 0) continue;
        const float weight = static_cast<float>(c.weight / total);
        const float* g = c.data.data();
        for (std::size_t i = 0; i < mean_.size(); ++i) mean_[i] += weight * g[i];
      }
    }
    total_ = total;
    for (Contribution& c : pending_) {
      if (!c.in) continue;
      wake.push_back(std::move(c.ready));
      c = {};
    }
    contributed_ = 0;
  }

  // Answers every gossip whose peers have all published recent enough
  // copies (or left).
  void release_waits(std::vector<Ready>& wake) {
    for (Rank r = 0; r < n_; ++r) {
      Wait& w = waits_[r];
      if (!w.active) continue;
      const bool ready = std::all_of(w.peers.begin(), w.peers.end(),
                                     [&](Rank p) { return usable(p, w.min_clock) || left_[p]; });
      if (!ready) continue;
      for (Rank p : w.peers)
        if (usable(p, w.min_clock)) delivered_[r].push_back({p, board_[p].clock, board_[p].params});
      wake.push_back(std::move(w.ready));
      w = {};
    }
  }

  mutable std::mutex mu_;
  Rank n_;
  std::vector<bool> left_;
  // The all-reduce in progress and the last one's result.
  std::vector<Contribution> pending_;
  std::size_t contributed_ = 0;
  Round round_ = 0;
  std::size_t length_ = 0;
  std::vector<float> mean_;
  double total_ = 0;
  // Gossip: each rank's latest copy, a buffer to recycle, its wait, and the
  // copies its last wait was answered with.
  std::vector<Published> board_;
  std::vector<std::shared_ptr<std::vector<float>>> spare_;
  std::vector<Wait> waits_;
  std::vector<std::vector<PeerCopy>> delivered_;
};

}  // namespace

std::shared_ptr<Collective> make_local_collective(Rank ranks) { return std::make_shared<LocalCollective>(ranks); }

}  // namespace asgd::messaging
