#include "messaging/bridge.hpp"

#include "base/log.hpp"
#include "messaging/curve_auth.hpp"
#include "messaging/zmq_curve.hpp"

#include <algorithm>
#include <deque>

namespace asgd::messaging {

// What a RequestSlot counts against: shared with every slot, so a slot may
// outlive its bridge. A slot may go back on any thread, a ZeroMQ I/O thread
// included (see tie_slot_to_frame): giving it back only counts down, and a
// paused I/O thread looks again every millisecond.
struct SlotGate {
  std::atomic<std::size_t> held{0};
};

namespace {

// How often a paused I/O thread looks whether slots came back.
constexpr std::chrono::milliseconds kPausedPoll{1};

}  // namespace

Result<std::shared_ptr<Bridge>> Bridge::start(BridgeOptions options, Handler handler,
                                              std::unique_ptr<Transport> transport) {
  if (!transport) {
    transport = make_zmq_transport(options.limits, options.curve, options.name);
    // Off, it still answers offers (refusing them), so that processes with
    // it on and off can share a job; under CURVE nobody makes any.
    SharedMemoryOptions shm;
    shm.enabled = options.shared_memory;
    if (!options.curve) transport = make_shm_transport(std::move(transport), options.limits, shm, options.name);
  }
  std::shared_ptr<Bridge> b(new Bridge(std::move(options), std::move(handler), std::move(transport)));
  if (!b->options_.listen.empty()) {
    auto bound = b->transport_->bind(b->options_.listen);
    if (!bound) return bound.status();
    b->endpoint_ = *bound;
  }
  b->io_ = std::thread([raw = b.get()] { raw->run(); });
  return b;
}

Bridge::Bridge(BridgeOptions options, Handler handler, std::unique_ptr<Transport> transport)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      transport_(std::move(transport)),
      gate_(std::make_shared<SlotGate>()),
      max_unanswered_(options_.max_unanswered) {
  coding_ = options_.coding;
}

Bridge::~Bridge() { stop(); }

void Bridge::set_max_unanswered(std::size_t n) {
  max_unanswered_ = n;
  transport_->wake();  // the I/O thread looks again
}

RequestSlot Bridge::take_slot() {
  const std::size_t now = gate_->held.fetch_add(1) + 1;
  {
    std::lock_guard lock(mu_);
    stats_.unanswered_peak = std::max<std::uint64_t>(stats_.unanswered_peak, now);
  }
  SlotGate* raw = gate_.get();
  return RequestSlot(std::shared_ptr<void>(raw, [gate = gate_](void*) { gate->held.fetch_sub(1); }));
}

// Stops at the limit and reads again once half of it has been answered:
// pauses are fewer and longer, so the queues behind (ZeroMQ's, the
// kernel's, the senders') fill in the first pause instead of creeping up
// over many short ones, and a paused shard has half a limit of work left.
bool Bridge::must_pause_reading(bool paused) {
  const std::size_t limit = max_unanswered_.load();
  if (limit == 0) return false;
  const std::size_t held = gate_->held.load();
  return paused ? held > limit / 2 : held >= limit;
}

namespace {

// A reply keeps its request's slot until its bytes have left: the slot is
// tied to the owner of the frame's largest part (the parameters), which a
// transport that sends without copying holds until then. That is when the
// buffer the push arrived in is freed, so the slots count the requests'
// memory. A frame with nothing to tie it to lets the slot go when the
// transport has taken it.
void tie_slot_to_frame(Message& message, RequestSlot& slot) {
  Part* big = nullptr;
  for (Part& p : message)
    if (p.owner && (big == nullptr || p.bytes.size() > big->bytes.size())) big = &p;
  if (big == nullptr) return;
  struct Both {
    std::shared_ptr<const void> owner;
    RequestSlot slot;
  };
  big->owner = std::make_shared<const Both>(Both{std::move(big->owner), std::move(slot)});
  slot = {};
}

}  // namespace

void Bridge::stop(std::chrono::milliseconds linger) {
  if (!io_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    linger_until_ = std::chrono::steady_clock::now() + linger;
  }
  stopping_ = true;
  transport_->wake();
  io_.join();
}

Result<PeerId> Bridge::connect(const std::string& endpoint) {
  std::future<Result<PeerId>> done;
  {
    std::lock_guard lock(mu_);
    connects_.emplace_back(endpoint, std::promise<Result<PeerId>>());
    done = connects_.back().second.get_future();
  }
  transport_->wake();
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return Status::Timeout(options_.name + ": connecting to " + endpoint + " took over 30 s");
  return done.get();
}

Result<std::size_t> Bridge::reconnect(const PeerId& peer, const std::string& endpoint) {
  std::future<Result<std::size_t>> done;
  {
    std::lock_guard lock(mu_);
    reconnects_.push_back({peer, endpoint, std::promise<Result<std::size_t>>()});
    done = reconnects_.back().done.get_future();
  }
  transport_->wake();
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return Status::Timeout(options_.name + ": reconnecting to " + endpoint + " took over 30 s");
  return done.get();
}

Status Bridge::set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) {
  std::future<Status> done;
  {
    std::lock_guard lock(mu_);
    bound_limits_.push_back({max_part_bytes, max_connections, std::promise<Status>()});
    done = bound_limits_.back().done.get_future();
  }
  transport_->wake();
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return Status::Timeout(options_.name + ": changing the limits of its endpoint took over 30 s");
  return done.get();
}

void Bridge::send(const PeerId& peer, Message message) { send(peer, std::move(message), RequestSlot()); }

void Bridge::send(const PeerId& peer, Message message, RequestSlot slot) {
  bool behind = false;  // frames sent before it still wait: it waits behind them
  {
    std::lock_guard lock(mu_);
    for (const auto& p : message) stats_.bytes_out += p.bytes.size();
    behind = !outbox_.empty() || queued_.load() != 0;
    if (behind) outbox_.push_back({peer, std::move(message), std::move(slot)});
  }
  // Else from this thread when the transport can (a peer's ring in shared
  // memory, a socket): no hand-off to the I/O thread. The request's slot
  // goes with the frame's bytes: at once when the ring copied them, once
  // sent when the socket shares them.
  if (!behind) {
    if (slot) tie_slot_to_frame(message, slot);
    const bool sent = transport_->send_now(peer, message);
    std::lock_guard lock(mu_);
    if (sent) {
      ++stats_.frames_out;
      return;
    }
    outbox_.push_back({peer, std::move(message), std::move(slot)});
  }
  // The I/O thread itself (a shard served on it) takes the outbox on its
  // next round without being woken.
  if (std::this_thread::get_id() != io_id_.load(std::memory_order_relaxed)) transport_->wake();
}

void Bridge::request(const PeerId& peer, std::uint64_t id, Message message, caf::actor reply_to) {
  std::optional<std::string> refused;
  {
    // Registered before the frame is queued, so the reply always finds it.
    std::lock_guard lock(mu_);
    if (auto it = refusals_.find(peer); it != refusals_.end())
      refused = it->second;
    else
      pending_[id] = Pending{reply_to, peer, message};
  }
  if (refused) {
    caf::anon_send(reply_to, refused_atom::value, id, std::move(*refused));
    return;
  }
  send(peer, std::move(message));
}

std::optional<std::string> Bridge::refusal(const PeerId& peer) const {
  std::lock_guard lock(mu_);
  if (auto it = refusals_.find(peer); it != refusals_.end()) return it->second;
  return std::nullopt;
}

// The peer at r.endpoint refused this process's key: every request
// waiting on it would wait out its timeout, and every later one too:
// the connection stays refused (libzmq does not try it again).
void Bridge::note_refusal(const Refusal& r) {
  const std::string why = refusal_reason(r.endpoint, "process", "the --auth-keys folder of the process there",
                                         r.zap_status, options_.curve);
  std::vector<std::pair<std::uint64_t, caf::actor>> waiting;
  {
    std::lock_guard lock(mu_);
    refusals_[r.peer] = why;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.peer != r.peer) {
        ++it;
        continue;
      }
      waiting.emplace_back(it->first, std::move(it->second.reply_to));
      it = pending_.erase(it);
    }
  }
  // Whoever waits on the peer is told, and says it (at debug here: said once).
  logger().debug("{}: {}", options_.name, why);
  for (auto& [id, to] : waiting)
    if (to) caf::anon_send(to, refused_atom::value, id, why);
}

BridgeStats Bridge::stats() const {
  std::lock_guard lock(mu_);
  BridgeStats s = stats_;
  s.unanswered = gate_->held.load();
  return s;
}

void Bridge::reject(const PeerId& peer, FrameError why) {
  bool first = false;
  {
    std::lock_guard lock(mu_);
    ++stats_.rejected;
    ++stats_.rejected_by_reason[to_string(why)];
    first = !logged_[peer];
    logged_[peer] = true;
  }
  // Once per sender: a peer sending garbage must not flood the log.
  if (first) logger().warn("{}: dropped a malformed frame from {} ({}); further ones from it are counted, not logged",
                          options_.name, peer, to_string(why));
}

// Takes what other threads asked for since the last round: frames to send
// (onto the backlog), connections, reconnections (their unanswered frames
// go onto the backlog again) and new limits for the bound endpoint.
void Bridge::take_requests(std::deque<Outgoing>& backlog) {
  std::deque<std::pair<std::string, std::promise<Result<PeerId>>>> connects;
  std::deque<Reconnect> reconnects;
  std::deque<BoundLimits> bound_limits;
  {
    std::lock_guard lock(mu_);
    connects.swap(connects_);
    reconnects.swap(reconnects_);
    bound_limits.swap(bound_limits_);
    while (!outbox_.empty()) {
      backlog.push_back(std::move(outbox_.front()));
      outbox_.pop_front();
      if (backlog.back().slot) tie_slot_to_frame(backlog.back().message, backlog.back().slot);
    }
    queued_ = backlog.size();
  }
  for (auto& l : bound_limits) l.done.set_value(transport_->set_bound_limits(l.max_part_bytes, l.max_connections));
  for (auto& [endpoint, done] : connects) done.set_value(transport_->connect(endpoint));
  for (auto& r : reconnects) {
    Status s = transport_->reconnect(r.peer, r.endpoint);
    if (!s.ok()) {
      r.done.set_value(std::move(s));
      continue;
    }
    {
      std::lock_guard lock(mu_);
      refusals_.erase(r.peer);
    }
    {
      // In id order, the order they were first sent in. Frames for the
      // peer still in the backlog go too (a duplicate's id is seen twice
      // over one connection, which the receiving shard server drops).
      std::lock_guard lock(mu_);
      std::size_t n = 0;
      for (auto& [id, p] : pending_) {
        if (p.peer != r.peer) continue;
        backlog.push_back({p.peer, p.frame, {}});
        ++n;
      }
      queued_ = backlog.size();
      stats_.resent += n;
      r.done.set_value(n);
    }
  }
}

// Sends the backlog's frames that the transport takes now.
void Bridge::send_what_fits(std::deque<Outgoing>& backlog) {
  // A peer whose queue is full keeps its frames, in order, for the next
  // round; frames for every other peer go past them, so a peer that
  // stops reading holds up nobody else's replies.
  std::vector<PeerId> full;
  std::deque<Outgoing> kept;
  while (!backlog.empty()) {
    Outgoing& out = backlog.front();
    if (std::find(full.begin(), full.end(), out.peer) == full.end()) {
      auto sent = transport_->send(out.peer, out.message);
      if (sent && !*sent) {
        full.push_back(out.peer);
      } else {
        if (!sent) {
          // While stopping, peers that left first are expected.
          logger().log(stopping_ ? spdlog::level::debug : spdlog::level::warn, "{}: a frame to {} was not sent: {}",
                      options_.name, out.peer, sent.status().message());
        }
        backlog.pop_front();
        std::lock_guard lock(mu_);
        ++stats_.frames_out;
        continue;
      }
    }
    kept.push_back(std::move(out));
    backlog.pop_front();
  }
  backlog.swap(kept);
}

void Bridge::run() {
  io_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  std::deque<Outgoing> backlog;  // accepted but not yet taken by the transport (would block)
  std::uint64_t refused_seen = 0;
  std::uint64_t refusals_seen = 0;  // TransportStats::refused_by_peers
  bool paused = false;  // not reading the bound endpoint (max_unanswered)
  // BridgeOptions::busy_poll: the clock is read only where it is on.
  const bool may_poll = options_.busy_poll.count() > 0;
  auto last_traffic = std::chrono::steady_clock::now();
  auto traffic = [&] {
    if (may_poll) last_traffic = std::chrono::steady_clock::now();
  };
  while (true) {
    const std::size_t waiting = backlog.size();
    take_requests(backlog);
    if (backlog.size() != waiting) traffic();
    send_what_fits(backlog);
    queued_ = backlog.size();  // after they left: a send() from another thread may go straight out now
    const bool polling = may_poll && std::chrono::steady_clock::now() - last_traffic < options_.busy_poll;
    const bool blocked = !backlog.empty();  // read meanwhile, and try again soon
    if (stopping_) {
      std::lock_guard lock(mu_);
      if ((backlog.empty() && outbox_.empty()) || std::chrono::steady_clock::now() > linger_until_) break;
    }
    // Backpressure: the backlog above is drained first, since replies
    // leaving are what brings reading back; while paused, look again soon.
    if (const bool pause = must_pause_reading(paused); pause != paused) {
      paused = pause;
      transport_->pause_bound(paused);
      if (paused) {
        std::lock_guard lock(mu_);
        ++stats_.read_pauses;
      }
    }
    auto in = transport_->receive(polling               ? std::chrono::milliseconds(0)
                                  : blocked || stopping_ ? std::chrono::milliseconds(1)
                                  : paused              ? kPausedPoll
                                                        : std::chrono::milliseconds(200));
    const TransportStats ts = transport_->stats();
    if (ts.refused_by_peers != refusals_seen) {
      refusals_seen = ts.refused_by_peers;
      for (const Refusal& r : transport_->take_refusals()) note_refusal(r);
    }
    if (ts.refused != refused_seen) {
      refused_seen = ts.refused;
      std::lock_guard lock(mu_);
      stats_.refused = ts.refused;
      stats_.refused_over_limit = ts.refused_over_limit;
      stats_.auth_rejected = ts.auth_rejected;
    }
    if (!in) {
      logger().error("{}: receiving failed: {}", options_.name, in.status().message());
      continue;
    }
    if (*in) {
      traffic();
      handle(std::move(**in));
    }
  }
}

namespace {

/// Whether a message of type M is a request (Inbound::body can hold it):
/// every message but the replies (ShardReply, ShardStats).
template <class M>
constexpr bool kIsRequest = std::is_constructible_v<decltype(Inbound::body), M>;

template <class M>
FrameError decode_into(const Frame& f, Inbound& ib) {
  M m;
  FrameError e = decode(f, m);
  if (e == FrameError::none) ib.body = std::move(m);
  return e;
}

}  // namespace

void Bridge::handle(Incoming&& in) {
  {
    std::lock_guard lock(mu_);
    ++stats_.frames_in;
  }
  Frame f;
  if (FrameError e = parse_frame(in.message, f); e != FrameError::none) return reject(in.from, e);
  if (!is_known(f.header.type)) return reject(in.from, FrameError::unknown_type);
  const auto type = static_cast<MsgType>(f.header.type);
  const std::uint64_t id = f.header.request_id;

  // Replies go to whoever asked.
  if (type == MsgType::parameters || type == MsgType::stats_reply) {
    caf::actor to;
    {
      std::lock_guard lock(mu_);
      if (auto it = pending_.find(id); it != pending_.end()) {
        to = std::move(it->second.reply_to);
        pending_.erase(it);
      } else {
        ++stats_.unmatched_replies;
      }
    }
    FrameError e = FrameError::none;
    if (type == MsgType::parameters) {
      ShardReply r;
      e = decode(f, r);
      if (e == FrameError::none) e = decode_tensor(f, r.params, std::nullopt, pool_.get());
      if (e == FrameError::none && to) caf::anon_send(to, reply_atom::value, id, std::move(r));
    } else {
      ShardStats s;
      e = decode(f, s);
      if (e == FrameError::none && !f.tensor.empty()) e = FrameError::bad_body;
      if (e == FrameError::none && to) caf::anon_send(to, reply_atom::value, id, std::move(s));
    }
    if (e != FrameError::none) reject(in.from, e);
    return;
  }

  Inbound ib;
  ib.peer = in.from;
  ib.request_id = id;
  // Counted from here: a request from the bound endpoint keeps its slot
  // until it is answered (or dropped).
  if (in.from.starts_with("r:")) ib.slot = take_slot();
  FrameError e = FrameError::none;
  if (type == MsgType::push) {
    PushRequest req;
    e = decode(f, req);
    if (e == FrameError::none) {
      // A big float32 payload stays where ZeroMQ received it (checked
      // first): the shard reads the gradient from there.
      e = can_borrow_tensor(f) && in.message[1].owner
              ? borrow_tensor(f, in.message[1], req.received, pool_.get())
              : decode_tensor(f, req.payload, std::nullopt, pool_.get());
    }
    if (e == FrameError::none) ib.body = std::move(req);
  } else {
    // Replies were handled above; any other message is a request.
    visit_wire_type(f.header.type, [&]<class M>() {
      if constexpr (kIsRequest<M>) e = decode_into<M>(f, ib);
    });
  }
  if (e == FrameError::none && type != MsgType::push) {
    // Only pushes and assignments carry tensors.
    if (type == MsgType::assignment) {
      e = decode_tensor(f, ib.tensor);
    } else if (!f.tensor.empty()) {
      e = FrameError::bad_body;
    }
  }
  if (e != FrameError::none) return reject(in.from, e);
  if (handler_) handler_(std::move(ib));
}

}  // namespace asgd::messaging
