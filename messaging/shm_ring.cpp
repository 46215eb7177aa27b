// The ring and the doorbell of make_shm_transport (messaging/shm_ring.hpp
// says what each side may rely on).

#include "messaging/shm_ring.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace asgd::messaging::shm_detail {
namespace {

constexpr std::size_t kEntryHeaderBytes = 8;
constexpr std::size_t kAlign = 8;
constexpr std::size_t kMaxBellName = 80;

std::size_t body_bytes(const Message& m) {
  std::size_t body = 4 * m.size();
  for (const Part& p : m) body += p.bytes.size();
  return body;
}

// The abstract-namespace address of the doorbell `name` (a leading NUL, no file).
std::pair<sockaddr_un, socklen_t> bell_address(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  return {a, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())};
}

// One datagram to the doorbell `bell` is connected to; false (errno set)
// when it was not sent.
bool ring_once(int bell) {
  const char ding = 1;
  return ::send(bell, &ding, 1, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0;
}

}  // namespace

std::size_t ring_entry_bytes(const Message& m) { return round_up(kEntryHeaderBytes + body_bytes(m), kAlign); }

bool ring_write(const Ring& r, const Message& m) {
  RingHeader* h = r.header();
  const std::size_t cap = r.capacity();
  const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
  const std::uint64_t head = h->head.load(std::memory_order_acquire);
  const std::size_t pos = tail % cap;
  const std::size_t total = ring_entry_bytes(m);
  const std::size_t skip = cap - pos < total ? cap - pos : 0;  // a wrap marker, then the entry at the start
  if (total + skip > cap - (tail - head)) return false;
  if (skip > 0) {
    std::memcpy(r.entries() + pos, &kWrap, 4);
  }
  std::byte* at = r.entries() + (pos + skip) % cap;
  put(at, static_cast<std::uint32_t>(m.size()));
  put(at, static_cast<std::uint32_t>(body_bytes(m)));
  for (const Part& p : m) put(at, static_cast<std::uint32_t>(p.bytes.size()));
  for (const Part& p : m) {
    if (!p.bytes.empty()) std::memcpy(at, p.bytes.data(), p.bytes.size());
    at += p.bytes.size();
  }
  h->tail.store(tail + skip + total, std::memory_order_release);
  return true;
}

RingEntry ring_peek(const Ring& r, std::size_t max_parts, Message& out, std::uint64_t& next) {
  const RingHeader* h = r.header();
  const std::size_t cap = r.capacity();
  std::uint64_t head = h->head.load(std::memory_order_relaxed);
  const std::uint64_t tail = h->tail.load(std::memory_order_acquire);
  if (head == tail) return RingEntry::none;
  if (tail - head > cap || (tail - head) % kAlign != 0 || head % kAlign != 0) return RingEntry::malformed;
  std::size_t pos = head % cap;
  const std::byte* at = r.entries() + pos;
  std::uint32_t parts = get<std::uint32_t>(at);
  if (parts == kWrap) {
    if (cap - pos + kEntryHeaderBytes > tail - head) return RingEntry::malformed;
    head += cap - pos;
    pos = 0;
    at = r.entries();
    parts = get<std::uint32_t>(at);
  }
  const std::uint64_t body = get<std::uint32_t>(at);
  const std::size_t total = round_up(kEntryHeaderBytes + body, kAlign);
  if (parts == 0 || parts > max_parts || total > tail - head || pos + total > cap || 4 * parts > body)
    return RingEntry::malformed;
  // The lengths read once (the writer shares the memory: what was checked
  // is what is used), on the stack for the usual few parts.
  std::array<std::uint32_t, 16> few;
  std::vector<std::uint32_t> many(parts > few.size() ? parts : 0);
  const std::span<std::uint32_t> lengths(parts > few.size() ? many.data() : few.data(), parts);
  std::uint64_t sum = 4 * parts;
  for (auto& n : lengths) sum += (n = get<std::uint32_t>(at));
  if (sum != body) return RingEntry::malformed;
  out.clear();
  for (std::uint32_t n : lengths) {
    out.push_back(Part::copy_of(std::span<const std::byte>(at, n)));
    at += n;
  }
  next = head + total;
  return RingEntry::ready;
}

void ring_consume(const Ring& r, std::uint64_t next) { r.header()->head.store(next, std::memory_order_release); }

void ring_notify(const Ring& r, int bell) {
  // Pairs with the receiver's fence between setting `sleeping` and looking
  // at `tail` once more: one of the two sees the other's store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic<std::uint32_t>& sleeping = r.header()->sleeping;
  if (sleeping.load(std::memory_order_relaxed) == 0 || sleeping.exchange(0) == 0) return;
  (void)ring_once(bell);  // full: it is rung already; gone: nobody to wake
}

bool bell_gone(int bell) {
  // Refused the first time after the peer's socket closed, not connected
  // after that (a ring_notify() may have been the first).
  return !ring_once(bell) && (errno == ECONNREFUSED || errno == ENOTCONN);
}

std::optional<Bell> make_bell(std::mt19937_64& rng) {
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  Bell b{std::make_unique<Fd>(fd), "asgd-bell-" + std::to_string(getpid()) + "-" + std::to_string(rng())};
  const auto [address, length] = bell_address(b.name);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) return std::nullopt;
  return b;
}

std::unique_ptr<Fd> connect_bell(const std::string& name) {
  if (!name.starts_with("asgd-bell-") || name.size() > kMaxBellName) return nullptr;
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  auto socket = std::make_unique<Fd>(fd);
  const auto [address, length] = bell_address(name);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) return nullptr;
  return socket;
}

std::size_t drain_bell(int bell) {
  char buf[64];
  std::size_t rings = 0;
  while (::recv(bell, buf, sizeof buf, MSG_DONTWAIT) >= 0) ++rings;
  return rings;
}

}  // namespace asgd::messaging::shm_detail
