#pragma once
// A job's status server (--status-port): a small HTTP/1.1 server on its own
// thread that serves
//   GET /metrics  the job's counters and gauges, Prometheus text format
//   GET /status   the same state as JSON (actors/live_status.hpp)
//   GET /         a page that polls /status and draws live charts
// from a LiveStatus the coordinator keeps current. Anything else is 404 (or
// 405 for another method, 400 for what is not HTTP, 403 for a Host that is
// not a loopback name when the server is bound to loopback). Each
// connection gets 10 s to send its request, 32 are served at once (the
// rest wait to be accepted), and the server never blocks the job.

#include <cstdint>
#include <memory>
#include <string>

#include "asgd/status.hpp"
#include "actors/live_status.hpp"

namespace asgd {

class StatusServer {
 public:
  /// Whether start() takes `address`: an IPv4 or IPv6 address (with a
  /// scope for a link-local one), not a host name.
  static bool is_address(const std::string& address);

  /// Binds address:port (port 0: any free one) and starts serving
  /// `status`, with `page_html` at /. Errors: io_error naming the address
  /// when it cannot bind.
  static Result<std::unique_ptr<StatusServer>> start(const std::string& address, std::uint16_t port,
                                                     std::shared_ptr<const LiveStatus> status, std::string page_html);
  /// What start() would say of address:port, without serving or logging
  /// (a coordinator checks the port before its processes register).
  static Status can_listen(const std::string& address, std::uint16_t port);

  /// Stops serving and joins its thread.
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  /// The port it listens on (the chosen one when asked for 0).
  std::uint16_t port() const;

  struct Impl;

 private:
  explicit StatusServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asgd
