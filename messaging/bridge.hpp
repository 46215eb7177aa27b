#pragma once
// The bridge between CAF actors and the transport: one per process. Its I/O
// thread owns the transport (which is not thread-safe); everything else
// talks to it through thread-safe calls. It
//   - sends frames queued by any thread (send, request),
//   - checks every incoming frame (messaging/untrusted.hpp): a malformed one
//     is dropped, counted by reason, and logged once per sender,
//   - delivers replies to the actor that asked (request ids),
//   - hands every other message to the process's handler, decoded, and
//   - stops reading its bound endpoint while too many of the requests it
//     read there are unanswered (BridgeOptions::max_unanswered), so a fast
//     sender cannot grow this process's queues without bound.
// remote_shard() makes a local actor that stands in for a shard in another
// process, with parameter_shard's interface, so a worker does not know
// whether its shards are local or remote; shard_server() serves a local
// shard actor to remote workers and the coordinator.

#include <caf/all.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

#include "messaging/inline_unit.hpp"
#include "messaging/messages.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {

struct SlotGate;

/// A request's place in its bridge's count of requests read from the bound
/// endpoint and not yet answered (BridgeOptions::max_unanswered). Copies
/// share the place; it is given back when the last copy goes, on whatever
/// thread that is. Whoever serves a request keeps the slot until its reply
/// is handed to send() (which keeps it until the reply has been sent);
/// dropping a request without an answer just lets the slot go. Empty for a
/// message that did not arrive on the bound endpoint.
class RequestSlot {
 public:
  RequestSlot() = default;
  explicit operator bool() const { return token_ != nullptr; }

 private:
  friend class Bridge;
  explicit RequestSlot(std::shared_ptr<void> token) : token_(std::move(token)) {}
  std::shared_ptr<void> token_;
};

/// A decoded message that is not a reply.
struct Inbound {
  PeerId peer;
  std::uint64_t request_id = 0;
  std::variant<Registration, Assignment, PushRequest, PullRequest, ClockNotice, Heartbeat, EvaluationRequest,
               CheckpointRequest, Shutdown, EpochReport, Failure, StatsRequest, StartTraining, WorkerProgress, Restarted,
               Calibration, WorkerReady, StopTraining>
      body;
  std::vector<float> tensor;  ///< an assignment's initial parameters (a push's payload is in the PushRequest)
  RequestSlot slot;           ///< held while this message (or its request) is not answered
};

/// The default of BridgeOptions::max_unanswered.
inline constexpr std::size_t kDefaultMaxUnanswered = 256;

struct BridgeOptions {
  std::string listen;                          ///< endpoint to bind; empty: none
  TensorCoding coding = TensorCoding::float32; ///< how this process sends tensors
  std::string name = "process";                ///< for log lines: "shard 1", "worker 0", "coordinator"
  /// Authentication and encryption (docs/security.md) of the ZeroMQ
  /// transport start() makes; unset: plain tcp and ipc.
  std::optional<CurveOptions> curve;
  /// The ZeroMQ transport's limits when start() makes it: its queues (per
  /// peer), and what strangers may do to the bound endpoint (set its
  /// bound_max_part_bytes to the largest part this process may legally be
  /// sent there: largest_part() in messaging/wire.hpp).
  TransportLimits limits;
  /// Backpressure: messages read from the bound endpoint and not yet
  /// answered (their RequestSlot still held: in an actor's mailbox, held
  /// by a consistency policy, or a reply not yet sent) at most.
  /// At the limit the I/O thread stops reading the bound endpoint (the
  /// senders' queues fill and their sends would block) and resumes once
  /// half of the limit has come back. Requests that a policy holds (bsp,
  /// ssp) keep their slots, so half the limit must exceed what every peer
  /// may have held at once, or reading never resumes; 0: no limit.
  std::size_t max_unanswered = kDefaultMaxUnanswered;
  /// Large tensors to peers on this host through shared memory
  /// (make_shm_transport), when start() makes the transport; when false,
  /// peers' offers of it are refused and none are made. Never with
  /// `curve`: a peer could change a slot's bytes after they were checked,
  /// and CURVE is for peers this process does not trust that far.
  bool shared_memory = true;
  /// After a message comes or goes, the I/O thread keeps polling without
  /// sleeping for this long, so the next one (a request's reply, the
  /// answer to send back) is taken without a thread waking up: less
  /// latency for a core spent polling. 0: it sleeps at once (the default);
  /// see ProcessOptions::busy_poll.
  std::chrono::microseconds busy_poll{0};
};

struct BridgeStats {
  std::uint64_t frames_in = 0;
  std::uint64_t frames_out = 0;
  std::uint64_t rejected = 0;                  ///< malformed frames dropped
  std::map<std::string, std::uint64_t> rejected_by_reason;
  std::uint64_t unmatched_replies = 0;         ///< replies nobody was waiting for
  std::uint64_t bytes_out = 0;                 ///< frame bytes queued for sending
  // The transport's TransportStats, as of the I/O thread's last look:
  std::uint64_t refused = 0;                   ///< connections to the bound endpoint refused or dropped
  std::uint64_t refused_over_limit = 0;        ///< of those: over the limit of connections at once
  std::uint64_t auth_rejected = 0;             ///< of those: connection attempts CURVE refused
  std::uint64_t unanswered = 0;                ///< requests read and not yet answered, now
  std::uint64_t unanswered_peak = 0;           ///< the most there ever were
  std::uint64_t read_pauses = 0;               ///< times reading stopped at max_unanswered
  std::uint64_t resent = 0;                    ///< requests sent again by reconnect()
};

class Bridge {
 public:
  using Handler = std::function<void(Inbound&&)>;

  /// Starts the I/O thread on `transport` (when null, a ZeroMQ transport
  /// with options.curve),
  /// binding options.listen if set. `handler` runs on the I/O thread for
  /// every message that is not a reply: keep it short (post to an actor or
  /// a queue). Errors: io_error when the endpoint cannot be bound.
  static Result<std::shared_ptr<Bridge>> start(BridgeOptions options, Handler handler,
                                               std::unique_ptr<Transport> transport = nullptr);
  ~Bridge();
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;

  /// The endpoint actually bound ("" when none; with CURVE, carrying this
  /// process's public key, as peers need it: with_server_key).
  const std::string& endpoint() const { return endpoint_; }
  TensorCoding coding() const { return coding_.load(); }
  /// Changes how tensors are sent from now on (a process learns it from its
  /// assignment). Thread-safe.
  void set_coding(TensorCoding c) { coding_ = c; }
  /// Changes BridgeOptions::max_unanswered (a shard learns its workers from
  /// its assignment). Thread-safe.
  void set_max_unanswered(std::size_t n);
  /// Changes the bound endpoint's limits (Transport::set_bound_limits: the
  /// ZeroMQ transport listens there again, closing the connections it had
  /// accepted, so call it before peers connect). Runs on the I/O thread and
  /// waits for it; thread-safe. Errors: as Transport::set_bound_limits,
  /// timeout when the I/O thread does not get to it within 30 s.
  Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections);
  const std::string& name() const { return options_.name; }
  /// Buffers for big tensors, recycled between frames.
  const std::shared_ptr<TensorPool>& pool() const { return pool_; }

  /// Connects to a peer's endpoint (on the I/O thread; waits for it).
  Result<PeerId> connect(const std::string& endpoint);

  /// Points the connection `peer` (from connect()) at `endpoint`, where the
  /// peer now listens after a restart, and sends it again every request
  /// to it still waiting for a reply: they went to the process that died,
  /// or sit in the old connection's queue. A request the old process did
  /// answer is not sent again (its reply matched). Waits for the I/O
  /// thread; returns how many requests went again. Errors: as
  /// Transport::reconnect.
  Result<std::size_t> reconnect(const PeerId& peer, const std::string& endpoint);

  /// Queues a frame for `peer`, or sends it from the calling thread when
  /// the transport can (Transport::send_now: a peer's ring in shared
  /// memory, else its socket) and nothing queued before it waits. Thread-safe; frames from
  /// one thread to one peer leave in the order sent.
  void send(const PeerId& peer, Message message);
  /// The same for a reply: `slot` (the request's) is given back once the
  /// frame's bytes have been sent (when the transport copies them instead,
  /// once it has taken them).
  void send(const PeerId& peer, Message message, RequestSlot slot);

  /// A fresh request id. Thread-safe.
  std::uint64_t next_id() { return next_id_.fetch_add(1) + 1; }

  /// Queues a request whose reply (a parameters or stats_reply frame with
  /// the same id) goes to `reply_to` as (reply_atom, id, ShardReply) or
  /// (reply_atom, id, ShardStats). The frame is kept until the reply comes,
  /// for reconnect(). When `peer` refused this process's key (refusal())
  /// no reply will come: `reply_to` gets (refused_atom, id, why) instead,
  /// at once or when the refusal comes. Thread-safe.
  void request(const PeerId& peer, std::uint64_t id, Message message, caf::actor reply_to);

  /// Why the connection `peer` (from connect()) is refused: with CURVE,
  /// the process there does not admit this process's key (a sentence
  /// naming the endpoint, the key and what to fix);
  /// nullopt while it is not. Cleared by reconnect(). Thread-safe.
  std::optional<std::string> refusal(const PeerId& peer) const;

  BridgeStats stats() const;

  /// Stops the I/O thread after sending what is queued (up to `linger`).
  void stop(std::chrono::milliseconds linger = std::chrono::milliseconds(500));

 private:
  Bridge(BridgeOptions options, Handler handler, std::unique_ptr<Transport> transport);
  void run();
  void handle(Incoming&& in);
  void reject(const PeerId& peer, FrameError why);
  RequestSlot take_slot();
  bool must_pause_reading(bool paused);

  BridgeOptions options_;
  Handler handler_;
  std::unique_ptr<Transport> transport_;
  std::string endpoint_;
  std::thread io_;
  std::atomic<std::thread::id> io_id_{};  // io_'s, as it knows it (io_ is assigned after it starts)
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<TensorCoding> coding_{TensorCoding::float32};
  std::shared_ptr<TensorPool> pool_ = std::make_shared<TensorPool>();
  std::shared_ptr<SlotGate> gate_;
  std::atomic<std::size_t> max_unanswered_;

  mutable std::mutex mu_;  // guards everything below
  struct Outgoing {
    PeerId peer;
    Message message;
    RequestSlot slot;  // a reply's request's, until tied to the frame (Bridge::run)
  };
  std::deque<Outgoing> outbox_;
  // Frames the I/O thread took from the outbox and the transport has not
  // (set under mu_ when it takes them): while any wait, send() queues
  // behind them instead of sending from its own thread.
  std::atomic<std::size_t> queued_{0};
  // The I/O thread's rounds (run): what other threads asked for, and the
  // frames the transport takes now.
  void take_requests(std::deque<Outgoing>& backlog);
  void send_what_fits(std::deque<Outgoing>& backlog);
  std::deque<std::pair<std::string, std::promise<Result<PeerId>>>> connects_;
  struct Reconnect {
    PeerId peer;
    std::string endpoint;
    std::promise<Result<std::size_t>> done;
  };
  std::deque<Reconnect> reconnects_;
  struct BoundLimits {
    std::size_t max_part_bytes;
    std::size_t max_connections;
    std::promise<Status> done;
  };
  std::deque<BoundLimits> bound_limits_;
  struct Pending {
    caf::actor reply_to;
    PeerId peer;
    Message frame;  // shares the parts' bytes with the frame sent
  };
  std::map<std::uint64_t, Pending> pending_;  // request id -> who waits for the reply
  std::map<PeerId, bool> logged_;                // senders already logged for a bad frame
  std::map<PeerId, std::string> refusals_;       // connections refused, and why (refusal())
  void note_refusal(const Refusal& r);
  std::chrono::steady_clock::time_point linger_until_;
  BridgeStats stats_;
};

using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using reply_atom = caf::atom_constant<caf::atom("reply")>;
using refused_atom = caf::atom_constant<caf::atom("refused")>;

/// A local stand-in for shard `index` reachable at `peer`: accepts what
/// parameter_shard accepts (push, pull, leave, snapshot, stats) and answers
/// with the remote shard's replies.
caf::behavior remote_shard(caf::event_based_actor* self, std::shared_ptr<Bridge> bridge, PeerId peer,
                           std::uint32_t index);

/// Serves the local shard actor `shard` to remote peers: the process's
/// handler posts (inbound_atom, peer, id, request, slot) here; the slot
/// is kept until the reply is handed to the bridge.
caf::behavior shard_server(caf::event_based_actor* self, std::shared_ptr<Bridge> bridge, caf::actor shard);

/// A shard_server in front of `shard` over `bridge`, for the bridge's
/// handler to post inbound requests to. The server and the shard run on the
/// thread that posts (the bridge's I/O thread: messaging/inline_unit.hpp),
/// so a push is read, checked, applied and answered there, unless
/// `on_caf_threads` (tests: requests then wait in the server's mailbox).
/// post() from one thread alone; the object must outlive those calls (stop
/// the bridge first).
class ShardServer {
 public:
  ShardServer(caf::actor_system& system, std::shared_ptr<Bridge> bridge, caf::actor shard,
              bool on_caf_threads = false);
  /// Posts an inbound request; false for a message a shard does not serve.
  bool post(Inbound&& in);
  const caf::actor& actor() const { return actor_; }

 private:
  caf::actor actor_;                  // the shard_server
  std::unique_ptr<InlineUnit> unit_;  // null on CAF's threads
};

}  // namespace asgd::messaging

// In-process only (inside a shard_server's messages): never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(asgd::messaging::RequestSlot)
