#pragma once
// Internal to the workers' collective across processes
// (messaging/zmq_collective.cpp): one rank's sockets and what goes on them.
// The rank binds a PULL socket, connects a PUSH socket to every other
// rank's, and has an inproc pair that wakes its I/O thread. A message is a
// collective_wire::Header and its values; this is where the header's
// sender, count, coding and CRC are set, and where what comes in is checked
// (collective_wire::well_formed) before the protocol sees it.
//
// A send waits at most kSendWait for room in the receiver's queue (ZeroMQ's
// high-water mark of 1000 messages, beyond what the kernel buffers): a rank
// that reads nothing for that long is stuck (stopped, swapping, a debugger),
// and the I/O thread, which serves every other rank too, does not wait on
// it. The message is dropped and counted (unsent()), the rank is named in
// the log, and later sends to it do not wait at all until one goes through
// again. It is mostly gossip that fills a queue: a ring round stops at a
// rank that reads nothing after a step's pieces to it (under 1000 unless a
// chunk passes 256M floats), while a gossiping rank may go on sending
// copies to a peer it does not wait for; a copy dropped is one the next
// supersedes (a peer keeps the latest).
//
// Every call but wake() is the I/O thread's (after bind and connect).

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "asgd/status.hpp"
#include "messaging/collective.hpp"
#include "messaging/collective_wire.hpp"
#include "messaging/curve_auth.hpp"
#include "messaging/zmq_curve.hpp"
#include "messaging/zmq_gatekeeper.hpp"

namespace asgd::messaging {

constexpr std::chrono::milliseconds kSendWait{2000};

class CollectiveLinks {
 public:
  /// A message that came in and passed the checks: its values as float32,
  /// valid until the next receive().
  struct Message {
    collective_wire::Header header;
    std::span<const float> values;
  };
  using Owner = std::shared_ptr<std::vector<float>>;

  /// At most `max_values` floats a message; with `curve`, CURVE on every
  /// socket (a refused peer is logged naming `name`).
  CollectiveLinks(std::size_t max_values, std::optional<CurveOptions> curve, std::string name);

  /// Listens at `where`. Errors: io_error.
  Status bind(const std::string& where);
  /// Where the others connect (with CURVE, carrying our public key).
  const std::string& endpoint() const { return endpoint_; }
  /// Connects as rank `rank` to every other of `endpoints` (`endpoints[r]`:
  /// rank r's). Errors: invalid_argument (a malformed or refused key),
  /// io_error.
  Status connect(Rank rank, const std::vector<std::string>& endpoints);

  /// Sends `h` and `values` to rank `to` (not ourselves), setting the
  /// header's sender, count, coding (float16 for a chunk with half
  /// precision on) and CRC. The values are copied, or with `owner` (which
  /// holds them) sent without a copy, ZeroMQ keeping a reference until it
  /// has sent them. False when the message was dropped (see above).
  bool send(Rank to, collective_wire::Header h, std::span<const float> values, Owner owner = {});

  /// Waits up to `timeout` for a message or a wake-up (whose pings it
  /// drains); true when a message may be waiting.
  bool wait(std::chrono::milliseconds timeout);
  /// The next message waiting, if any; malformed ones on the way are
  /// dropped and counted (the first one logged).
  std::optional<Message> receive();
  /// Wakes the I/O thread's wait. Any thread.
  void wake();

  void set_half_precision(bool on) { half_ = on; }
  bool half_precision() const { return half_; }
  /// With CURVE: authenticated and encrypted (and never through shared memory).
  bool authenticated() const { return curve_.has_value(); }
  std::size_t max_values() const { return max_values_; }
  std::uint64_t rejected() const { return rejected_.load(); }
  std::uint64_t unsent() const { return unsent_.load(); }
  /// Collective::refused(): noted by wait(). Any thread.
  std::string refused() const;

 private:
  static void release_owner(void*, void* hint);

  const std::size_t max_values_;
  std::optional<CurveOptions> curve_;
  const std::string name_;  // in the gatekeeper's log lines
  Rank rank_ = 0, n_ = 0;   // set by connect()
  zmq::context_t context_{1};
  std::unique_ptr<Gatekeeper> guard_;  // with CURVE; goes after pull_ closed (see Gatekeeper)
  zmq::socket_t pull_{context_, zmq::socket_type::pull};
  zmq::socket_t wake_rx_{context_, zmq::socket_type::pull};
  zmq::socket_t wake_tx_{context_, zmq::socket_type::push};
  std::mutex wake_mu_;
  std::vector<zmq::socket_t> push_;  // push_[r]: to rank r (none to ourselves)
  std::vector<bool> stuck_;          // stuck_[r]: the last send to rank r found no room for kSendWait
  std::vector<std::unique_ptr<RefusalWatch>> watches_;  // watches_[r]: push_[r]'s, with CURVE; after push_
  mutable std::mutex refused_mu_;
  std::string refused_;  // the first refusal, as Collective::refused() says it
  void note_refusals();
  std::string endpoint_;
  std::atomic<std::uint64_t> rejected_{0}, unsent_{0};
  bool half_ = false;                  // chunks as float16 (set before connect())
  std::vector<std::uint16_t> halves_;  // a piece on its way out, as float16
  std::vector<float> scratch_;         // and one that came in, when it cannot be read in place
  std::vector<zmq::message_t> held_;   // the parts of the message receive() returned last
};

}  // namespace asgd::messaging
