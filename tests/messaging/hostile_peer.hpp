#pragma once
// A hostile peer of a bound endpoint, written with raw TCP sockets so that
// it can do what no ZeroMQ socket would: complete a ZMTP 3.0 NULL handshake
// by hand, then announce a frame it never finishes, or send bytes that are
// not ZeroMQ at all. And the resident memory of a process, to see what such
// a peer costs the one it connects to.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "test_helpers.hpp"

namespace asgd_test {

/// What RawConnection::send_filler sends, allocated when the program starts
/// (so not counted against a test that measures this process's memory).
inline const std::vector<char> kFiller(1u << 20, 'x');

/// One raw TCP connection, closed when it goes.
class RawConnection {
 public:
  /// Connects to "tcp://HOST:PORT" (an IPv4 address; a " curve:KEY" suffix
  /// is ignored). fd() is -1 when it failed.
  explicit RawConnection(const std::string& endpoint) {
    const auto start = endpoint.find("://");
    const auto colon = endpoint.rfind(':');
    if (start == std::string::npos || colon == std::string::npos || colon < start + 3) return;
    const std::string host = endpoint.substr(start + 3, colon - start - 3);
    const int port = std::stoi(endpoint.substr(colon + 1));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET, host == "*" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1) return;
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  RawConnection(RawConnection&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }

  int fd() const { return fd_; }

  /// Sends all of `bytes` (blocking); false when the connection refused them.
  bool send_all(const void* bytes, std::size_t n) {
    const char* p = static_cast<const char*>(bytes);
    while (n > 0) {
      const ssize_t sent = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (sent <= 0) return false;
      p += sent;
      n -= static_cast<std::size_t>(sent);
    }
    return true;
  }

  /// Reads exactly `n` bytes within `limit`; false when they did not come.
  bool read_exactly(std::size_t n, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    std::vector<char> buf(n);
    std::size_t got = 0;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (got < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      const ssize_t r = ::recv(fd_, buf.data() + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }

  /// The ZMTP 3.0 handshake of a DEALER with the NULL mechanism: the
  /// 64-byte greeting each way, then a READY command each way. True when
  /// the server answered both.
  bool null_handshake() {
    unsigned char greeting[64] = {};
    greeting[0] = 0xFF;  // signature: 0xFF, 8 bytes of padding, 0x7F
    greeting[9] = 0x7F;
    greeting[10] = 3;  // version 3.0
    greeting[11] = 0;
    std::memcpy(greeting + 12, "NULL", 4);  // mechanism, padded to 20 bytes; as-server 0; filler
    if (!send_all(greeting, sizeof greeting) || !read_exactly(64)) return false;
    // READY: a short command frame (flags 0x04, one size byte), its name,
    // and the property Socket-Type = DEALER.
    std::string body = "\x05READY";
    body += static_cast<char>(11);
    body += "Socket-Type";
    body += std::string("\0\0\0\x06", 4);
    body += "DEALER";
    std::string command;
    command += static_cast<char>(0x04);
    command += static_cast<char>(body.size());
    command += body;
    if (!send_all(command.data(), command.size())) return false;
    // The server's READY: a short command frame, size in its second byte.
    unsigned char head[2];
    if (!read_into(head, 2)) return false;
    return read_exactly(head[1]);
  }

  /// Starts a message frame of `size` bytes (ZMTP 3.0's long form: flags
  /// 0x02, then the size as 8 bytes big-endian) and sends none of it.
  bool announce_frame(std::uint64_t size) {
    unsigned char head[9];
    head[0] = 0x02;
    for (int i = 0; i < 8; ++i) head[1 + i] = static_cast<unsigned char>(size >> (56 - 8 * i));
    return send_all(head, sizeof head);
  }

  /// Sends up to `n` more bytes of filler, as fast as the other side takes
  /// them, giving up once it has not taken any for `stall`. Returns how many
  /// it took.
  std::size_t send_filler(std::size_t n, std::chrono::milliseconds stall = std::chrono::milliseconds(300)) {
    std::size_t sent = 0;
    while (sent < n) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(stall.count())) <= 0 || (p.revents & (POLLERR | POLLHUP))) break;
      const ssize_t r = ::send(fd_, kFiller.data(), std::min(kFiller.size(), n - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (r <= 0) break;
      sent += static_cast<std::size_t>(r);
    }
    return sent;
  }

  /// Whether the other side has closed the connection (or reset it),
  /// looking for up to `limit`. Data it sent first is read and skipped.
  bool closed_by_peer(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0))) <= 0) return false;
      const ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    }
  }

 private:
  bool read_into(unsigned char* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      const ssize_t r = ::recv(fd_, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }

  int fd_ = -1;
};

/// `n` peers that each complete the NULL handshake with `endpoint`,
/// announce a part of `announced` bytes and send up to `sent` bytes of it,
/// then hold their connections (kept in `peers`). Returns how many bytes the
/// other side took from them all.
inline std::size_t announce_and_stall(const std::string& endpoint, int n, std::uint64_t announced, std::size_t sent,
                                      std::vector<RawConnection>& peers) {
  std::size_t taken = 0;
  for (int i = 0; i < n; ++i) {
    peers.emplace_back(endpoint);
    EXPECT_TRUE(peers.back().null_handshake()) << "peer " << i << " of " << endpoint;
    EXPECT_TRUE(peers.back().announce_frame(announced));
    taken += peers.back().send_filler(sent);
  }
  return taken;
}

}  // namespace asgd_test
