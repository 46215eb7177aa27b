#include "messaging/zmq_gatekeeper.hpp"


#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include "base/log.hpp"
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "messaging/curve_auth.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {
namespace {

// Refused connections logged per minute at most; the rest are counted, and
// the next line logged says how many were left out. A flood of connections
// (a misconfigured peer retries ten times a second) must not fill the disk.
constexpr int kRefusalLinesPerMinute = 5;

// The events the gatekeeper reads from the ROUTER's monitor.
constexpr int kWatchedEvents = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                               ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

// The peer at the other end of the accepted socket `fd`, for the log:
// "10.0.0.9:51234", or over ipc "a local process (pid 4242)"; "" when not
// known.
std::string peer_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    sockaddr_in a{};
    std::memcpy(&a, &ss, sizeof a);
    ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    sockaddr_in6 a{};
    std::memcpy(&a, &ss, sizeof a);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  if (ss.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t n = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) == 0)
      return "a local process (pid " + std::to_string(cred.pid) + ")";
    return "a local process";
  }
  return "";
}

// Whether this side, not the peer, ended the connection whose socket `dup`
// still holds open after ZeroMQ closed its own descriptor: ZeroMQ left bytes
// unread (it stopped mid-stream), or the peer had neither closed nor reset
// its side. A peer that left closed (or reset) its side, and ZeroMQ had read
// up to that.
bool ended_by_this_side(int dup) {
  char c = 0;
  const ssize_t r = ::recv(dup, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

class Watch final : public Gatekeeper {
 public:
  Watch(zmq::context_t& context, zmq::socket_t& router, std::string name,
             const std::optional<CurveOptions>& curve, std::size_t max_connections, std::size_t max_part_bytes)
      : name_(std::move(name)),
        curve_(curve.has_value()),
        budget_(kRefusalLinesPerMinute, std::chrono::minutes(1)),
        max_connections_(max_connections),
        max_part_bytes_(max_part_bytes),
        zap_(context, zmq::socket_type::rep),
        monitor_(context, zmq::socket_type::pair),
        stop_rx_(context, zmq::socket_type::pair),
        stop_tx_(context, zmq::socket_type::pair) {
    if (curve) {
      allowed_ = curve->allowed;
      std::sort(allowed_.begin(), allowed_.end());
    }
    zap_.set(zmq::sockopt::linger, 0);
    zap_.bind("inproc://zeromq.zap.01");  // the name libzmq looks for, in this context only
    const std::string tag = std::to_string(reinterpret_cast<std::uintptr_t>(this));
    const std::string monitor_at = "inproc://asgd-gate-monitor-" + tag;
    if (zmq_socket_monitor(router.handle(), monitor_at.c_str(), kWatchedEvents) != 0) throw zmq::error_t();
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(monitor_at);
    stop_rx_.bind("inproc://asgd-gate-stop-" + tag);
    stop_tx_.connect("inproc://asgd-gate-stop-" + tag);
    stop_rx_.set(zmq::sockopt::linger, 0);
    stop_tx_.set(zmq::sockopt::linger, 0);
    thread_ = std::thread([this] { run(); });
  }

  ~Watch() override {
    try {
      zmq::message_t stop(1);
      (void)stop_tx_.send(stop, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    thread_.join();
    forget_connections();
    if (budget_.held_back() > 0)
      logger().warn("{}: {} further refused connections were counted, not logged", name_, budget_.held_back());
  }

  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  void set_max_connections(std::size_t n) override { max_connections_.store(n); }
  void set_max_part_bytes(std::size_t n) override { max_part_bytes_.store(n); }

  /// Listeners of the ROUTER that have closed so far.
  std::uint64_t listeners_closed() const override { return listeners_closed_.load(); }

  void add_to(TransportStats& s) const override {
    s.refused = refused_.load(std::memory_order_relaxed);
    s.refused_over_limit = over_limit_.load(std::memory_order_relaxed);
    s.auth_accepted = auth_accepted_.load(std::memory_order_relaxed);
    s.auth_rejected = auth_rejected_.load(std::memory_order_relaxed);
  }

 private:
  // One monitor event: a u16 event and a u32 value (a descriptor, an errno,
  // a protocol error), then the endpoint it happened on.
  struct Event {
    std::uint16_t what = 0;
    std::uint32_t value = 0;
    std::string where;
  };

  // An accepted connection, by ZeroMQ's descriptor, until it ends.
  struct Connection {
    int dup = -1;                         // our duplicate of its socket; -1 when it ended before we looked
    std::string peer;                     // its address, when known
    std::string where;                    // our endpoint
    std::uint64_t handshakes_before = 0;  // handshakes_ when it was accepted
    bool over_limit = false;              // closed by us as one too many
  };

  enum class Refusal { handshake, dropped, over_limit };

  void run() {
    while (true) {
      zmq_pollitem_t items[] = {{stop_rx_.handle(), 0, ZMQ_POLLIN, 0},
                                {monitor_.handle(), 0, ZMQ_POLLIN, 0},
                                {zap_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 3, std::chrono::milliseconds(-1));
        if (items[0].revents & ZMQ_POLLIN) return;
        if (items[1].revents & ZMQ_POLLIN) read_monitor();
        if (items[2].revents & ZMQ_POLLIN) answer_zap();
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        if (e.num() != EINTR) logger().error("{}: the gatekeeper of its endpoint: {}", name_, e.what());
      }
    }
  }

  // One ZAP request (RFC 27): version, request id, domain, address, routing
  // id, mechanism, credentials (CURVE: the client's 32-byte public key;
  // NULL: none). Always answered, so the REP socket never gets stuck.
  void answer_zap() {
    std::vector<zmq::message_t> parts;
    while (true) {
      zmq::message_t m;
      if (!zap_.recv(m, zmq::recv_flags::dontwait)) break;
      const bool more = m.more();
      parts.push_back(std::move(m));
      if (!more) break;
    }
    if (parts.empty()) return;
    const std::string address = parts.size() > 3 ? parts[3].to_string() : "";
    std::optional<CurveKey> key;
    std::string why;
    if (parts.size() < 6 || parts[0].to_string_view() != "1.0") {
      why = "a malformed ZAP request";
    } else if (!curve_) {
      // The endpoint's mechanism is NULL, so the client's is too: admitted.
    } else if (parts[5].to_string_view() != "CURVE") {
      why = "security mechanism " + parts[5].to_string() + ", not CURVE";
    } else if (parts.size() != 7 || parts[6].size() != CurveKey().size()) {
      why = "malformed CURVE credentials";
    } else {
      key.emplace();
      std::memcpy(key->data(), parts[6].data(), key->size());
      if (!std::binary_search(allowed_.begin(), allowed_.end(), *key)) why = "its key is not in the allow-list";
    }
    const bool ok = why.empty();
    const std::string request_id = parts.size() > 1 ? parts[1].to_string() : "";
    const std::string user = ok && key ? key_fingerprint(*key) : "";
    const std::string reply[] = {"1.0", request_id, ok ? "200" : "400", ok ? "OK" : "not allowed", user, ""};
    for (std::size_t i = 0; i < std::size(reply); ++i)
      zap_.send(zmq::buffer(reply[i]), i + 1 < std::size(reply) ? zmq::send_flags::sndmore : zmq::send_flags::none);
    // Counted here; its connection's end is not counted again (see ended()).
    if (!ok) refuse(address.empty() ? "a local peer" : address, key, why, Refusal::handshake);
  }

  // Moves every event the monitor has into events_.
  void drain() {
    while (true) {
      zmq::message_t head, where;
      if (!monitor_.recv(head, zmq::recv_flags::dontwait)) return;
      if (head.more()) (void)monitor_.recv(where, zmq::recv_flags::dontwait);  // sent with it: already here
      if (head.size() < 6) continue;
      Event e;
      std::memcpy(&e.what, head.data(), sizeof e.what);
      std::memcpy(&e.value, static_cast<const char*>(head.data()) + 2, sizeof e.value);
      e.where = where.to_string();
      events_.push_back(std::move(e));
    }
  }

  void read_monitor() {
    drain();
    while (!events_.empty()) {
      Event e = std::move(events_.front());
      events_.pop_front();
      switch (e.what) {
        case ZMQ_EVENT_ACCEPTED:
          accepted(e);
          break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
          ++handshakes_;
          if (curve_) auth_accepted_.fetch_add(1, std::memory_order_relaxed);
          failure_.reset();
          break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:  // ZAP said no, and answer_zap counted it
          ++handshakes_;
          failure_.reset();
          break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
          failure_ = e;  // its connection's end comes next
          break;
        case ZMQ_EVENT_DISCONNECTED:
          ended(e);
          failure_.reset();
          break;
        case ZMQ_EVENT_CLOSED:
          // A listener closed (Transport::set_bound_limits listens again):
          // ZeroMQ closes the connections it had accepted without an event.
          forget_connections();
          failure_.reset();
          listeners_closed_.fetch_add(1);
          break;
        default:
          failure_.reset();
      }
    }
  }

  // Whether events_ holds the end of the connection on descriptor `fd`.
  bool end_queued(std::uint32_t fd) const {
    return std::any_of(events_.begin(), events_.end(),
                       [&](const Event& e) { return e.what == ZMQ_EVENT_DISCONNECTED && e.value == fd; });
  }

  void accepted(const Event& e) {
    const int fd = static_cast<int>(e.value);
    if (auto old = connections_.find(fd); old != connections_.end()) {  // its listener closed it
      close_dup(old->second);
      connections_.erase(old);
    }
    Connection c;
    c.where = e.where;
    c.handshakes_before = handshakes_;
    c.dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (c.dup >= 0) {
      // The descriptor may have been closed since the event, and reused. Its
      // end was then emitted before it was closed, so now it is queued: the
      // duplicate is of something else.
      drain();
      if (end_queued(e.value)) {
        ::close(c.dup);
        c.dup = -1;
      } else {
        c.peer = peer_of(c.dup);
      }
    }
    std::size_t ending = 0;
    for (const Event& q : events_)
      if (q.what == ZMQ_EVENT_DISCONNECTED && (q.value == e.value || connections_.count(static_cast<int>(q.value))))
        ++ending;
    const std::size_t open = connections_.size() + 1 - std::min(ending, connections_.size() + 1);
    const std::size_t limit = max_connections_.load();
    if (c.dup >= 0 && open > limit) {
      // Reading ends: ZeroMQ sees the connection end and closes it. (Not
      // its writing side: ZeroMQ's next write would raise SIGPIPE.)
      ::shutdown(c.dup, SHUT_RD);
      c.over_limit = true;
      refuse(c, "more than " + std::to_string(limit) + " connections at once, this endpoint's limit",
             Refusal::over_limit);
    }
    connections_[fd] = std::move(c);
  }

  void ended(const Event& e) {
    auto it = connections_.find(static_cast<int>(e.value));
    if (it == connections_.end()) return;  // accepted by a listener since closed
    Connection c = std::move(it->second);
    connections_.erase(it);
    if (c.over_limit) {
      // Counted when it was accepted.
    } else if (failure_) {
      refuse(c, handshake_failure(*failure_, c), Refusal::handshake);
    } else if (c.handshakes_before == handshakes_) {
      // No handshake succeeded (or was refused by ZAP, which counted it)
      // while it was open, so its own did not, and libzmq said nothing:
      // it did not speak ZeroMQ 3 (ZMTP 1 and 2 are refused with ZAP on).
      refuse(c, "what it sent is not a ZeroMQ handshake", Refusal::handshake);
    } else if (c.dup >= 0 && ended_by_this_side(c.dup)) {
      refuse(c,
             "ZeroMQ dropped it: it began a part larger than this endpoint's limit of " +
                 std::to_string(max_part_bytes_.load()) + " bytes, or broke ZeroMQ's protocol",
             Refusal::dropped);
    }
    close_dup(c);
  }

  // Why libzmq failed the handshake of connection `c`, for the log.
  std::string handshake_failure(const Event& e, const Connection& c) const {
    if (e.what == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
      if (c.dup >= 0 && ended_by_this_side(c.dup))
        return "it did not complete a ZeroMQ handshake within " + std::to_string(kHandshakeMs / 1000) + " s";
      return curve_ ? "the handshake did not complete (the peer hung up: a client without CURVE, or not ZeroMQ at "
                      "all)"
                    : "the handshake did not complete (the peer hung up, or is not ZeroMQ)";
    }
    switch (e.value) {
      case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return curve_ ? "not a CURVE client (plain text, or another security mechanism)"
                      : "it asked for a security mechanism (CURVE?) this endpoint does not use";
      case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "its handshake did not decrypt (a client holding a wrong server key?)";
      default: {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", e.value);
        return std::string("a malformed handshake (ZeroMQ protocol error ") + hex + ")";
      }
    }
  }

  void close_dup(Connection& c) {
    if (c.dup >= 0) ::close(c.dup);
    c.dup = -1;
  }

  void forget_connections() {
    for (auto& [fd, c] : connections_) close_dup(c);
    connections_.clear();
  }

  void refuse(const Connection& c, const std::string& why, Refusal kind) {
    refuse(c.peer.empty() ? "a peer that left at once, on " + c.where : c.peer, std::nullopt, why, kind);
  }

  void refuse(const std::string& from, const std::optional<CurveKey>& key, const std::string& why, Refusal kind) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    if (kind == Refusal::over_limit) over_limit_.fetch_add(1, std::memory_order_relaxed);
    if (kind == Refusal::handshake && curve_) auth_rejected_.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t left_out = 0;
    if (!budget_.allow(LogBudget::Clock::now(), left_out)) return;
    logger().warn("{}: refused a connection from {}{}: {}{}", name_, from,
                 key ? " with key " + key_fingerprint(*key) : std::string(), why,
                 left_out ? " (" + std::to_string(left_out) + " more refused since the last line, counted, not logged)"
                          : std::string());
  }

  std::string name_;
  bool curve_;
  std::vector<CurveKey> allowed_;  // sorted
  LogBudget budget_;               // the gatekeeper's thread only
  std::atomic<std::size_t> max_connections_;
  std::atomic<std::size_t> max_part_bytes_;  // for the log: ZeroMQ enforces it
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> over_limit_{0};
  std::atomic<std::uint64_t> auth_accepted_{0};
  std::atomic<std::uint64_t> auth_rejected_{0};
  std::atomic<std::uint64_t> listeners_closed_{0};
  // The gatekeeper's thread only:
  std::deque<Event> events_;                         // read from the monitor, not yet handled
  std::unordered_map<int, Connection> connections_;  // open, by ZeroMQ's descriptor
  std::uint64_t handshakes_ = 0;                     // handshakes that succeeded, or that ZAP refused
  std::optional<Event> failure_;                     // a failed handshake, whose connection's end comes next
  zmq::socket_t zap_;
  zmq::socket_t monitor_;
  zmq::socket_t stop_rx_;
  zmq::socket_t stop_tx_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Gatekeeper> Gatekeeper::start(zmq::context_t& context, zmq::socket_t& router, std::string name,
                                              const std::optional<CurveOptions>& curve, std::size_t max_connections,
                                              std::size_t max_part_bytes) {
  return std::make_unique<Watch>(context, router, std::move(name), curve, max_connections, max_part_bytes);
}

}  // namespace asgd::messaging
