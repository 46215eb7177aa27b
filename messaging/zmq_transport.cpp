// The ZeroMQ transport. Everything ZeroMQ-specific (cppzmq types, its
// exceptions, errno values) stays in this file: callers see Status values.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
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

using Clock = std::chrono::steady_clock;

// Closing a socket waits this long for queued messages to leave, so a last
// message sent just before shutdown usually still goes out, while closing
// with an unreachable peer stays quick.
constexpr int kLingerMs = 100;

// Parts this small are copied: libzmq stores up to 33 bytes inside the
// message itself, so a copy costs less than sharing the owner (two heap
// allocations).
constexpr std::size_t kCopyUpToBytes = 33;

std::string hex_encode(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    const auto v = std::to_integer<unsigned>(b);
    out.push_back(kDigits[v >> 4]);
    out.push_back(kDigits[v & 0xF]);
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> hex_decode(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0) return std::nullopt;
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_value(hex[2 * i]);
    const int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::string describe(const zmq::error_t& e) { return std::string(e.what()) + " (errno " + std::to_string(e.num()) + ")"; }

// zmq_msg_init_data's free function: drops the reference that kept the
// part's bytes alive while libzmq owned them. May run on a libzmq I/O thread
// (shared_ptr's count is atomic, so that is fine).
void release_owner(void* /*data*/, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

// A zmq message over `part`'s bytes, sharing its owner instead of copying.
zmq::message_t to_zmq(const Part& part) {
  const std::size_t size = part.bytes.size();
  if (size == 0) return zmq::message_t();
  if (size <= kCopyUpToBytes || !part.owner) return zmq::message_t(part.bytes.data(), size);
  auto hint = std::make_unique<std::shared_ptr<const void>>(part.owner);
  // libzmq only reads the bytes of an outgoing message; the cast is for its C API.
  zmq::message_t msg(const_cast<std::byte*>(part.bytes.data()), size, &release_owner, hint.get());
  hint.release();  // the message owns it now; release_owner deletes it
  return msg;
}

// A Part over a received message's bytes, owning the message (no copy).
// `exclusive`: it came over tcp or ipc, so libzmq allocated its bytes for it
// alone (inproc hands over the sender's).
Part from_zmq(zmq::message_t&& msg, bool exclusive) {
  auto holder = std::make_shared<zmq::message_t>(std::move(msg));
  Part p;
  p.exclusive = exclusive;
  // Read the address only now: a small message keeps its bytes inside the
  // message_t object itself, so they moved with it.
  p.bytes = std::span<const std::byte>(static_cast<const std::byte*>(holder->data()), holder->size());
  p.owner = std::move(holder);
  return p;
}

// Refused connections logged per minute at most; the rest are counted, and
// the next line logged says how many were left out. A flood of connections
// (a misconfigured peer retries ten times a second) must not fill the disk.
constexpr int kRefusalLinesPerMinute = 5;

// How long a peer of the bound endpoint has to complete its handshake
// (ZMQ_HANDSHAKE_IVL; libzmq's default is 30 s). A connection that never
// does holds one of bound_max_connections until then; peers of a job
// finish in milliseconds.
constexpr int kHandshakeMs = 10000;

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

// The gatekeeper of one transport's bound endpoint, on its own thread:
//   - a monitor of the ROUTER tells it of every connection accepted and
//     ended and of every handshake's outcome. It closes a connection over
//     bound_max_connections as soon as it is accepted, and counts and logs
//     every connection refused or dropped (TransportStats::refused).
//   - it is the ZAP handler of the transport's zmq context: libzmq asks it
//     about every client that completes a CURVE hello (admit it or not) or,
//     without CURVE, greets with the NULL mechanism (admitted). With a ZAP
//     domain set, libzmq also refuses peers of ZeroMQ 2 and older at once,
//     and so bytes that are not ZeroMQ at all (without one it reads them
//     as ZMTP 1.0 messages).
// Built before the ROUTER binds, destroyed after it closed: while the ZAP
// socket is bound an unanswered request stalls a handshake (fails closed);
// a context without a ZAP handler would admit any CURVE client.
//
// libzmq's events name a connection only when it is accepted and when it
// ends, by its file descriptor, and a connection ZeroMQ drops after its
// handshake (a part over ZMQ_MAXMSGSIZE, a protocol error) ends with the
// same event as one whose peer left. So the gatekeeper keeps a duplicate of
// each accepted socket until the connection ends: the socket's state then
// says who ended it, and it names the peer in the log and lets the
// gatekeeper close a connection over the limit (it shuts down the reading
// side: ZeroMQ sees the end and closes the connection itself). This relies
// on what libzmq 4.3 does with one I/O thread, a context's default: a
// socket's events are emitted in the order things happen, a failed
// handshake's event right before its connection's end, and an end before
// the descriptor is closed. An event is never dropped: while the monitor's
// queue is full, ZeroMQ's I/O thread waits.
class Gatekeeper {
 public:
  Gatekeeper(zmq::context_t& context, zmq::socket_t& router, std::string name,
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

  ~Gatekeeper() {
    try {
      zmq::message_t stop(1);
      (void)stop_tx_.send(stop, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    thread_.join();
    forget_connections();
    if (budget_.held_back() > 0)
      spdlog::warn("{}: {} further refused connections were counted, not logged", name_, budget_.held_back());
  }

  Gatekeeper(const Gatekeeper&) = delete;
  Gatekeeper& operator=(const Gatekeeper&) = delete;

  void set_max_connections(std::size_t n) { max_connections_.store(n); }
  void set_max_part_bytes(std::size_t n) { max_part_bytes_.store(n); }

  /// Listeners of the ROUTER that have closed so far.
  std::uint64_t listeners_closed() const { return listeners_closed_.load(); }

  void add_to(TransportStats& s) const {
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
        if (e.num() != EINTR) spdlog::error("{}: the gatekeeper of its endpoint: {}", name_, e.what());
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
    spdlog::warn("{}: refused a connection from {}{}: {}{}", name_, from,
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

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(TransportLimits limits, std::optional<CurveOptions> curve, std::string name)
      : limits_(limits), curve_(std::move(curve)), name_(std::move(name)) {
    if (curve_) std::sort(curve_->allowed.begin(), curve_->allowed.end());
    // A PAIR of inproc sockets lets other threads interrupt a poll.
    const std::string wake_at = "inproc://asgd-wake-" + std::to_string(reinterpret_cast<std::uintptr_t>(this));
    wake_rx_.bind(wake_at);
    wake_tx_.connect(wake_at);
    wake_rx_.set(zmq::sockopt::linger, 0);
    wake_tx_.set(zmq::sockopt::linger, 0);
  }

  ~ZmqTransport() override {
    // The ROUTER goes before its gatekeeper (see Gatekeeper).
    router_.reset();
    guard_.reset();
  }

  void wake() override {
    std::lock_guard lock(wake_mu_);
    zmq::message_t ping(1);
    try {
      // A full queue already holds a wake-up: nothing is lost.
      (void)wake_tx_.send(ping, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
  }

  Result<std::string> bind(const std::string& endpoint) override {
    try {
      if (!router_) {
        zmq::socket_t router(context_, zmq::socket_type::router);
        configure(router, limits_.bound_max_part_bytes);
        // A send to an identity we do not know fails (EHOSTUNREACH) instead
        // of vanishing, and a full peer queue says EAGAIN instead of dropping.
        router.set(zmq::sockopt::router_mandatory, true);
        router.set(zmq::sockopt::handshake_ivl, kHandshakeMs);
        if (curve_) {
          router.set(zmq::sockopt::curve_server, true);
          router.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve_->secret_key));
        }
        router.set(zmq::sockopt::zap_domain, "asgd");  // asks the gatekeeper, with or without CURVE
        // Before anyone can connect.
        guard_ = std::make_unique<Gatekeeper>(context_, router, name_, curve_, limits_.bound_max_connections,
                                              part_limit(limits_.bound_max_part_bytes));
        router_ = std::move(router);
      }
      router_->bind(endpoint);
      bound_ = router_->get(zmq::sockopt::last_endpoint);
      router_inproc_ = router_inproc_ || bound_.starts_with("inproc:");
      return curve_ ? with_server_key(bound_, curve_->public_key) : bound_;
    } catch (const zmq::error_t& e) {
      return Status::IOError("bind " + endpoint + ": " + describe(e));
    }
  }

  Result<PeerId> connect(const std::string& given) override {
    auto dealer = open_dealer(given);
    if (!dealer) return dealer.status();
    PeerId id = "c:" + std::to_string(connections_.size());
    connections_.push_back({id, std::move(dealer->first), std::move(dealer->second)});
    return id;
  }

  Status reconnect(const PeerId& peer, const std::string& given) override {
    Connection* c = connection(peer);
    if (c == nullptr) return Status::NotFound("reconnect " + peer + ": no such connection");
    auto dealer = open_dealer(given);
    if (!dealer) return dealer.status();
    // The old socket closes with what it still queued (linger: kLingerMs).
    c->endpoint = std::move(dealer->first);
    c->socket = std::move(dealer->second);
    return {};
  }

  Result<bool> send(const PeerId& peer, Message message) override {
    if (message.empty()) return Status::InvalidArgument("send to " + peer + ": a message needs at least one part");
    std::string where = peer;
    try {
      if (peer.starts_with("c:")) {
        Connection* c = connection(peer);
        if (c == nullptr) return Status::NotFound("send to " + peer + ": no such connection");
        where = peer + " (" + c->endpoint + ")";
        return send_parts(c->socket, std::nullopt, message);
      }
      if (peer.starts_with("r:") && router_) {
        where = peer + " (via " + bound_ + ")";
        auto identity = hex_decode(std::string_view(peer).substr(2));
        if (!identity) return Status::NotFound("send to " + peer + ": not a peer identity");
        return send_parts(*router_, std::move(*identity), message);
      }
      return Status::NotFound("send to " + peer + ": unknown peer");
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return Status::NotFound("send to " + where + ": peer is not connected");
      return Status::IOError("send to " + where + ": " + describe(e));
    }
  }

  Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
    try {
      std::vector<zmq_pollitem_t> items;
      std::vector<zmq::socket_t*> sockets;
      const bool with_router = router_ && !bound_paused_;
      if (with_router) sockets.push_back(&*router_);
      for (auto& c : connections_) sockets.push_back(&c.socket);
      for (auto* s : sockets) items.push_back({s->handle(), 0, ZMQ_POLLIN, 0});
      items.push_back({wake_rx_.handle(), 0, ZMQ_POLLIN, 0});  // last: not a peer
      while (true) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        try {
          zmq::poll(items, std::max(left, std::chrono::milliseconds(0)));
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
        }
        if (items.back().revents & ZMQ_POLLIN) {  // woken: drain, and return to the caller
          zmq::message_t ping;
          while (wake_rx_.recv(ping, zmq::recv_flags::dontwait)) {
          }
          return std::optional<Incoming>();
        }
        // Start after the socket served last time, so one busy peer cannot
        // starve the others.
        for (std::size_t k = 0; k < sockets.size(); ++k) {
          const std::size_t i = (next_first_ + k) % sockets.size();
          if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
          next_first_ = i + 1;
          const bool is_router = with_router && i == 0;
          std::optional<Incoming> in =
              read_message(*sockets[i], is_router ? nullptr : &connections_[i - (with_router ? 1 : 0)]);
          if (in) {
            ++stats_.received;
            return in;
          }
        }
        if (Clock::now() >= deadline) return std::optional<Incoming>();
      }
    } catch (const zmq::error_t& e) {
      return Status::IOError("receive: " + describe(e));
    }
  }

  void pause_bound(bool paused) override { bound_paused_ = paused; }

  Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) override {
    const bool part_changed = part_limit(max_part_bytes) != part_limit(limits_.bound_max_part_bytes);
    limits_.bound_max_part_bytes = max_part_bytes;
    limits_.bound_max_connections = max_connections;
    if (!router_) return {};
    guard_->set_max_connections(max_connections);
    guard_->set_max_part_bytes(part_limit(max_part_bytes));
    try {
      router_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(part_limit(max_part_bytes)));
    } catch (const zmq::error_t& e) {
      return Status::IOError("limiting parts on " + bound_ + ": " + describe(e));
    }
    // ZeroMQ checks no part limit over inproc.
    if (!part_changed || bound_.empty() || router_inproc_) return {};
    return listen_again();
  }

  TransportStats stats() const override {
    TransportStats s = stats_;
    if (guard_) guard_->add_to(s);
    return s;
  }

 private:
  struct Connection {
    PeerId id;
    std::string endpoint;
    zmq::socket_t socket;
  };

  // A DEALER connected to `given` (with CURVE, set up to verify the
  // server's key): the endpoint without its key, and the socket.
  Result<std::pair<std::string, zmq::socket_t>> open_dealer(const std::string& given) {
    auto split = split_server_key(given);
    if (!split) return Status::InvalidArgument("connect: " + split.status().message());
    const auto& [endpoint, carried_key] = *split;
    try {
      zmq::socket_t dealer(context_, zmq::socket_type::dealer);
      configure(dealer, limits_.max_message_bytes);
      if (curve_) {
        const std::optional<CurveKey> server = carried_key ? carried_key : curve_->server_key;
        if (!server)
          return Status::InvalidArgument("connect " + endpoint +
                                         ": CURVE is on, and the server's public key is not known (the endpoint "
                                         "carries none; for the coordinator give --coordinator-key)");
        if (!std::binary_search(curve_->allowed.begin(), curve_->allowed.end(), *server))
          return Status::InvalidArgument("connect " + endpoint + ": the server's key " + key_fingerprint(*server) +
                                         " is not in the allow-list (--auth-keys)");
        dealer.set(zmq::sockopt::curve_serverkey, zmq::buffer(*server));
        dealer.set(zmq::sockopt::curve_publickey, zmq::buffer(curve_->public_key));
        dealer.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve_->secret_key));
      } else if (carried_key) {
        return Status::InvalidArgument("connect " + endpoint +
                                       ": the server there uses CURVE (the endpoint carries its key); this process "
                                       "needs --auth-keys");
      }
      dealer.connect(endpoint);
      return std::pair<std::string, zmq::socket_t>(endpoint, std::move(dealer));
    } catch (const zmq::error_t& e) {
      const std::string msg = "connect " + endpoint + ": " + describe(e);
      switch (e.num()) {
        case EINVAL:
        case EPROTONOSUPPORT:
        case ENOCOMPATPROTO:
          return Status::InvalidArgument(msg);
        default:
          return Status::IOError(msg);
      }
    }
  }

  // ZMQ_MAXMSGSIZE for a socket whose peers may send parts of up to
  // `max_part_bytes`: no part is larger than a whole message may be.
  std::size_t part_limit(std::size_t max_part_bytes) const {
    return std::min({max_part_bytes, limits_.max_message_bytes,
                     static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())});
  }

  void configure(zmq::socket_t& s, std::size_t max_part_bytes) const {
    s.set(zmq::sockopt::sndhwm, limits_.send_high_water_mark);
    s.set(zmq::sockopt::rcvhwm, limits_.receive_high_water_mark);
    // libzmq refuses a single part over the limit when its size arrives,
    // before allocating it; over tcp and ipc it does so by dropping the
    // sending peer's connection (the peer reconnects), so such a message
    // never reaches receive() to be counted (on the bound endpoint the
    // gatekeeper counts the connection). Messages whose parts are each
    // under it but that are too large or too many in sum are counted in
    // read_message.
    s.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(part_limit(max_part_bytes)));
    s.set(zmq::sockopt::linger, kLingerMs);
  }

  // Closes the bound endpoint's listener and binds the same endpoint again,
  // so that the ROUTER's options as they are now apply to what it accepts:
  // libzmq copies them into a listener when it binds. The connections the
  // old listener had accepted close with it.
  Status listen_again() {
    const std::string what = "listening again on " + bound_;
    const std::uint64_t closed = guard_->listeners_closed();
    try {
      router_->unbind(bound_);
    } catch (const zmq::error_t& e) {
      return Status::IOError(what + ": " + describe(e));
    }
    // The listener closes on ZeroMQ's I/O thread; until it has, its port
    // is taken.
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (guard_->listeners_closed() == closed) {
      if (Clock::now() > until) return Status::IOError(what + ": the old listener did not close within 5 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    try {
      router_->bind(bound_);
    } catch (const zmq::error_t& e) {
      return Status::IOError(what + ": " + describe(e) + "; nothing listens there now");
    }
    return {};
  }

  Connection* connection(const PeerId& peer) {
    std::size_t n = 0;
    const char* first = peer.data() + 2;
    const char* last = peer.data() + peer.size();
    auto [end, ec] = std::from_chars(first, last, n);
    if (ec != std::errc() || end != last || first == last || n >= connections_.size()) return nullptr;
    return &connections_[n];
  }

  // Sends `identity` (router only) then the parts. All or nothing: libzmq
  // accepts the rest of a multipart message once it accepted its first frame.
  Result<bool> send_parts(zmq::socket_t& socket, std::optional<std::string> identity, const Message& message) {
    std::vector<zmq::message_t> frames;
    frames.reserve(message.size());
    for (const Part& p : message) frames.push_back(to_zmq(p));
    bool first = true;
    if (identity) {
      zmq::message_t id(identity->data(), identity->size());
      if (!socket.send(id, zmq::send_flags::dontwait | zmq::send_flags::sndmore)) return false;
      first = false;
    }
    for (std::size_t i = 0; i < frames.size(); ++i) {
      auto flags = zmq::send_flags::dontwait;
      if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
      if (!socket.send(frames[i], flags)) {
        if (first) return false;
        // Cannot happen (see above); if it did, the message is half sent.
        return Status::Internal("send: libzmq refused a later part of a multipart message");
      }
      first = false;
    }
    ++stats_.sent;
    return true;
  }

  // Reads one whole multipart message from a socket poll said is readable;
  // nullopt when it was dropped (over the limits) or not there after all.
  std::optional<Incoming> read_message(zmq::socket_t& socket, const Connection* from) {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
    Incoming in;
    if (from == nullptr) {
      in.from = "r:" + hex_encode(std::span<const std::byte>(static_cast<const std::byte*>(frame.data()), frame.size()));
      // libzmq delivers a multipart message whole: the rest is already here.
      if (!frame.more() || !socket.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
    } else {
      in.from = from->id;
    }
    bool too_large = false;
    std::size_t parts = 0;
    std::size_t bytes = 0;
    while (true) {
      const bool more = frame.more();
      ++parts;
      bytes += frame.size();
      if (parts > limits_.max_parts || bytes > limits_.max_message_bytes) too_large = true;
      if (too_large) {
        in.message.clear();  // free what was kept; read and discard the rest
      } else {
        const bool inproc = from == nullptr ? router_inproc_ : from->endpoint.starts_with("inproc:");
        in.message.push_back(from_zmq(std::move(frame), !inproc));
      }
      if (!more || !socket.recv(frame, zmq::recv_flags::dontwait)) break;
    }
    if (too_large) {
      ++stats_.dropped_oversized;
      return std::nullopt;
    }
    return in;
  }

  TransportLimits limits_;
  std::optional<CurveOptions> curve_;  // allowed: sorted
  std::string name_;                   // for log lines
  // Declared before the sockets so it outlives them: closing a context waits
  // for its sockets.
  zmq::context_t context_;
  std::unique_ptr<Gatekeeper> guard_;  // once bound
  std::optional<zmq::socket_t> router_;
  std::string bound_;
  bool router_inproc_ = false;  // bound to an inproc endpoint: what it receives may be the sender's bytes
  bool bound_paused_ = false;   // pause_bound: receive() leaves the router unread
  std::vector<Connection> connections_;
  std::size_t next_first_ = 0;
  TransportStats stats_;
  zmq::socket_t wake_rx_{context_, zmq::socket_type::pair};
  zmq::socket_t wake_tx_{context_, zmq::socket_type::pair};
  std::mutex wake_mu_;  // wake() is the one call other threads make
};

}  // namespace

std::unique_ptr<Transport> make_zmq_transport(TransportLimits limits, std::optional<CurveOptions> curve,
                                              std::string log_name) {
  return std::make_unique<ZmqTransport>(limits, std::move(curve), std::move(log_name));
}

}  // namespace asgd::messaging
