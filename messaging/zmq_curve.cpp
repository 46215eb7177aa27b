#include "messaging/zmq_curve.hpp"

#include <algorithm>

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

}  // namespace asgd::messaging
