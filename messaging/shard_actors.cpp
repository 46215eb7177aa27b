// The actors on either side of a bridge for a shard in another process:
// remote_shard stands in for it in a worker's (or the coordinator's)
// process, shard_server serves the local shard to remote peers
// (messaging/bridge.hpp declares them).

#include <algorithm>
#include <map>
#include <vector>

#include "base/log.hpp"
#include "messaging/bridge.hpp"

namespace asgd::messaging {

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
      // The bridge: no reply will come (refused_atom; the message says why).
      [waiting](refused_atom, std::uint64_t id, std::string& why) {
        if (auto it = waiting->replies.find(id); it != waiting->replies.end()) {
          it->second.deliver(caf::make_error(caf::sec::runtime_error, std::move(why)));
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
  // A snapshot's parameters (what the coordinator evaluates, checkpoints
  // and exports) go exact whatever --compress says: it rounds the steps'
  // traffic, not the trained model.
  auto answer = [bridge](const PeerId& peer, std::uint64_t id, ShardReply& r, RequestSlot slot,
                         bool exact = false) {
    const TensorCoding coding = exact ? TensorCoding::float32 : bridge->coding();
    if (r.params_in_frame.owner) {
      // Written over the push's gradient: sent back from the same buffer.
      if (coding == TensorCoding::float32 && r.params_crc) {
        bridge->send(peer, encode_in_frame(r, id, r.params_in_frame, *r.params_crc), std::move(slot));
        return;
      }
      r.params.assign(r.params_in_frame.values.begin(), r.params_in_frame.values.end());  // to be converted
      r.params_in_frame = {};
    }
    std::vector<float> params = std::move(r.params);
    bridge->send(peer, encode(r, id, std::move(params), coding, bridge->pool(), r.params_crc),
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
            .then([answer, peer, id, slot](ShardReply& r) mutable { answer(peer, id, r, std::move(slot), true); },
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

ShardServer::ShardServer(caf::actor_system& system, std::shared_ptr<Bridge> bridge, caf::actor shard,
                         bool on_caf_threads)
    : actor_(system.spawn(shard_server, std::move(bridge), shard)) {
  if (!on_caf_threads) unit_ = std::make_unique<InlineUnit>(system, std::vector<caf::actor>{actor_, shard});
}

bool ShardServer::post(Inbound&& in) {
  auto post = [&](auto&&... xs) {
    auto message =
        caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::forward<decltype(xs)>(xs)...);
    if (unit_) {
      unit_->post(actor_, std::move(message));
    } else {
      actor_->enqueue(std::move(message), nullptr);
    }
  };
  return std::visit(
      [&](auto& body) -> bool {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, PushRequest>) {
          post(inbound_atom::value, in.peer, in.request_id, std::move(body), std::move(in.slot));
        } else if constexpr (std::is_same_v<T, PullRequest>) {
          post(inbound_atom::value, in.peer, in.request_id, body, std::move(in.slot));
        } else if constexpr (std::is_same_v<T, EvaluationRequest>) {
          post(inbound_atom::value, in.peer, in.request_id, snapshot_atom::value, std::move(in.slot));
        } else if constexpr (std::is_same_v<T, StatsRequest>) {
          post(inbound_atom::value, in.peer, in.request_id, stats_atom::value, std::move(in.slot));
        } else if constexpr (std::is_same_v<T, ClockNotice>) {
          if (body.leaving) {
            post(inbound_atom::value, in.peer, in.request_id, leave_atom::value, body.worker, std::move(in.slot));
          } else {  // from the coordinator: a worker that had left rejoins at body.clock
            post(inbound_atom::value, in.peer, in.request_id, join_atom::value, body.worker, body.clock,
                 std::move(in.slot));
          }
        } else {
          return false;
        }
        return true;
      },
      in.body);
}

}  // namespace asgd::messaging
