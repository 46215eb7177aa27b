#pragma once
// Internal to the ZeroMQ transport (zmq_transport.cpp): the gatekeeper of
// its bound endpoint.
//
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

#include <zmq.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "messaging/curve_auth.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging {

// How long a peer of the bound endpoint has to complete its handshake
// (ZMQ_HANDSHAKE_IVL; libzmq's default is 30 s). A connection that never
// does holds one of bound_max_connections until then; peers of a job
// finish in milliseconds.
constexpr int kHandshakeMs = 10000;

class Gatekeeper {
 public:
  /// Watches `router` (not yet bound) and answers its context's ZAP
  /// requests until destroyed, which must happen after the ROUTER closed.
  /// Throws zmq::error_t when the monitor cannot be set up.
  static std::unique_ptr<Gatekeeper> start(zmq::context_t& context, zmq::socket_t& router, std::string name,
                                           const std::optional<CurveOptions>& curve, std::size_t max_connections,
                                           std::size_t max_part_bytes);
  virtual ~Gatekeeper() = default;

  virtual void set_max_connections(std::size_t n) = 0;
  virtual void set_max_part_bytes(std::size_t n) = 0;
  /// Listeners of the ROUTER that have closed so far.
  virtual std::uint64_t listeners_closed() const = 0;
  /// Its counts: refused connections, those over the limit, CURVE clients
  /// admitted and refused.
  virtual void add_to(TransportStats& s) const = 0;
};

}  // namespace asgd::messaging
