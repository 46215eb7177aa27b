// The fault-injecting wrapper tests put around a real transport. Faults are
// decided per send() call by a seeded generator, four draws per call in a
// fixed order, so a seed and the same sequence of calls give the same faults.
// When several fire for one message: a drop wins; a duplicate doubles
// whatever happens to the message; a delay wins over a reorder.

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "base/random.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {
namespace {

using Clock = std::chrono::steady_clock;

// How often receive() retries a due message the inner transport would not
// take (its peer's queue was full).
constexpr std::chrono::milliseconds kRetryBlocked{1};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, FaultPlan plan)
      : inner_(std::move(inner)), plan_(plan), rng_(plan.seed) {}

  Result<std::string> bind(const std::string& endpoint) override { return inner_->bind(endpoint); }
  Result<PeerId> connect(const std::string& endpoint) override { return inner_->connect(endpoint); }
  Status reconnect(const PeerId& peer, const std::string& endpoint) override {
    return inner_->reconnect(peer, endpoint);
  }
  void pause_bound(bool paused) override { inner_->pause_bound(paused); }
  Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) override {
    return inner_->set_bound_limits(max_part_bytes, max_connections);
  }

  Result<bool> send(const PeerId& peer, Message message) override {
    const auto now = Clock::now();
    flush_due(now);
    const bool drop = chance(plan_.drop);
    const bool duplicate = chance(plan_.duplicate);
    const bool reorder = chance(plan_.reorder);
    const bool delay = chance(plan_.delay);
    if (drop) {
      ++faults_.injected_drops;
      return true;
    }
    Pending p{peer, std::move(message), duplicate ? 2 : 1, now};
    if (duplicate) ++faults_.injected_duplicates;
    if (delay) {
      ++faults_.injected_delays;
      p.due = now + plan_.delay_by;
      // delay_by is fixed, so this is an append; upper_bound keeps equal
      // due times in send order.
      auto at = std::upper_bound(delayed_.begin(), delayed_.end(), p.due,
                                 [](Clock::time_point t, const Pending& q) { return t < q.due; });
      delayed_.insert(at, std::move(p));
      return true;
    }
    // One message held at a time: the one that releases it is never held.
    if (reorder && !held_) {
      ++faults_.injected_reorders;
      p.due = now + plan_.delay_by;
      held_ = std::move(p);
      return true;
    }
    Result<bool> r = send_pending(p);
    if (!r.ok() || !*r) return r;
    if (held_) {
      Result<bool> h = send_pending(*held_);
      if (!h.ok() || *h) held_.reset();  // would block: it stays held until later
    }
    return true;
  }

  Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
    while (true) {
      const auto now = Clock::now();
      const bool blocked = !flush_due(now);
      auto wait = deadline - now;
      if (auto due = next_due()) wait = std::min(wait, blocked ? Clock::duration(kRetryBlocked) : *due - now);
      wait = std::max(wait, Clock::duration::zero());
      auto r = inner_->receive(std::chrono::ceil<std::chrono::milliseconds>(wait));
      if (!r.ok() || r->has_value()) return r;
      if (Clock::now() >= deadline) return r;
    }
  }

  void wake() override { inner_->wake(); }
  bool watch(int fd) override { return inner_->watch(fd); }
  std::vector<Refusal> take_refusals() override { return inner_->take_refusals(); }

  TransportStats stats() const override {
    TransportStats s = inner_->stats();
    s.injected_drops += faults_.injected_drops;
    s.injected_duplicates += faults_.injected_duplicates;
    s.injected_reorders += faults_.injected_reorders;
    s.injected_delays += faults_.injected_delays;
    return s;
  }

 private:
  struct Pending {
    PeerId peer;
    Message message;
    int copies;
    Clock::time_point due;  ///< when a delayed or held message goes out at the latest
  };

  bool chance(double p) {
    // 53 random bits: uniform in [0, 1), so p = 0 never fires and p = 1 always does.
    const double u = static_cast<double>(rng_.next() >> 11) * 0x1p-53;
    return u < p;
  }

  // Sends each copy (copies share the parts' bytes). The result is the first
  // copy's; a duplicate the inner transport refuses is simply lost.
  Result<bool> send_pending(const Pending& p) {
    Result<bool> first = inner_->send(p.peer, p.message);
    if (!first.ok() || !*first) return first;
    for (int i = 1; i < p.copies; ++i) (void)inner_->send(p.peer, p.message);
    return true;
  }

  // Sends the delayed and held messages that are due. A message whose late
  // send fails is lost, as a dropped one would be: its send() already said
  // it was queued. Returns false when one would block (it is retried later).
  bool flush_due(Clock::time_point now) {
    while (!delayed_.empty() && delayed_.front().due <= now) {
      Result<bool> r = send_pending(delayed_.front());
      if (r.ok() && !*r) return false;
      delayed_.pop_front();
    }
    if (held_ && held_->due <= now) {
      Result<bool> r = send_pending(*held_);
      if (r.ok() && !*r) return false;
      held_.reset();
    }
    return true;
  }

  std::optional<Clock::time_point> next_due() const {
    std::optional<Clock::time_point> due;
    if (!delayed_.empty()) due = delayed_.front().due;
    if (held_ && (!due || held_->due < *due)) due = held_->due;
    return due;
  }

  std::unique_ptr<Transport> inner_;
  FaultPlan plan_;
  Rng rng_;
  std::deque<Pending> delayed_;  // in due order
  std::optional<Pending> held_;  // reordered: goes out after the next message, or when due
  TransportStats faults_;        // only the injected_* counters are used
};

}  // namespace

std::unique_ptr<Transport> make_faulty_transport(std::unique_ptr<Transport> inner, FaultPlan plan) {
  return std::make_unique<FaultyTransport>(std::move(inner), plan);
}

}  // namespace asgd::messaging
