#pragma once
// Internal to the ZeroMQ transport and the workers' collective: both sides
// of CURVE (--auth-keys) on a socket, shared so that both check a server's
// key by the same rules and say the same things.

#include <zmq.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "asgd/status.hpp"
#include "messaging/curve_auth.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {

/// Where a client connects and the server key it is to check.
struct CurveTarget {
  std::string endpoint;           ///< without its key
  std::optional<CurveKey> key;    ///< with CURVE on: the server's key; without: none
};

/// Resolves `given` for a client with `curve` (or without it): the key the
/// endpoint carries (with_server_key), else `curve->server_key`, which must
/// be in the allow-list. Errors (invalid_argument, starting with `who` and
/// the endpoint: "connect tcp://..."): a malformed key; with CURVE on, no
/// key known (`hint` says where to find one) or one not allowed; without
/// it, an endpoint that carries a key.
Result<CurveTarget> curve_target(const std::string& who, const std::string& given,
                                 const std::optional<CurveOptions>& curve, const std::string& hint = {});

/// Sets `socket` up to verify `target`'s key and to prove ours (nothing
/// without a key). Before it connects.
void set_curve_client(zmq::socket_t& socket, const CurveTarget& target, const std::optional<CurveOptions>& curve);

/// Sets up a socket about to bind: a handshake within kHandshakeMs
/// (zmq_gatekeeper.hpp), with `curve` a CURVE server holding its secret
/// key, and the ZAP domain that makes libzmq ask the context's gatekeeper
/// about every peer, which must then run before the socket binds.
void set_curve_server(zmq::socket_t& socket, const std::optional<CurveOptions>& curve);

/// Tells a CURVE client when the server refused its key: the ZAP handler
/// there answered 300, 400 or 500, which the server sends back in the
/// handshake (ZMTP 3.1) and libzmq reports to the client only through a
/// monitor of its socket. Made before the socket connects; destroyed
/// before the socket closes. After the first refusal the socket is no
/// longer watched.
class RefusalWatch {
 public:
  /// Watches `socket` of `context`, naming its monitor after `tag`
  /// (unique in the context). Throws zmq::error_t.
  RefusalWatch(zmq::context_t& context, zmq::socket_t& socket, std::string_view tag);
  ~RefusalWatch();
  RefusalWatch(const RefusalWatch&) = delete;
  RefusalWatch& operator=(const RefusalWatch&) = delete;

  /// A descriptor that becomes readable when the monitor has news (its
  /// ZMQ_FD); poll it, then call take().
  int fd();
  /// The ZAP status of the refusal, the first time one is there; nullopt
  /// otherwise. Never blocks.
  std::optional<int> take();
  /// False once a refusal was taken.
  bool watching() const { return watched_ != nullptr; }

 private:
  void* watched_;  // the socket's handle; null once no longer watched
  zmq::socket_t monitor_;
};

/// What a refusal means, in a line: "WHO refused this ME's key KEY: FOLDER
/// lacks this process's .pub" for ZAP status 400, where FOLDER names the
/// --auth-keys folder at the refusing end; "WHO refused this ME's
/// connection (ZAP status N)" otherwise. KEY is `curve`'s fingerprint.
std::string refusal_reason(const std::string& who, const std::string& me, const std::string& folder, int zap_status,
                           const std::optional<CurveOptions>& curve);

}  // namespace asgd::messaging
