// The collective across processes over ZeroMQ (messaging/collective.hpp):
// one object per rank, each in its own process (or, in tests, several in
// one). A rank binds a PULL socket, connects a PUSH socket to every other
// rank's, and runs the exchange on an I/O thread of its own, driven by the
// messages that arrive, so a call never blocks its caller.
//
// All-reduce: a ring over the live ranks, reduce-scatter then all-gather.
// The vector is cut into one chunk per rank; at ring step s < m - 1 a rank
// folds its own data into the piece its left neighbour sent (a running
// samples-weighted mean, the weight so far in the header: wire version 5)
// and passes it on; after m - 1 steps each holds one chunk's mean over
// every rank, and m - 1 more steps pass those around. Each link carries
// 2 (m - 1) / m of the vector, in both directions at once. The sum of each
// chunk is taken in ring order, the same in every run.
//
// Membership: a rank that leaves (out of data) tells every other, and a
// rank whose process died is dropped when its owner is told (leave(r));
// either way a round begun with it starts again without it. Messages carry
// the round and the set of ranks they were sent for, so a late one is told
// apart from a current one; ones that come early (a neighbour a step ahead,
// or one that already knows of a departure) wait in a stash. A rank that
// died mid-round may have let some ranks finish it: they answer the others'
// new start with the round's result (serve_result).
//
// Gossip: a rank sends its copy to the ranks that will average with it and
// keeps the latest copy each peer sent it. The sockets, and the checks every
// message passes before use, are messaging/collective_links.hpp's. With
// CURVE (--auth-keys) nothing goes through shared memory.
#include <spdlog/fmt/fmt.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "base/log.hpp"
#include "messaging/collective.hpp"
#include "messaging/collective_links.hpp"
#include "messaging/collective_ring.hpp"
#include "messaging/collective_wire.hpp"
#include "messaging/shm_allreduce.hpp"

namespace asgd::messaging {

namespace {

using collective_wire::Header;
using collective_wire::Kind;

std::uint64_t bit(Rank r) { return std::uint64_t{1} << r; }


class ZmqCollective final : public NetworkCollective {
 public:
  ZmqCollective(std::size_t max_values, std::optional<CurveOptions> curve, std::string name)
      : links_(max_values, std::move(curve), std::move(name)) {}

  ~ZmqCollective() override {
    stop_ = true;
    wake();
    if (io_.joinable()) io_.join();  // it reads shm_ (a departure)
    shm_.reset();  // its thread may call back into this object, which is still whole
  }

  Status bind(const std::string& where) { return links_.bind(where); }

  const std::string& endpoint() const override { return links_.endpoint(); }

  Status connect(Rank rank, const std::vector<std::string>& endpoints) override {
    const auto ranks = static_cast<Rank>(endpoints.size());
    if (ranks == 0 || ranks > kMaxCollectiveRanks || rank >= ranks)
      return Status::InvalidArgument(
          fmt::format("a collective across processes has 1 to {} ranks, not rank {} of {}", kMaxCollectiveRanks, rank,
                      ranks));
    if (io_.joinable()) return Status::InvalidArgument("the collective is connected already");
    if (Status s = links_.connect(rank, endpoints); !s.ok()) return s;
    {
      std::lock_guard lock(mu_);
      rank_ = rank;
      n_ = ranks;
      live_ = ranks == kMaxCollectiveRanks ? ~0ULL : bit(ranks) - 1;
      latest_.assign(ranks, {});
    }
    if (links_.authenticated() && ranks > 1)
      logger().info("worker {}'s collective: authenticated and encrypted (CURVE); its all-reduce goes round the ring "
                    "over tcp, never through shared memory", rank_);
    else if (shared_memory_ && ranks > 1 && allreduces_)
      shm_ = ShmAllreduce::join(endpoints, rank_, settle_);
    else if (ranks > 1 && allreduces_)
      logger().info("worker {}'s collective: --shared-memory off; its all-reduce goes round the ring", rank_);
    io_ = std::thread([this] { run(); });
    return {};
  }

  Rank size() const override {
    std::lock_guard lock(mu_);
    return n_;
  }

  Status allreduce_mean(Rank rank, Round round, std::span<const float> data, double weight, Ready ready) override {
    {
      std::lock_guard lock(mu_);
      if (Status s = check_call(rank); !s.ok()) return s;
      if (data.size() > links_.max_values())
        return Status::InvalidArgument(fmt::format("rank {}: an all-reduce of {} values is over the limit", rank, data.size()));
      if (shm_ && !ring_only_) {
        in_shm_ = true;
        shm_->start(round, data, weight, [this, round, data, weight, ready = std::move(ready)](ShmAllreduce::Mode m) {
          if (m == ShmAllreduce::Mode::shared_memory) {
            {
              std::lock_guard done(mu_);
              in_shm_ = false;
              via_shm_ = true;
            }
            ready();
            return;
          }
          {
            std::lock_guard done(mu_);  // not every rank shares this host: the ring, from this round on
            in_shm_ = false;
            ring_only_ = true;
            start_ring(round, data, weight, ready);
          }
          wake();
        });
        return {};
      }
      start_ring(round, data, weight, std::move(ready));
    }
    wake();
    return {};
  }

  std::span<const float> mean(Rank) const override {
    std::lock_guard lock(mu_);
    if (via_shm_) return shm_->mean();
    return total_ > 0 ? std::span<const float>(*result_) : std::span<const float>();
  }
  double total_weight(Rank) const override {
    std::lock_guard lock(mu_);
    return via_shm_ ? shm_->total() : total_;
  }

  Status gossip(Rank rank, Round clock, std::span<const float> params, const std::vector<Rank>& audience,
                const std::vector<Rank>& peers, Round min_clock, Ready ready) override {
    {
      std::lock_guard lock(mu_);
      if (Status s = check_call(rank); !s.ok()) return s;
      for (Rank p : peers)
        if (p >= n_ || p == rank_) return Status::InvalidArgument(fmt::format("rank {} named peer {} of {}", rank, p, n_));
      for (Rank p : audience)
        if (p >= n_ || p == rank_) return Status::InvalidArgument(fmt::format("rank {} sends to rank {} of {}", rank, p, n_));
      if (params.size() > links_.max_values())
        return Status::InvalidArgument(fmt::format("rank {}: a copy of {} values is over the limit", rank, params.size()));
      gossip_ = {true, clock, params, audience, peers, min_clock, std::move(ready)};
      delivered_.clear();
      ops_.push_back(Op::gossip);
    }
    wake();
    return {};
  }

  std::vector<PeerCopy> peer_copies(Rank) const override {
    std::lock_guard lock(mu_);
    return delivered_;
  }

  void leave(Rank rank) override {
    {
      std::lock_guard lock(mu_);
      if (rank >= n_) return;
      if (rank == rank_) {
        if (left_self_) return;
        left_self_ = true;
        ops_.push_back(Op::leave);
      } else {
        gone_.push_back(rank);  // its process died: the I/O thread stops waiting for it
        ops_.push_back(Op::gone);
      }
    }
    wake();
  }

  std::string waiting_for(Rank) const override {
    std::lock_guard lock(mu_);
    if (in_shm_) return shm_->waiting_for();
    if (reduce_.active) {
      if (!reduce_.begun) return fmt::format("the all-reduce of step {}: not begun yet", reduce_.round);
      const Rank left = ring_.left();
      return fmt::format("the all-reduce of step {}: ring step {} of {} from worker {}", reduce_.round,
                         ring_.expect() + 1, 2 * (ring_.members() - 1), left);
    }
    if (gossip_.active) {
      std::string who;
      for (Rank p : gossip_.peers)
        if (!usable(p, gossip_.min_clock) && (live_ & bit(p)))
          who += fmt::format("{}worker {} (its copy is from clock {})", who.empty() ? "" : ", ", p,
                             latest_[p].params ? std::to_string(latest_[p].clock) : std::string("none"));
      return fmt::format("gossip: a copy from clock {} or later from {}", gossip_.min_clock, who);
    }
    return {};
  }

  std::uint64_t rejected() const override { return links_.rejected() + out_of_step_.load(); }
  std::uint64_t unsent() const override { return links_.unsent(); }
  std::string refused() const override { return links_.refused(); }
  void set_half_precision(bool on) override { links_.set_half_precision(on); }
  void set_allreduces(bool will) override { allreduces_ = will; }
  void set_shared_memory(bool on, std::chrono::milliseconds settle) override {
    shared_memory_ = on;
    settle_ = settle;
  }

 private:
  enum class Op { reduce, gossip, leave, gone };

  void start_ring(Round round, std::span<const float> data, double weight, Ready ready) {
    Reduce& r = reduce_;  // reset when its last round completed (complete_round)
    r.active = true;
    r.round = round;
    r.data = data;
    r.weight = weight;
    r.ready = std::move(ready);
    via_shm_ = false;
    ops_.push_back(Op::reduce);
  }
  struct Reduce {
    bool active = false;
    bool begun = false;
    Round round = 0;
    std::span<const float> data;
    double weight = 0;
    Ready ready;
    std::uint64_t mask = 0;  // the live ranks it was begun with (its ring: ring_)
  };
  struct Gossip {
    bool active = false;
    Round clock = 0;
    std::span<const float> params;
    std::vector<Rank> audience, peers;
    Round min_clock = 0;
    Ready ready;
  };
  struct Latest {
    Round clock = 0;
    std::shared_ptr<const std::vector<float>> params;
  };
  using StashKey = std::tuple<Round, std::uint64_t, std::uint32_t, std::uint64_t>;  // round, mask, step, offset
  struct Stashed {
    std::uint32_t step = 0, chunk = 0;
    std::uint64_t offset = 0;
    double weight = 0;
    std::vector<float> values;
  };

  Status check_call(Rank rank) const {
    if (n_ == 0) return Status::InvalidArgument("the collective is not connected yet");
    if (rank != rank_) return Status::InvalidArgument(fmt::format("rank {} called the collective of rank {}", rank, rank_));
    if (left_self_) return Status::InvalidArgument(fmt::format("rank {} called the collective after it left", rank));
    if (reduce_.active || gossip_.active || in_shm_)
      return Status::InvalidArgument(fmt::format("rank {} called the collective with a call in flight", rank));
    return {};
  }

  bool usable(Rank p, Round min_clock) const { return latest_[p].params && latest_[p].clock >= min_clock; }

  void wake() { links_.wake(); }

  // The I/O thread: local calls and arriving messages, until stopped.
  void run() {
    while (!stop_) {
      try {
        const bool arrived = links_.wait(std::chrono::milliseconds(200));
        std::vector<Ready> wake_up;
        {
          std::lock_guard lock(mu_);
          for (Op op : ops_) start(op, wake_up);
          ops_.clear();
        }
        if (arrived)
          while (auto m = links_.receive()) {
            std::lock_guard lock(mu_);
            handle(m->header, m->values, wake_up);
          }
        for (auto& r : wake_up) r();
      } catch (const zmq::error_t& e) {
        if (stop_) return;
        logger().warn("collective rank {}: {}", rank_, e.what());
      }
    }
  }

  void start(Op op, std::vector<Ready>& wake_up) {
    switch (op) {
      case Op::reduce:
        begin_round(wake_up);
        break;
      case Op::gossip:
        for (Rank p : gossip_.audience)
          if (live_ & bit(p)) send(p, {.kind = Kind::gossip, .round = gossip_.clock}, gossip_.params);
        release_gossip(wake_up);
        break;
      case Op::leave:
        for (Rank p = 0; p < n_; ++p)
          if (p != rank_ && (live_ & bit(p))) send(p, {.kind = Kind::leave, .round = last_round_}, {});
        live_ &= ~bit(rank_);
        if (shm_) shm_->leave(rank_);  // nobody waits for it in shared memory either
        break;
      case Op::gone:
        for (Rank p : gone_) drop(p, wake_up);
        gone_.clear();
        break;
    }
  }

  // Rank `p` left, or its process died: a round begun with it starts again
  // without it, and a gossip stops waiting for it.
  void drop(Rank p, std::vector<Ready>& wake_up) {
    if (!(live_ & bit(p))) return;
    live_ &= ~bit(p);
    if (shm_) shm_->leave(p);
    if (reduce_.active && reduce_.begun && (reduce_.mask & bit(p))) begin_round(wake_up);
    release_gossip(wake_up);
  }

  // Begins (or begins again, after a departure) the round in flight.
  void begin_round(std::vector<Ready>& wake_up) {
    Reduce& r = reduce_;
    r.begun = true;
    r.mask = live_;
    std::vector<Rank> ring;
    for (Rank p = 0; p < n_; ++p)
      if (live_ & bit(p)) ring.push_back(p);
    ring_.begin(std::move(ring), rank_, r.data, r.weight, links_.half_precision(), ring_send_);
    if (ring_.done()) {
      complete_round(wake_up);
      return;
    }
    take_stashed(wake_up);
  }

  // A piece of the round in flight, where it is expected: the ring adds or
  // copies it and passes it on at once, so that a link carries one piece
  // while the next is summed.
  void take_piece(const RingReduce::Piece& piece, std::vector<Ready>& wake_up) {
    if (!ring_.take(piece, ring_send_)) {
      ++out_of_step_;  // a peer out of step: the round waits, and times out naming it
      return;
    }
    if (ring_.done()) complete_round(wake_up);
  }

  // A rank that died mid-round may have sent some ranks all they needed to
  // finish it and others not: those start it again without it, and a rank
  // that finished it hears of that from their pieces. It then sends every
  // other rank the round's result, which a rank still in that round takes
  // as its own, so that every copy takes the same step.
  void serve_result(Round round) {
    if (served_ && *served_ == round) return;
    served_ = round;
    logger().info("worker {}'s collective: a worker starts step {} again after a death; sent it our result", rank_,
                  round);
    const std::span<const float> mean = total_ > 0 ? std::span<const float>(*result_) : std::span<const float>();
    for (Rank p = 0; p < n_; ++p)
      if (p != rank_ && (live_ & bit(p))) send(p, {.kind = Kind::result, .round = round, .weight = total_}, mean, result_);
  }

  void take_result(std::span<const float> values, double total, std::vector<Ready>& wake_up) {
    if (!ring_.take_result(values, total)) {
      ++out_of_step_;
      return;
    }
    complete_round(wake_up);
  }

  void complete_round(std::vector<Ready>& wake_up) {
    Reduce& r = reduce_;
    last_round_ = r.round;
    any_done_ = true;
    total_ = ring_.total();
    result_ = ring_.result();  // the mean, until this rank's next call
    wake_up.push_back(std::move(r.ready));
    r = {};
    // Pieces of rounds now past will never be wanted.
    stash_.erase(stash_.begin(), stash_.lower_bound({last_round_ + 1, 0, 0, 0}));
  }

  void take_stashed(std::vector<Ready>& wake_up) {
    while (reduce_.active && reduce_.begun && !ring_.done()) {
      auto it = stash_.find({reduce_.round, reduce_.mask, ring_.expect(), ring_.piece_at()});
      if (it == stash_.end()) return;
      Stashed s = std::move(it->second);
      stash_.erase(it);
      take_piece({s.step, s.chunk, s.offset, s.weight, s.values}, wake_up);
    }
  }

  void release_gossip(std::vector<Ready>& wake_up) {
    Gossip& g = gossip_;
    if (!g.active) return;
    for (Rank p : g.peers)
      if (!usable(p, g.min_clock) && (live_ & bit(p))) return;
    for (Rank p : g.peers)
      if (usable(p, g.min_clock)) delivered_.push_back({p, latest_[p].clock, latest_[p].params});
    wake_up.push_back(std::move(g.ready));
    g = {};
  }

  void send(Rank to, Header h, std::span<const float> values, CollectiveLinks::Owner owner = {}) {
    (void)links_.send(to, h, values, std::move(owner));
  }

  void handle(const Header& h, std::span<const float> values, std::vector<Ready>& wake_up) {
    switch (h.kind) {
      case Kind::chunk: {
        Reduce& r = reduce_;
        if (r.active && r.begun && h.round == r.round && h.mask == r.mask && h.step == ring_.expect() &&
            h.offset == ring_.piece_at()) {
          take_piece({h.step, h.chunk, h.offset, h.weight, values}, wake_up);
          take_stashed(wake_up);
        } else if (!any_done_ || h.round > last_round_) {  // early: kept; a past round's: dropped
          stash_[{h.round, h.mask, h.step, h.offset}] = {h.step, h.chunk, h.offset, h.weight,
                                                         std::vector<float>(values.begin(), values.end())};
        } else if (h.round == last_round_) {
          serve_result(h.round);  // nothing of a finished round is sent to us, unless a rank starts it again
        }
        break;
      }
      case Kind::result:
        if (reduce_.active && reduce_.begun && h.round == reduce_.round) take_result(values, h.weight, wake_up);
        break;
      case Kind::gossip:
        if (!latest_[h.from].params || h.round > latest_[h.from].clock)
          latest_[h.from] = {h.round, std::make_shared<const std::vector<float>>(values.begin(), values.end())};
        release_gossip(wake_up);
        break;
      case Kind::leave:
        drop(h.from, wake_up);
        break;
    }
  }

  Rank rank_ = 0, n_ = 0;  // set by connect(), under mu_
  CollectiveLinks links_;
  std::thread io_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> out_of_step_{0};  // well-formed pieces the ring could not take

  mutable std::mutex mu_;
  std::vector<Op> ops_;       // local calls the I/O thread has not begun
  bool left_self_ = false;
  std::uint64_t live_ = 0;    // bit r: rank r has not left
  std::vector<Rank> gone_;    // ranks whose processes died, for the I/O thread
  Reduce reduce_;
  Round last_round_ = 0;   // the last round done, when any_done_
  std::optional<Round> served_;  // the last round whose result went to the others
  bool any_done_ = false;
  bool shared_memory_ = true;  // set before connect(), with how long ranks have to join it
  bool allreduces_ = true;     // set_allreduces(): false for gossip's group
  std::chrono::milliseconds settle_{5000};
  std::unique_ptr<ShmAllreduce> shm_;  // when every rank may share this host
  bool ring_only_ = false;  // they do not: every round goes round the ring
  bool in_shm_ = false;     // a round is in flight in shared memory
  bool via_shm_ = false;    // the last round went through it (its mean is there)
  RingReduce ring_;  // the all-reduce's ring, kept between rounds for its buffers
  RingReduce::Buffer result_;  // the last round's mean (when total_ > 0)
  double total_ = 0;
  const RingReduce::Send ring_send_ = [this](Rank to, const RingReduce::Piece& p, const RingReduce::Buffer& owner) {
    send(to,
         {.kind = Kind::chunk, .step = p.step, .round = reduce_.round, .mask = reduce_.mask, .offset = p.offset,
          .chunk = p.chunk, .weight = p.weight},
         p.values, owner);
  };
  std::map<StashKey, Stashed> stash_;
  Gossip gossip_;
  std::vector<Latest> latest_;
  std::vector<PeerCopy> delivered_;
};

}  // namespace

Result<std::shared_ptr<NetworkCollective>> make_zmq_collective(const std::string& listen,
                                                               std::optional<CurveOptions> curve, std::string name,
                                                               std::size_t max_values) {
  auto c = std::make_shared<ZmqCollective>(max_values, std::move(curve), std::move(name));
  if (Status s = c->bind(listen); !s.ok()) return s;
  return std::shared_ptr<NetworkCollective>(std::move(c));
}

}  // namespace asgd::messaging
