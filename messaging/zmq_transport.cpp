// The ZeroMQ transport. Everything ZeroMQ-specific (cppzmq types, its
// exceptions, errno values) stays in this file: callers see Status values.

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

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

// Refused attempts logged per minute at most; the rest are counted, and the
// next line logged says how many were left out. A flood of handshakes (a
// misconfigured peer retries ten times a second) must not fill the disk.
constexpr int kRefusalLinesPerMinute = 5;

// Why libzmq failed a handshake on our bound endpoint, for the log.
std::string handshake_failure(std::uint16_t event, std::uint32_t value) {
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    return "the handshake did not complete (the peer hung up: a client without CURVE, or not ZeroMQ at all)";
  switch (value) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "not a CURVE client (plain text, or another security mechanism)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "its handshake did not decrypt (a client holding a wrong server key?)";
    default: {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", value);
      return std::string("a malformed handshake (ZeroMQ protocol error ") + hex + ")";
    }
  }
}

// The CURVE gatekeeper of one transport's bound endpoint, on its own thread:
//   - the ZAP handler of the transport's zmq context (libzmq asks it about
//     every client that completes a CURVE hello: admit it or not), and
//   - a monitor of the ROUTER, which sees the attempts that never reach ZAP
//     (a plain-text client, a wrong server key, garbage) and the handshakes
//     that succeed.
// Built before the ROUTER binds, destroyed after it closed: while the ZAP
// socket is bound an unanswered request stalls a handshake (fails closed);
// a context without a ZAP handler would admit any CURVE client.
class CurveGuard {
 public:
  CurveGuard(zmq::context_t& context, zmq::socket_t& router, const CurveOptions& curve)
      : name_(curve.log_name),
        allowed_(curve.allowed),
        budget_(kRefusalLinesPerMinute, std::chrono::minutes(1)),
        zap_(context, zmq::socket_type::rep),
        monitor_(context, zmq::socket_type::pair),
        stop_rx_(context, zmq::socket_type::pair),
        stop_tx_(context, zmq::socket_type::pair) {
    std::sort(allowed_.begin(), allowed_.end());
    zap_.set(zmq::sockopt::linger, 0);
    zap_.bind("inproc://zeromq.zap.01");  // the name libzmq looks for, in this context only
    const std::string tag = std::to_string(reinterpret_cast<std::uintptr_t>(this));
    const std::string monitor_at = "inproc://asgd-curve-monitor-" + tag;
    if (zmq_socket_monitor(router.handle(), monitor_at.c_str(),
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
      throw zmq::error_t();
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(monitor_at);
    stop_rx_.bind("inproc://asgd-curve-stop-" + tag);
    stop_tx_.connect("inproc://asgd-curve-stop-" + tag);
    stop_rx_.set(zmq::sockopt::linger, 0);
    stop_tx_.set(zmq::sockopt::linger, 0);
    thread_ = std::thread([this] { run(); });
  }

  ~CurveGuard() {
    try {
      zmq::message_t stop(1);
      (void)stop_tx_.send(stop, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    thread_.join();
    if (budget_.held_back() > 0)
      spdlog::warn("{}: {} further refused connection attempts were counted, not logged", name_, budget_.held_back());
  }

  CurveGuard(const CurveGuard&) = delete;
  CurveGuard& operator=(const CurveGuard&) = delete;

  std::uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  std::uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }

 private:
  void run() {
    while (true) {
      zmq_pollitem_t items[] = {{stop_rx_.handle(), 0, ZMQ_POLLIN, 0},
                                {zap_.handle(), 0, ZMQ_POLLIN, 0},
                                {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 3, std::chrono::milliseconds(-1));
        if (items[0].revents & ZMQ_POLLIN) return;
        if (items[1].revents & ZMQ_POLLIN) answer_zap();
        if (items[2].revents & ZMQ_POLLIN) read_monitor();
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        if (e.num() != EINTR) spdlog::error("{}: the CURVE gatekeeper: {}", name_, e.what());
      }
    }
  }

  // One ZAP request (RFC 27): version, request id, domain, address, routing
  // id, mechanism, credentials (CURVE: the client's 32-byte public key).
  // Always answered, so the REP socket never gets stuck.
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
    const std::string user = ok ? key_fingerprint(*key) : "";
    const std::string reply[] = {"1.0", request_id, ok ? "200" : "400", ok ? "OK" : "not allowed", user, ""};
    for (std::size_t i = 0; i < std::size(reply); ++i)
      zap_.send(zmq::buffer(reply[i]), i + 1 < std::size(reply) ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (!ok) refused(address.empty() ? "a local peer" : address, key, why);
  }

  // One monitor event: a u16 event and a u32 value, then our endpoint.
  void read_monitor() {
    zmq::message_t head, where;
    if (!monitor_.recv(head, zmq::recv_flags::dontwait)) return;
    if (head.more()) (void)monitor_.recv(where, zmq::recv_flags::dontwait);
    if (head.size() < 6) return;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    std::memcpy(&event, head.data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, sizeof value);
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      accepted_.fetch_add(1, std::memory_order_relaxed);
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
      // libzmq does not tell the peer's address here; our endpoint is what we know.
      refused("a peer on " + where.to_string() + " (address not known at this stage)", std::nullopt,
              handshake_failure(event, value));
    }
  }

  void refused(const std::string& from, const std::optional<CurveKey>& key, const std::string& why) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t left_out = 0;
    if (!budget_.allow(LogBudget::Clock::now(), left_out)) return;
    spdlog::warn("{}: refused a connection from {}{}: {}{}", name_, from,
                 key ? " with key " + key_fingerprint(*key) : std::string(), why,
                 left_out ? " (" + std::to_string(left_out) + " more refused since the last line, counted, not logged)"
                          : std::string());
  }

  std::string name_;
  std::vector<CurveKey> allowed_;  // sorted
  LogBudget budget_;               // the guard's thread only
  std::atomic<std::uint64_t> accepted_{0};
  std::atomic<std::uint64_t> rejected_{0};
  zmq::socket_t zap_;
  zmq::socket_t monitor_;
  zmq::socket_t stop_rx_;
  zmq::socket_t stop_tx_;
  std::thread thread_;
};

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(TransportLimits limits, std::optional<CurveOptions> curve) : limits_(limits), curve_(std::move(curve)) {
    if (curve_) std::sort(curve_->allowed.begin(), curve_->allowed.end());
    // A PAIR of inproc sockets lets other threads interrupt a poll.
    const std::string name = "inproc://asgd-wake-" + std::to_string(reinterpret_cast<std::uintptr_t>(this));
    wake_rx_.bind(name);
    wake_tx_.connect(name);
    wake_rx_.set(zmq::sockopt::linger, 0);
    wake_tx_.set(zmq::sockopt::linger, 0);
  }

  ~ZmqTransport() override {
    // The ROUTER goes before its gatekeeper (see CurveGuard).
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
        configure(router);
        // A send to an identity we do not know fails (EHOSTUNREACH) instead
        // of vanishing, and a full peer queue says EAGAIN instead of dropping.
        router.set(zmq::sockopt::router_mandatory, true);
        if (curve_) {
          router.set(zmq::sockopt::curve_server, true);
          router.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve_->secret_key));
          router.set(zmq::sockopt::zap_domain, "asgd");
          guard_ = std::make_unique<CurveGuard>(context_, router, *curve_);  // before anyone can connect
        }
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

  TransportStats stats() const override {
    TransportStats s = stats_;
    if (guard_) {
      s.auth_accepted = guard_->accepted();
      s.auth_rejected = guard_->rejected();
    }
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
      configure(dealer);
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

  void configure(zmq::socket_t& s) const {
    s.set(zmq::sockopt::sndhwm, limits_.send_high_water_mark);
    s.set(zmq::sockopt::rcvhwm, limits_.receive_high_water_mark);
    // libzmq refuses a single frame over the limit before allocating it; over
    // tcp and ipc it does so by dropping the sending peer's connection (the
    // peer reconnects), so such a message never reaches receive() to be
    // counted. Messages whose frames are each under it but that are too large
    // or too many in sum are counted in read_message.
    s.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(std::min<std::size_t>(
                                        limits_.max_message_bytes, static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()))));
    s.set(zmq::sockopt::linger, kLingerMs);
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
  // Declared before the sockets so it outlives them: closing a context waits
  // for its sockets.
  zmq::context_t context_;
  std::unique_ptr<CurveGuard> guard_;  // with CURVE, once bound
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

std::unique_ptr<Transport> make_zmq_transport(TransportLimits limits, std::optional<CurveOptions> curve) {
  return std::make_unique<ZmqTransport>(limits, std::move(curve));
}

}  // namespace asgd::messaging
