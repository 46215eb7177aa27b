#pragma once
// The transport: moves multipart messages between processes, and nothing
// else (no framing, no serialization: messaging/wire.hpp does that). One
// narrow interface: ZeroMQ over tcp, ipc or inproc (the in-process
// transport tests use), and a fault-injecting wrapper (drop, delay,
// duplicate, reorder) that tests put around it.
//
// Model: a process binds at most one listening endpoint (peers connect to it
// and are known by the id their first message arrives with) and connects to
// any number of endpoints (each connection gets a PeerId at connect time).
// send() and receive() name peers by PeerId either way.
//
// Not thread-safe: one thread (a bridge's I/O thread) owns a transport.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd::messaging {

/// A contiguous run of bytes and what keeps it alive. A transport that can
/// send without copying (ZeroMQ's zmq_msg_init_data) holds `owner` until the
/// bytes are on the wire; dropping the last reference frees them. That last
/// reference may be dropped on a ZeroMQ I/O thread.
struct Part {
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
  /// Set by a transport on a received part whose bytes nobody else can
  /// read or write (a fresh receive buffer over tcp or ipc; not inproc,
  /// where the bytes may be the sender's): the receiver may write them.
  bool exclusive = false;

  /// A part that owns a copy of `bytes`.
  static Part copy_of(std::span<const std::byte> bytes);
  /// A part that takes ownership of `v` (no copy).
  template <class T>
  static Part take(std::vector<T>&& v) {
    auto holder = std::make_shared<std::vector<T>>(std::move(v));
    Part p;
    p.bytes = std::as_bytes(std::span<const T>(*holder));
    p.owner = std::move(holder);
    return p;
  }
};

/// One message: its parts, in order (ZeroMQ multipart).
using Message = std::vector<Part>;

/// Names a peer: "c:N" for the N-th endpoint this transport connected to,
/// "r:IDENTITY" for a peer that connected to our bound endpoint.
using PeerId = std::string;

struct Incoming {
  PeerId from;
  Message message;
};

/// Limits every transport enforces.
struct TransportLimits {
  std::size_t max_parts = 8;                       ///< a message with more is dropped and counted
  std::size_t max_message_bytes = 512u << 20;      ///< the sum of its parts; larger is dropped and counted
  int send_high_water_mark = 1000;                 ///< messages queued per peer before send() reports would-block
  int receive_high_water_mark = 1000;
};

struct TransportStats {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  std::uint64_t dropped_oversized = 0;  ///< incoming messages over the limits
  // Faults a FaultyTransport injected into send(); zero for other transports.
  std::uint64_t injected_drops = 0;
  std::uint64_t injected_duplicates = 0;
  std::uint64_t injected_reorders = 0;
  std::uint64_t injected_delays = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  /// Starts listening on `endpoint` ("tcp://127.0.0.1:5555", "tcp://*:0",
  /// "ipc:///tmp/x", "inproc://x"). Returns the endpoint actually bound
  /// (with the port filled in for tcp port 0). Errors: io_error naming it.
  virtual Result<std::string> bind(const std::string& endpoint) = 0;

  /// Connects to a peer's bound endpoint. Errors: invalid_argument for a
  /// malformed endpoint, io_error otherwise.
  virtual Result<PeerId> connect(const std::string& endpoint) = 0;

  /// Queues `message` for `peer`. Returns false when the peer's queue is at
  /// its high-water mark ("would block": try again later), true when queued.
  /// Errors: not_found for an unknown peer, invalid_argument for a message
  /// with no parts, io_error.
  virtual Result<bool> send(const PeerId& peer, Message message) = 0;

  /// Waits up to `timeout` for the next message from any peer; nullopt when
  /// none came (not an error). Errors: io_error.
  virtual Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) = 0;

  virtual TransportStats stats() const = 0;

  /// Makes a receive() in progress (or the next one) return at once.
  /// The one call that is thread-safe: other threads use it to hand the
  /// owning thread new work.
  virtual void wake() = 0;
};

/// ZeroMQ: one ROUTER for the bound endpoint, one DEALER per connection,
/// its own zmq context (no globals: two transports in one process are
/// independent). Sends multipart messages without copying the parts.
std::unique_ptr<Transport> make_zmq_transport(TransportLimits limits = {});

/// What a FaultyTransport does to outgoing messages, each with its
/// probability, decided by a seeded generator (a seed gives the same faults).
struct FaultPlan {
  double drop = 0.0;
  double duplicate = 0.0;
  double reorder = 0.0;                          ///< hold a message back and send it after the next one (or after `delay_by` if none comes)
  double delay = 0.0;                            ///< hold a message for `delay_by` before sending it
  std::chrono::milliseconds delay_by{20};
  std::uint64_t seed = 1;
};

/// Wraps `inner`, injecting the plan's faults into send(); delayed and
/// reordered messages go out on later send() or receive() calls.
std::unique_ptr<Transport> make_faulty_transport(std::unique_ptr<Transport> inner, FaultPlan plan);

}  // namespace asgd::messaging
