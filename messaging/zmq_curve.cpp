#include "messaging/zmq_curve.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "messaging/zmq_gatekeeper.hpp"  // kHandshakeMs

namespace asgd::messaging {

Result<CurveTarget> curve_target(const std::string& who, const std::string& given,
                                 const std::optional<CurveOptions>& curve, const std::string& hint) {
  auto split = split_server_key(given);
  if (!split) return Status::InvalidArgument(who + ": " + split.status().message());
  auto& [endpoint, carried] = *split;
  const std::string at = who + " " + endpoint;
  if (!curve) {
    if (carried)
      return Status::InvalidArgument(at + ": the server there uses CURVE (the endpoint carries its key); this "
                                          "process needs --auth-keys");
    return CurveTarget{std::move(endpoint), std::nullopt};
  }
  const std::optional<CurveKey> key = carried ? carried : curve->server_key;
  if (!key)
    return Status::InvalidArgument(at + ": CURVE is on, and the server's public key is not known (the endpoint "
                                        "carries none" + hint + ")");
  // (CurveOptions::allowed is not sorted: a linear search, once a connection.)
  if (std::find(curve->allowed.begin(), curve->allowed.end(), *key) == curve->allowed.end())
    return Status::InvalidArgument(at + ": the server's key " + key_fingerprint(*key) +
                                   " is not in the allow-list (--auth-keys)");
  return CurveTarget{std::move(endpoint), key};
}

void set_curve_client(zmq::socket_t& socket, const CurveTarget& target, const std::optional<CurveOptions>& curve) {
  if (!target.key || !curve) return;
  socket.set(zmq::sockopt::curve_serverkey, zmq::buffer(*target.key));
  socket.set(zmq::sockopt::curve_publickey, zmq::buffer(curve->public_key));
  socket.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve->secret_key));
}

void set_curve_server(zmq::socket_t& socket, const std::optional<CurveOptions>& curve) {
  socket.set(zmq::sockopt::handshake_ivl, kHandshakeMs);
  if (curve) {
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve->secret_key));
  }
  socket.set(zmq::sockopt::zap_domain, "asgd");
}

RefusalWatch::RefusalWatch(zmq::context_t& context, zmq::socket_t& socket, std::string_view tag)
    : watched_(socket.handle()), monitor_(context, zmq::socket_type::pair) {
  const std::string at = "inproc://asgd-refusals-" + std::string(tag);
  if (zmq_socket_monitor(watched_, at.c_str(), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) throw zmq::error_t();
  monitor_.set(zmq::sockopt::linger, 0);
  // Connected before the socket can fail a handshake: libzmq's monitor
  // waits for a reader to send an event.
  monitor_.connect(at);
}

RefusalWatch::~RefusalWatch() {
  if (watched_ != nullptr) (void)zmq_socket_monitor(watched_, nullptr, 0);
}

int RefusalWatch::fd() { return monitor_.get(zmq::sockopt::fd); }

std::optional<int> RefusalWatch::take() {
  if (watched_ == nullptr) return std::nullopt;
  zmq::message_t head, where;
  // An event: a u16 event and a u32 value (the ZAP status), then the endpoint.
  if (!monitor_.recv(head, zmq::recv_flags::dontwait)) return std::nullopt;
  if (head.more()) (void)monitor_.recv(where, zmq::recv_flags::dontwait);  // sent with it: already here
  std::uint32_t status = 0;
  if (head.size() >= 6) std::memcpy(&status, static_cast<const char*>(head.data()) + 2, sizeof status);
  (void)zmq_socket_monitor(watched_, nullptr, 0);
  watched_ = nullptr;
  return static_cast<int>(status);
}

std::string refusal_reason(const std::string& who, const std::string& me, const std::string& folder, int zap_status,
                           const std::optional<CurveOptions>& curve) {
  if (zap_status != 400) return fmt::format("{} refused this {}'s connection (ZAP status {})", who, me, zap_status);
  const std::string key = curve ? " " + key_fingerprint(curve->public_key) : std::string();
  return fmt::format("{} refused this {}'s key{}: {} lacks this process's .pub", who, me, key, folder);
}

}  // namespace asgd::messaging
