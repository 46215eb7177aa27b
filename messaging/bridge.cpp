#include "messaging/bridge.hpp"

#include "base/log.hpp"

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
  {
    std::lock_guard lock(mu_);
    for (const auto& p : message) stats_.bytes_out += p.bytes.size();
    outbox_.push_back({peer, std::move(message), std::move(slot)});
  }
  transport_->wake();
}

void Bridge::request(const PeerId& peer, std::uint64_t id, Message message, caf::actor reply_to) {
  {
    // Registered before the frame is queued, so the reply always finds it.
    std::lock_guard lock(mu_);
    pending_[id] = Pending{std::move(reply_to), peer, message};
  }
  send(peer, std::move(message));
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
  std::deque<Outgoing> backlog;  // accepted but not yet taken by the transport (would block)
  std::uint64_t refused_seen = 0;
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
    if (const TransportStats ts = transport_->stats(); ts.refused != refused_seen) {
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

caf::behavior remote_shard(caf::event_based_actor* self, std::shared_ptr<Bridge> bridge, PeerId peer,
                           std::uint32_t index) {
  struct Waiting {
    std::map<std::uint64_t, caf::response_promise> replies;
  };
  auto waiting = std::make_shared<Waiting>();
  auto ask = [self, bridge, peer, waiting](std::uint64_t id, Message m) {
    waiting->replies.emplace(id, self->make_response_promise());
    bridge->request(peer, id, std::move(m), caf::actor_cast<caf::actor>(self));
  };
  (void)index;
  return {
      [bridge, ask](push_atom, PushRequest& req) -> caf::result<ShardReply> {
        const auto id = bridge->next_id();
        std::vector<float> payload = std::move(req.payload);
        ask(id, encode(req, id, std::move(payload), bridge->coding(), bridge->pool()));
        return caf::delegated<ShardReply>();
      },
      [bridge, ask](pull_atom, const PullRequest& req) -> caf::result<ShardReply> {
        const auto id = bridge->next_id();
        ask(id, encode(req, id));
        return caf::delegated<ShardReply>();
      },
      [bridge, ask](snapshot_atom) -> caf::result<ShardReply> {
        const auto id = bridge->next_id();
        ask(id, encode(EvaluationRequest{}, id));
        return caf::delegated<ShardReply>();
      },
      [bridge, ask](stats_atom) -> caf::result<ShardStats> {
        const auto id = bridge->next_id();
        ask(id, encode(StatsRequest{}, id));
        return caf::delegated<ShardStats>();
      },
      [bridge, peer](leave_atom, WorkerId worker) {
        bridge->send(peer, encode(ClockNotice{worker, 0, true}, bridge->next_id()));
      },
      [bridge, peer](join_atom, WorkerId worker, Clock clock) {
        bridge->send(peer, encode(ClockNotice{worker, clock, false}, bridge->next_id()));
      },
      [waiting](reply_atom, std::uint64_t id, ShardReply& r) {
        if (auto it = waiting->replies.find(id); it != waiting->replies.end()) {
          it->second.deliver(std::move(r));
          waiting->replies.erase(it);
        }
      },
      [waiting](reply_atom, std::uint64_t id, ShardStats& s) {
        if (auto it = waiting->replies.find(id); it != waiting->replies.end()) {
          it->second.deliver(std::move(s));
          waiting->replies.erase(it);
        }
      },
  };
}

namespace {

// Request ids a shard server has seen from each peer, so a frame the
// network delivered twice is applied once. Ids from one peer grow, but may
// arrive out of order: remember a window of the latest. Each peer's window
// is one ring, allocated whole when the peer is first seen, so a shard's
// memory does not creep up over its first thousands of requests (a scan
// of 32 KiB costs about a microsecond, next to a push's tens).
class SeenRequests {
 public:
  /// True the first time (peer, id) is seen.
  bool first(const PeerId& peer, std::uint64_t id) {
    auto& w = peers_[peer];
    if (w.ids.empty()) w.ids.assign(kWindow, 0);
    const auto seen = w.ids.begin() + static_cast<std::ptrdiff_t>(w.filled);
    if (std::find(w.ids.begin(), seen, id) != seen) return false;
    w.ids[w.next] = id;
    w.next = (w.next + 1) % kWindow;
    w.filled = std::max(w.filled, w.next == 0 ? kWindow : w.next);
    return true;
  }
  std::uint64_t duplicates = 0;

 private:
  static constexpr std::size_t kWindow = 4096;
  struct Window {
    std::vector<std::uint64_t> ids;  // (kWindow,) a ring: the latest ids, [0, filled) in use
    std::size_t next = 0;            // where the next id goes, over the oldest
    std::size_t filled = 0;
  };
  std::map<PeerId, Window> peers_;
};

}  // namespace

caf::behavior shard_server(caf::event_based_actor* self, std::shared_ptr<Bridge> bridge, caf::actor shard) {
  auto seen = std::make_shared<SeenRequests>();
  auto fresh = [seen, bridge](const PeerId& peer, std::uint64_t id) {
    if (seen->first(peer, id)) return true;
    if (++seen->duplicates == 1)
      logger().warn("{}: ignored a request {} delivered twice; further duplicates are counted", bridge->name(), peer);
    return false;
  };
  // Each request's slot travels with it into the reply's frame (the
  // handlers move it out, so the bridge alone holds it then); a request
  // dropped here or failed by the shard lets it go.
  auto answer = [bridge](const PeerId& peer, std::uint64_t id, ShardReply& r, RequestSlot slot) {
    if (r.params_in_frame.owner) {
      // Written over the push's gradient: sent back from the same buffer.
      if (bridge->coding() == TensorCoding::float32 && r.params_crc) {
        bridge->send(peer, encode_in_frame(r, id, r.params_in_frame, *r.params_crc), std::move(slot));
        return;
      }
      r.params.assign(r.params_in_frame.values.begin(), r.params_in_frame.values.end());  // to be converted
      r.params_in_frame = {};
    }
    std::vector<float> params = std::move(r.params);
    bridge->send(peer, encode(r, id, std::move(params), bridge->coding(), bridge->pool(), r.params_crc),
                 std::move(slot));
  };
  return {
      [self, shard, answer, fresh](inbound_atom, const PeerId& peer, std::uint64_t id, PushRequest& req,
                                   RequestSlot& slot) {
        if (!fresh(peer, id)) return;  // applying a gradient twice would be wrong
        self->request(shard, caf::infinite, push_atom::value, std::move(req))
            .then([answer, peer, id, slot](ShardReply& r) mutable { answer(peer, id, r, std::move(slot)); },
                  [](caf::error&) {});
      },
      [self, shard, answer, fresh](inbound_atom, const PeerId& peer, std::uint64_t id, const PullRequest& req,
                                   RequestSlot& slot) {
        if (!fresh(peer, id)) return;
        self->request(shard, caf::infinite, pull_atom::value, req)
            .then([answer, peer, id, slot](ShardReply& r) mutable { answer(peer, id, r, std::move(slot)); },
                  [](caf::error&) {});
      },
      [self, shard, answer](inbound_atom, const PeerId& peer, std::uint64_t id, snapshot_atom, RequestSlot& slot) {
        self->request(shard, caf::infinite, snapshot_atom::value)
            .then([answer, peer, id, slot](ShardReply& r) mutable { answer(peer, id, r, std::move(slot)); },
                  [](caf::error&) {});
      },
      [self, shard, bridge, seen](inbound_atom, const PeerId& peer, std::uint64_t id, stats_atom, RequestSlot& slot) {
        self->request(shard, caf::infinite, stats_atom::value)
            .then(
                [bridge, peer, id, seen, slot](ShardStats& s) mutable {
                  s.malformed_frames = bridge->stats().rejected;
                  s.duplicate_requests = seen->duplicates;
                  bridge->send(peer, encode(s, id), std::move(slot));
                },
                [](caf::error&) {});
      },
      [self, shard](inbound_atom, const PeerId&, std::uint64_t, leave_atom, WorkerId worker, RequestSlot&) {
        self->send(shard, leave_atom::value, worker);
      },
      [self, shard](inbound_atom, const PeerId&, std::uint64_t, join_atom, WorkerId worker, Clock clock,
                    RequestSlot&) { self->send(shard, join_atom::value, worker, clock); },
  };
}

bool post_to_shard_server(const caf::actor& server, Inbound&& in) {
  return std::visit(
      [&](auto& body) -> bool {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, PushRequest>) {
          caf::anon_send(server, inbound_atom::value, in.peer, in.request_id, std::move(body), std::move(in.slot));
        } else if constexpr (std::is_same_v<T, PullRequest>) {
          caf::anon_send(server, inbound_atom::value, in.peer, in.request_id, body, std::move(in.slot));
        } else if constexpr (std::is_same_v<T, EvaluationRequest>) {
          caf::anon_send(server, inbound_atom::value, in.peer, in.request_id, snapshot_atom::value, std::move(in.slot));
        } else if constexpr (std::is_same_v<T, StatsRequest>) {
          caf::anon_send(server, inbound_atom::value, in.peer, in.request_id, stats_atom::value, std::move(in.slot));
        } else if constexpr (std::is_same_v<T, ClockNotice>) {
          if (body.leaving) {
            caf::anon_send(server, inbound_atom::value, in.peer, in.request_id, leave_atom::value, body.worker,
                           std::move(in.slot));
          } else {  // from the coordinator: a worker that had left rejoins at body.clock
            caf::anon_send(server, inbound_atom::value, in.peer, in.request_id, join_atom::value, body.worker,
                           body.clock, std::move(in.slot));
          }
        } else {
          return false;
        }
        return true;
      },
      in.body);
}

}  // namespace asgd::messaging
