#pragma once
// A minimal HTTP/1.1 client for tests that talk to a server of ours on
// loopback: one request per connection ("Connection: close"), read to EOF.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

namespace asgd_test {

struct HttpReply {
  int status = 0;  // 0: no answer
  std::string headers;
  std::string body;
  nlohmann::json body_json() const { return nlohmann::json::parse(body, nullptr, false); }
};

/// A TCP connection to 127.0.0.1:`port` whose reads give up after 30 s;
/// -1 when it cannot connect.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Sends `request` as it is, then reads the answer to EOF.
inline HttpReply http_raw(int port, const std::string& request) {
  HttpReply reply;
  const int fd = connect_loopback(port);
  if (fd < 0) return reply;
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.headers = raw.substr(0, head_end);
  reply.body = raw.substr(head_end + 4);
  return reply;
}

inline HttpReply http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                      const std::string& host = "127.0.0.1") {
  return http_raw(port, method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n" +
                            "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                            "\r\n\r\n" + body);
}

/// A TCP port on loopback that was free a moment ago (bound, read, closed).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

/// A TCP port held by a listening socket nobody answers (the kernel
/// completes connections) until this is destroyed: on `address` (loopback
/// unless given), at `port` (any free one when 0). port is 0 when it could
/// not be had.
class HeldPort {
 public:
  explicit HeldPort(std::uint16_t want = 0, in_addr_t address = INADDR_LOOPBACK, int backlog = 4)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(want);
    addr.sin_addr.s_addr = htonl(address);
    socklen_t len = sizeof addr;
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd_, backlog) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
  }
  ~HeldPort() { release(); }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  /// Lets the port go now.
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::uint16_t port = 0;

 private:
  int fd_;
};

}  // namespace asgd_test
