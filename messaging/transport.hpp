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
// Not thread-safe: one thread (a bridge's I/O thread) owns a transport;
// wake() and send_now() may be called from any thread.

#include <array>
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
  /// The bound endpoint is where anyone who can reach it may connect, so
  /// its limits are set apart (Transport::set_bound_limits changes them):
  ///   - the largest single part a peer may send there (at most
  ///     max_message_bytes, which is what connections to other endpoints
  ///     get). A peer that announces a larger one loses its connection
  ///     before anything is allocated for the part. Give it the largest
  ///     part this process may legally be sent there: messaging/wire.hpp's
  ///     largest_part();
  std::size_t bound_max_part_bytes = 512u << 20;
  ///   - connections there at once (tcp, ipc): one accepted beyond it is
  ///     closed at once. Each may hold a part of up to bound_max_part_bytes
  ///     half received, so the two bound what strangers can make this
  ///     process hold.
  std::size_t bound_max_connections = 256;
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
  // Connections to our bound endpoint (tcp, ipc) that this transport
  // refused or dropped, with or without CURVE, each counted once and
  // logged at warn with the peer's address and why, a few lines a minute
  // at most: a handshake that failed (not ZeroMQ 3, a wrong mechanism, not
  // completed within 10 s, a peer that hung up in it; with CURVE, a key
  // not allowed), a part over bound_max_part_bytes or a protocol error
  // after the handshake, a connection over bound_max_connections. A peer
  // that leaves (closes or resets its side) is not refused.
  std::uint64_t refused = 0;
  std::uint64_t refused_over_limit = 0;  ///< of `refused`: over bound_max_connections
  // CURVE (zero without it): connection attempts to our bound endpoint.
  std::uint64_t auth_accepted = 0;  ///< handshakes completed with an allowed key
  std::uint64_t auth_rejected = 0;  ///< of `refused`: in the handshake: a key not allowed, no CURVE, a wrong server key, a bad handshake
  /// Connections this transport made (connect) whose peer's endpoint
  /// refused this process's CURVE key in the handshake: each connection
  /// counted once, its details in take_refusals().
  std::uint64_t refused_by_peers = 0;
  // Shared memory (make_shm_transport; zero for other transports).
  std::uint64_t shm_peers = 0;      ///< peers that accepted this transport's slots
  std::uint64_t shm_peers_gone = 0; ///< of those: let go since, their process gone (SharedMemoryOptions::peer_check_every)
  std::uint64_t shm_sent = 0;       ///< parts sent through a slot
  std::uint64_t shm_received = 0;   ///< parts received through a peer's slot
  std::uint64_t shm_fallbacks = 0;  ///< large parts to such a peer sent on the wire (every slot held, or over max_bytes)
  std::uint64_t shm_rejected = 0;   ///< descriptors dropped as malformed (a slot not offered, out of bounds, not written)
  std::uint64_t ring_sent = 0;      ///< messages written into a peer's ring instead of onto the wire
  std::uint64_t ring_received = 0;  ///< messages read from a peer's ring
};

/// A CurveZMQ key: 32 raw bytes (messaging/curve_auth.hpp reads and writes
/// them as Z85 text files).
using CurveKey = std::array<std::uint8_t, 32>;

/// Authentication and encryption with CurveZMQ (docs/security.md). A ZeroMQ
/// transport given these
///   - makes its bound endpoint a CURVE server with this keypair, and admits
///     a client only when the client proves it holds the secret half of a
///     key in `allowed` (a ZAP handler of its own, on its own thread, decides:
///     two transports in one process each have theirs). Every refused
///     attempt is counted (TransportStats::auth_rejected) and logged at warn
///     with the peer's address and key, as every refused connection is;
///   - connects as a CURVE client with this keypair, to a server whose public
///     key it must know: carried by the endpoint (with_server_key in
///     messaging/curve_auth.hpp), else `server_key`. A server key not in
///     `allowed` is refused: a process neither admits nor talks to a peer
///     outside the allow-list.
/// Everything sent over an admitted connection is encrypted. inproc
/// endpoints bypass ZeroMQ's security mechanisms (tests only).
struct CurveOptions {
  CurveKey public_key{};
  CurveKey secret_key{};
  std::vector<CurveKey> allowed;        ///< the allow-list: peers' public keys
  std::optional<CurveKey> server_key;   ///< for connect() to an endpoint that carries no key (the coordinator's)
};

/// A connection this transport made whose peer refused it in the
/// handshake: with CURVE, the peer's ZAP handler said no to this process's
/// key (its allow-list lacks it).
struct Refusal {
  PeerId peer;           ///< the connection, as connect() named it
  std::string endpoint;  ///< where it connects to (without the server's key)
  int zap_status = 0;    ///< the peer's answer: 400 (not allowed), 300 (try later), 500 (its error)
};

class Transport {
 public:
  virtual ~Transport() = default;

  /// Starts listening on `endpoint` ("tcp://127.0.0.1:5555", "tcp://*:0",
  /// "ipc:///tmp/x", "inproc://x"). Returns the endpoint actually bound
  /// (with the port filled in for tcp port 0; with CURVE on, followed by
  /// this transport's public key: with_server_key). Errors: io_error naming it.
  virtual Result<std::string> bind(const std::string& endpoint) = 0;

  /// Connects to a peer's bound endpoint (with CURVE on, one carrying the
  /// server's key, or CurveOptions::server_key is used). Errors:
  /// invalid_argument for a malformed endpoint, and with CURVE on for an
  /// unknown or not allowed server key; io_error otherwise.
  virtual Result<PeerId> connect(const std::string& endpoint) = 0;

  /// Points the connection `peer` at another endpoint (a peer restarted
  /// there; it may be the same one), keeping its PeerId. What was queued
  /// for the old endpoint and not yet sent is dropped. Errors: not_found
  /// for an unknown peer, then as connect().
  virtual Status reconnect(const PeerId& peer, const std::string& endpoint) = 0;

  /// Queues `message` for `peer`. Returns false when the peer's queue is at
  /// its high-water mark ("would block": try again later), true when queued.
  /// Errors: not_found for an unknown peer, invalid_argument for a message
  /// with no parts, io_error.
  virtual Result<bool> send(const PeerId& peer, Message message) = 0;

  /// Sends `message` to `peer` from the calling thread, when this transport
  /// can without the owning thread and the message goes there whole now:
  /// true when sent. The ZeroMQ transport can (its sockets are guarded by a
  /// lock that its owning thread lets go while it waits); make_shm_transport
  /// writes a peer's ring, and passes a message for a peer that gets no
  /// shared memory to the transport it wraps. False when not (nothing sent): the caller gives
  /// it to send() on the owning thread as usual, and must give it there all
  /// it sends to that peer until that has been sent, to keep their order.
  /// The one call besides wake() that is thread-safe. The default sends
  /// nothing.
  virtual bool send_now(const PeerId& peer, const Message& message) {
    (void)peer;
    (void)message;
    return false;
  }

  /// Waits up to `timeout` for the next message from any peer; nullopt when
  /// none came (not an error). Errors: io_error.
  virtual Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) = 0;

  virtual TransportStats stats() const = 0;

  /// Backpressure: while `paused`, receive() leaves the messages that
  /// arrive on the bound endpoint unread. They wait in ZeroMQ's queue (up
  /// to receive_high_water_mark per peer), then in the kernel's socket
  /// buffers, then in the peer's send queue, whose send() then reports
  /// would-block. Connections are read as usual, and wake() still ends a
  /// wait. A transport that cannot pause ignores it (the default).
  virtual void pause_bound(bool paused) { (void)paused; }

  /// Changes the bound endpoint's limits (TransportLimits::bound_max_part_bytes
  /// and bound_max_connections) for connections accepted from now on; before
  /// bind(), for bind(). ZeroMQ fixes a listener's part limit when it binds,
  /// so when that changes the ZeroMQ transport listens again on the same
  /// endpoint: the connections it had accepted are closed (their peers'
  /// ZeroMQ reconnects by itself; what they had sent and this side had not
  /// read is lost), and for a moment connecting there is refused. So call
  /// it before the peers that matter connect: a shard calls it once its
  /// assignment says how large a push may be, before it announces that it
  /// serves. Errors: io_error when the endpoint cannot be bound again (then
  /// nothing listens there). A transport without these limits ignores them
  /// (the default).
  virtual Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) {
    (void)max_part_bytes;
    (void)max_connections;
    return {};
  }

  /// Makes a receive() in progress (or the next one) return at once.
  /// Thread-safe: other threads use it to hand the owning thread new work.
  virtual void wake() = 0;

  /// From now on a receive() also returns (with nothing) when `fd` becomes
  /// readable: a doorbell that another process rings (make_shm_transport's
  /// rings). Such a return leaves a wake() that came meanwhile pending
  /// (the next receive() returns at once for it), so a caller that finds
  /// its doorbell rung may wait again. The caller keeps `fd` open for this
  /// transport's life and reads what wakes it. Returns false when this
  /// transport cannot watch a descriptor (the default).
  virtual bool watch(int fd) {
    (void)fd;
    return false;
  }

  /// The refusals (Refusal) since the last call, each connection's first
  /// only (libzmq 4.3 does not try such a connection again; were it to,
  /// and be refused again, that would go unreported). A receive() returns
  /// early, with nothing,
  /// when one comes. TransportStats::refused_by_peers counts them. A
  /// transport that cannot tell returns none (the default).
  virtual std::vector<Refusal> take_refusals() { return {}; }
};

/// ZeroMQ: one ROUTER for the bound endpoint, one DEALER per connection,
/// its own zmq context (no globals: two transports in one process are
/// independent). Sends multipart messages without copying the parts.
/// With `curve`, authenticated and encrypted (CurveOptions); without it,
/// plain tcp and ipc. Once bound, a thread of its own watches the bound
/// endpoint's connections: it enforces bound_max_connections and counts and
/// logs every refused connection (TransportStats::refused), naming this
/// transport `log_name` ("shard 1").
std::unique_ptr<Transport> make_zmq_transport(TransportLimits limits = {},
                                              std::optional<CurveOptions> curve = std::nullopt,
                                              std::string log_name = "transport");

/// Shared memory between processes on one host (make_shm_transport).
struct SharedMemoryOptions {
  /// Parts at least this large travel through shared memory; smaller ones,
  /// and every part of a message that has none this large, stay on the wire.
  std::size_t min_part_bytes = 64u << 10;
  /// Slots per peer this process sends to: a part sent waits in its slot
  /// until the receiver lets go of it (the shard has applied the gradient,
  /// the worker has copied the parameters). With every slot held, a part
  /// goes on the wire instead (TransportStats::shm_fallbacks).
  std::size_t slots_per_peer = 4;
  /// The most bytes of slots this transport keeps, over all its peers; a
  /// part that would need more goes on the wire.
  std::size_t max_bytes = std::size_t{1} << 30;
  /// When false, offers are refused and none are made: every part stays on
  /// the wire (what a process run with shared memory off does).
  bool enabled = true;
  /// How often the receiving loop asks whether each peer that shares its
  /// memory still runs (a gone process's doorbell refuses; a live one's
  /// rings once, which wakes it for nothing): a gone peer's slots and rings,
  /// both those this process made for it and those it mapped from it, are
  /// let go, so that a long-running shard whose workers are restarted does
  /// not keep every dead worker's memory (and its share of max_bytes).
  /// 0: never asked.
  std::chrono::milliseconds peer_check_every{2000};
  /// Tests only: called while a part is being copied into its slot, after
  /// half of it (to kill a sender mid-write). Never set in a job.
  void (*mid_write_hook)() = nullptr;
};

/// Wraps `inner` so that large parts reach a peer on the same host through
/// shared memory: the sender copies a part into one of its slots (POSIX
/// shared memory objects, one per slot, mode 0600), and the wire carries a
/// small descriptor; the receiver's part points into the slot (read, and
/// written, in place) and frees the slot when dropped. Whether a peer
/// shares this host is found out, not assumed: the first message to a peer
/// is preceded by an offer naming the slots and a random token written in
/// them, and only a peer that opened every slot and read the token back
/// accepts; one on another host (or another /dev/shm, or another user)
/// refuses, and everything to it stays on the wire. Once a peer accepts,
/// the slots' names are unlinked, so nothing is left in /dev/shm when either
/// process dies. From then on every message to that peer, small ones too,
/// goes through a ring in shared memory offered with the slots (its
/// descriptors and small parts; the receiver's doorbell wakes it when it
/// waits), in the order sent: no ZeroMQ I/O thread on either side
/// (messaging/shm_ring.hpp). What reaches the caller is the message that was sent, part
/// for part: framing, checksums and bounds are checked above as for any
/// transport, and the limits (`limits`, and set_bound_limits for the bound
/// endpoint) hold for the message rebuilt. A sender that dies while writing
/// a slot never sent its descriptor: the peer sees nothing of that message.
/// Not thread-safe, like every transport; a received part's owner may be
/// dropped on any thread.
std::unique_ptr<Transport> make_shm_transport(std::unique_ptr<Transport> inner, TransportLimits limits = {},
                                              SharedMemoryOptions options = {}, std::string log_name = "transport");

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
