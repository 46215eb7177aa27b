// The ZeroMQ transport. Everything ZeroMQ-specific (cppzmq types, its
// exceptions, errno values) stays in this file and its gatekeeper
// (zmq_gatekeeper.hpp): callers see Status values.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
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
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "messaging/curve_auth.hpp"
#include "messaging/zmq_curve.hpp"
#include "messaging/transport.hpp"
#include "messaging/zmq_gatekeeper.hpp"

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

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(TransportLimits limits, std::optional<CurveOptions> curve, std::string name)
      : limits_(limits), curve_(std::move(curve)), name_(std::move(name)),
        wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    // Without it nothing could interrupt a wait: as fatal as a socket that
    // cannot be made (out of file descriptors).
    if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), name_ + ": eventfd for wake()");
  }

  ~ZmqTransport() override {
    // The ROUTER goes before its gatekeeper (see Gatekeeper).
    router_.reset();
    guard_.reset();
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  void wake() override {
    const std::uint64_t one = 1;
    // A counter at its limit already holds a wake-up: nothing is lost.
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
  }

  Result<std::string> bind(const std::string& endpoint) override {
    std::lock_guard lock(mu_);
    try {
      if (!router_) {
        zmq::socket_t router(context_, zmq::socket_type::router);
        configure(router, limits_.bound_max_part_bytes);
        // A send to an identity we do not know fails (EHOSTUNREACH) instead
        // of vanishing, and a full peer queue says EAGAIN instead of dropping.
        router.set(zmq::sockopt::router_mandatory, true);
        set_curve_server(router, curve_);  // asks the gatekeeper, with or without CURVE
        // Before anyone can connect.
        guard_ = Gatekeeper::start(context_, router, name_, curve_, limits_.bound_max_connections,
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
    std::lock_guard lock(mu_);
    dealer->id = "c:" + std::to_string(connections_.size());
    connections_.push_back(std::move(*dealer));
    return connections_.back().id;
  }

  Status reconnect(const PeerId& peer, const std::string& given) override {
    auto dealer = open_dealer(given);
    if (!dealer) return dealer.status();
    std::lock_guard lock(mu_);
    Connection* c = connection(peer);
    if (c == nullptr) return Status::NotFound("reconnect " + peer + ": no such connection");
    // The old socket closes with what it still queued (linger: kLingerMs),
    // no longer watched.
    dealer->id = c->id;
    c->watch.reset();
    *c = std::move(*dealer);
    return {};
  }

  Result<bool> send(const PeerId& peer, Message message) override {
    std::lock_guard lock(mu_);
    return send_locked(peer, message);
  }

  // From the caller's thread, the sockets being guarded by mu_: whatever
  // the owning thread is doing, it is not in a call on them (its waits are
  // poll() on their descriptors, outside the lock). A send may take the
  // signal that a message arrived on that socket (libzmq handles its
  // mailbox in every call): the owning thread is then woken to read it.
  bool send_now(const PeerId& peer, const Message& message) override {
    if (message.empty()) return false;
    std::lock_guard lock(mu_);
    zmq::socket_t* socket = socket_of(peer);
    if (socket == nullptr) return false;
    auto sent = send_locked(peer, message);
    try {
      if (socket->get(zmq::sockopt::events) & ZMQ_POLLIN) wake();
    } catch (const zmq::error_t&) {
      wake();  // the owning thread finds out what
    }
    return sent.ok() && *sent;
  }

  // The sockets' events are read under mu_, the wait is poll() on their
  // descriptors (libzmq's ZMQ_FD, readable when the socket has news) with
  // the lock let go, so send_now() goes on meanwhile.
  Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
    try {
      std::vector<pollfd> fds;
      while (true) {
        fds.clear();
        {
          std::lock_guard lock(mu_);
          const std::vector<zmq::socket_t*> sockets = readable_sockets();
          std::optional<Incoming> in = read_any(sockets);
          if (in) return in;
          for (zmq::socket_t* s : sockets) fds.push_back({s->get(zmq::sockopt::fd), POLLIN, 0});
          if (note_refusals()) return std::optional<Incoming>();  // the caller takes them
          for (auto& c : connections_)
            if (c.watch && c.watch->watching()) fds.push_back({c.watch->fd(), POLLIN, 0});
        }
        const auto left = std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                                   std::chrono::milliseconds(0));
        const std::size_t first_watched = fds.size();
        for (int fd : watched_) fds.push_back({fd, POLLIN, 0});
        fds.push_back({wake_fd_, POLLIN, 0});  // last: not a peer
        if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30))) < 0 &&
            errno != EINTR)
          return Status::IOError(std::string("receive: poll: ") + std::strerror(errno));
        // A doorbell: the caller reads it. Before wake()'s counter, which
        // stays unread then, so that the caller can tell the two apart.
        for (std::size_t k = first_watched; k + 1 < fds.size(); ++k)
          if (fds[k].revents & POLLIN) return std::optional<Incoming>();
        if (fds.back().revents & POLLIN) {  // woken: drain, and return to the caller
          std::uint64_t count = 0;
          [[maybe_unused]] const ssize_t n = read(wake_fd_, &count, sizeof count);
          std::lock_guard lock(mu_);
          return read_any(readable_sockets());  // a send_now() may have woken it for a message
        }
        if (left.count() == 0) {  // the time is up: a last look at what the sockets signalled
          std::lock_guard lock(mu_);
          return read_any(readable_sockets());
        }
      }
    } catch (const zmq::error_t& e) {
      return Status::IOError("receive: " + describe(e));
    }
  }

  void pause_bound(bool paused) override {
    std::lock_guard lock(mu_);
    bound_paused_ = paused;
  }

  std::vector<Refusal> take_refusals() override {
    std::lock_guard lock(mu_);
    return std::exchange(refusals_, {});
  }

  bool watch(int fd) override {
    watched_.push_back(fd);  // the owning thread's alone
    return true;
  }

  Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) override {
    std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    TransportStats s = stats_;
    if (guard_) guard_->add_to(s);
    return s;
  }

 private:
  struct Connection {
    PeerId id;
    std::string endpoint;
    zmq::socket_t socket;
    std::unique_ptr<RefusalWatch> watch;  // with CURVE; after socket: stops watching before it closes
  };

  // Moves the refusals the connections' watches have into refusals_; true
  // when any are waiting there to be taken. Under mu_.
  bool note_refusals() {
    for (auto& c : connections_) {
      if (!c.watch) continue;
      if (const std::optional<int> status = c.watch->take()) {
        refusals_.push_back({c.id, c.endpoint, *status});
        ++stats_.refused_by_peers;
      }
    }
    return !refusals_.empty();
  }

  Result<bool> send_locked(const PeerId& peer, const Message& message) {
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

  zmq::socket_t* socket_of(const PeerId& peer) {
    if (peer.starts_with("c:")) {
      Connection* c = connection(peer);
      return c ? &c->socket : nullptr;
    }
    return peer.starts_with("r:") && router_ ? &*router_ : nullptr;
  }

  // The sockets receive() reads: the bound endpoint's unless paused, then
  // the connections (read_any counts on that order).
  std::vector<zmq::socket_t*> readable_sockets() {
    std::vector<zmq::socket_t*> sockets;
    if (router_ && !bound_paused_) sockets.push_back(&*router_);
    for (auto& c : connections_) sockets.push_back(&c.socket);
    return sockets;
  }

  // The next whole message any of `sockets` (readable_sockets()) holds,
  // starting after the socket served last time, so one busy peer cannot
  // starve the others. Under mu_.
  std::optional<Incoming> read_any(const std::vector<zmq::socket_t*>& sockets) {
    const bool with_router = sockets.size() > connections_.size();
    for (std::size_t k = 0; k < sockets.size(); ++k) {
      const std::size_t i = (next_first_ + k) % sockets.size();
      const bool is_router = with_router && i == 0;
      // Until it holds no more: one dropped (over the limits) may be
      // followed by one already here, which its descriptor no longer signals.
      while (sockets[i]->get(zmq::sockopt::events) & ZMQ_POLLIN) {
        next_first_ = i + 1;
        std::optional<Incoming> in =
            read_message(*sockets[i], is_router ? nullptr : &connections_[i - (with_router ? 1 : 0)]);
        if (in) {
          ++stats_.received;
          return in;
        }
      }
    }
    return std::nullopt;
  }

  // A DEALER connected to `given` (with CURVE, set up to verify the
  // server's key, and watched for the server's refusing ours): the
  // endpoint without its key, and the socket; no id yet.
  Result<Connection> open_dealer(const std::string& given) {
    auto target = curve_target("connect", given, curve_, "; for the coordinator give --coordinator-key");
    if (!target) return target.status();
    const std::string& endpoint = target->endpoint;
    try {
      zmq::socket_t dealer(context_, zmq::socket_type::dealer);
      configure(dealer, limits_.max_message_bytes);
      set_curve_client(dealer, *target, curve_);
      std::unique_ptr<RefusalWatch> watch;
      if (target->key && !endpoint.starts_with("inproc:"))  // inproc has no handshake
        watch = std::make_unique<RefusalWatch>(context_, dealer, std::to_string(++dealers_opened_));
      dealer.connect(endpoint);
      return Connection{{}, endpoint, std::move(dealer), std::move(watch)};
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
  std::optional<CurveOptions> curve_;
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
  std::uint64_t dealers_opened_ = 0;  // names each watch's monitor
  std::vector<Refusal> refusals_;     // noted, not yet taken
  std::size_t next_first_ = 0;
  std::vector<int> watched_;  // descriptors a receive() also waits on (watch)
  TransportStats stats_;
  int wake_fd_ = -1;  // an eventfd: wake() counts it up, receive() waits on it
  // Guards the sockets and everything above but watched_: send_now() and
  // wake() are called from other threads; the owning thread holds it for
  // every call into libzmq, and lets it go while it waits.
  mutable std::mutex mu_;
};

}  // namespace

std::unique_ptr<Transport> make_zmq_transport(TransportLimits limits, std::optional<CurveOptions> curve,
                                              std::string log_name) {
  return std::make_unique<ZmqTransport>(limits, std::move(curve), std::move(log_name));
}

}  // namespace asgd::messaging
