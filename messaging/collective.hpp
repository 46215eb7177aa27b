#pragma once
// The collective layer of the decentralized policies (policies/decentralized.hpp):
// what workers exchange with each other, behind one narrow interface.
//
//   allreduce_mean: every live rank contributes a vector and a weight for a
//     round; once all have, each gets the weighted mean, summed in rank order
//     (the same bits whatever order they arrived in).
//   gossip: a rank publishes its parameters at a clock and asks for the
//     latest copies of some peers, each from a clock >= min_clock; it is
//     answered once every peer still in the job has published one.
//
// Calls never block: `ready` is called (on whichever thread completed the
// call, possibly the caller's own, inside the call) once the result can be
// read with mean() or peer_copies(). A rank has at most one call in flight.
// make_local_collective is the in-process implementation: the ranks are
// threads of one process and share the vectors, no copy goes through a queue.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "asgd/status.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {

using Rank = std::uint32_t;
using Round = std::uint64_t;
/// Ranks a collective across processes takes at most (a round's membership
/// is a 64-bit mask, and the shared-memory segment has as many areas).
constexpr Rank kMaxCollectiveRanks = 64;

/// A peer's parameters as it published them.
struct PeerCopy {
  Rank rank = 0;
  Round clock = 0;  ///< the clock it published them at
  std::shared_ptr<const std::vector<float>> params;
};

class Collective {
 public:
  using Ready = std::function<void()>;
  virtual ~Collective() = default;

  /// Ranks in the group, departed ones included.
  virtual Rank size() const = 0;
  /// Across processes with CURVE: why another rank refused this rank's connection (its
  /// --auth-keys folder lacks this rank's key), naming it: no exchange
  /// with it can complete. Empty while none did. Thread-safe.
  virtual std::string refused() const { return {}; }

  /// Rank `rank`'s contribution to round `round`: `data` (unchanged until
  /// `ready`) with weight `weight` (its samples; 0: nothing to add, a step
  /// whose loss was not finite, and `data` is not read). Errors:
  /// invalid_argument for a rank out of range or departed, a call already in
  /// flight, a round other than the one the others are in, or a length that
  /// differs from theirs.
  virtual Status allreduce_mean(Rank rank, Round round, std::span<const float> data, double weight, Ready ready) = 0;
  /// After allreduce_mean's `ready`: the mean, valid until `rank`'s next
  /// call, and the weights summed (0: nobody added anything; the mean is
  /// then empty).
  virtual std::span<const float> mean(Rank rank) const = 0;
  virtual double total_weight(Rank rank) const = 0;

  /// Publishes `params` as rank `rank`'s copy at clock `clock` to
  /// `audience` (the ranks that will average with it), then waits for a copy
  /// at clock >= `min_clock` from each of `peers` that has not left. Errors
  /// as allreduce_mean's.
  virtual Status gossip(Rank rank, Round clock, std::span<const float> params, const std::vector<Rank>& audience,
                        const std::vector<Rank>& peers, Round min_clock, Ready ready) = 0;
  /// After gossip's `ready`: the copies of the peers it named that had not
  /// left, in the order named.
  virtual std::vector<PeerCopy> peer_copies(Rank rank) const = 0;

  /// Rank `rank` is done (out of data): nobody waits for it any more.
  virtual void leave(Rank rank) = 0;

  /// For a timeout's message: what rank `rank`'s call in flight waits for
  /// ("the all-reduce of round 12: ranks 1, 3 have not contributed"); empty
  /// when none is in flight.
  virtual std::string waiting_for(Rank rank) const = 0;
};

/// The in-process collective of `ranks` ranks.
std::shared_ptr<Collective> make_local_collective(Rank ranks);

/// One rank of a collective across processes (messaging/zmq_collective.cpp):
/// it listens first, before it knows its rank, so that its endpoint can be
/// announced, and connects to the others once every endpoint is known.
/// With CURVE options its endpoint carries its public key, it admits only
/// allowed keys, and it never uses shared memory. leave(r) of another rank
/// r says that r is gone (its process died): nobody waits for it any more.
class NetworkCollective : public Collective {
 public:
  /// Where it listens, as the others connect to it.
  virtual const std::string& endpoint() const = 0;
  /// Takes rank `rank` of endpoints.size() (at most 64), connects to every
  /// rank's endpoint (`endpoints[r]`: rank r's; its own is skipped) and
  /// starts exchanging; once only. Errors: invalid_argument (a rank out of
  /// range, too many ranks, connected already), io_error.
  virtual Status connect(Rank rank, const std::vector<std::string>& endpoints) = 0;
  /// Messages dropped on the way in: malformed, or out of step.
  virtual std::uint64_t rejected() const = 0;
  /// Messages dropped on the way out: a rank that took none of its messages
  /// for a while (messaging/collective_links.hpp), or a send that failed.
  virtual std::uint64_t unsent() const { return 0; }
  /// --compress fp16: an all-reduce's chunks go as float16 (half the bytes;
  /// sums stay float32, and every rank gets the same bits). Before connect().
  virtual void set_half_precision(bool on) = 0;
  /// Whether the all-reduce may go through shared memory when every rank
  /// turns out to run on this host (messaging/shm_allreduce.hpp; on by
  /// default). The first all-reduce settles it for the whole group: every
  /// rank joins by `settle` after connect() or the ring is used (ranks on
  /// other hosts never join). Before connect().
  virtual void set_shared_memory(bool on, std::chrono::milliseconds settle = std::chrono::seconds(5)) = 0;
  /// Whether the group will all-reduce (allreduce) or only pass copies
  /// (gossip, which never does): one that will not makes no shared-memory
  /// segment (each gossip job made one, left in /dev/shm by a worker 0
  /// killed). Before connect().
  virtual void set_allreduces(bool /*will*/) {}
};

/// A rank listening at `listen` ("tcp://127.0.0.1:*"), with `curve`
/// authenticated and encrypted (a refused peer is logged naming the
/// collective `name`); a message carries at most `max_values` floats.
/// Errors: io_error when it cannot listen there.
Result<std::shared_ptr<NetworkCollective>> make_zmq_collective(const std::string& listen,
                                                               std::optional<CurveOptions> curve = std::nullopt,
                                                               std::string name = "collective",
                                                               std::size_t max_values = std::size_t{1} << 30);

}  // namespace asgd::messaging
