// The receiving side of make_shm_transport (messaging/shm_receiver.hpp).

#include "messaging/shm_receiver.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <utility>

#include "base/log.hpp"

namespace asgd::messaging::shm_detail {
namespace {

// How long a ring's next message may wait for an earlier one that travels
// on the wire before the receiver takes that one as lost and goes on: this
// long while the receiver looks (a receiver paused by backpressure, or
// busy, for longer than kLookedAway, starts counting again), and a look at
// the socket that found nothing after that; or kRingStallAnyway in all.
constexpr std::chrono::seconds kRingStall{5};
constexpr std::chrono::seconds kLookedAway{3};
constexpr std::chrono::seconds kRingStallAnyway{20};

// Whether sequence number `a` comes after `b` (they wrap).
bool seq_after(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) > 0; }

}  // namespace

std::optional<Part> leased_part(const std::shared_ptr<Region>& region, std::uint64_t offset, std::uint64_t length,
                                std::uint64_t generation, std::weak_ptr<Lease>* lease) {
  const SlotHeader* h = region->header();
  if (offset + length > region->capacity() || h->held.load(std::memory_order_acquire) != 1 ||
      h->generation.load(std::memory_order_relaxed) != generation)
    return std::nullopt;
  auto owner = std::make_shared<Lease>(region);
  if (lease) *lease = owner;
  Part p;
  p.owner = std::move(owner);
  p.bytes = std::span<const std::byte>(region->bytes() + offset, length);
  p.exclusive = true;
  return p;
}


ShmReceiver::ShmReceiver(Transport& inner, const TransportLimits& limits, bool enabled, const std::string& log_name,
                         ReturnedSlot returned)
    : inner_(inner), limits_(limits), enabled_(enabled), log_name_(log_name), returned_(std::move(returned)),
      rng_(std::random_device{}()) {}

InPeer* ShmReceiver::find(const PeerId& peer) {
  auto it = in_.find(peer);
  return it == in_.end() ? nullptr : &it->second;
}

bool ShmReceiver::unread_from(const PeerId& peer) const {
  for (const Incoming& in : ready_)
    if (in.from == peer) return true;
  auto it = in_.find(peer);
  if (it == in_.end() || !it->second.ring || it->second.broken) return false;
  const RingHeader* h = it->second.ring->header();
  return h->head.load(std::memory_order_relaxed) != h->tail.load(std::memory_order_acquire);
}

bool ShmReceiver::rung() { return bell_ && drain_bell(bell_->socket->fd) > 0; }

std::optional<Incoming> ShmReceiver::on_data(Incoming& in, const Control& c) {
  if (c.seq != 0) return on_sequenced(in, c);
  if (auto m = rebuild(in, c)) return Incoming{in.from, std::move(*m)};
  reject(in.from);
  return std::nullopt;
}

void ShmReceiver::reject(const PeerId& from) {
  ++counts_.shm_rejected;
  if (logged_[from]) return;
  logged_[from] = true;
  logger().warn("{}: dropped a malformed shared-memory descriptor from {}; further ones are counted, not logged",
                log_name_, from);
}

Message ShmReceiver::on_offer(const Incoming& in, const Control& c) {
  std::optional<InPeer> peer;
  if (enabled_ && in.message.size() == 2) peer = open_slots(in.message[1].bytes, c);
  const bool ok = peer.has_value();
  Message answer{control_part(ok ? Kind::accept : Kind::refuse, c.token, 0)};
  if (ok && peer->ring) {  // the ring goes with a doorbell, or not at all
    if (const Bell* b = bell()) {
      answer.push_back(Part::copy_of(std::as_bytes(std::span<const char>(b->name.data(), b->name.size()))));
    } else {
      peer->ring.reset();
    }
  }
  if (ok) in_[in.from] = std::move(*peer);
  logger().debug("{}: {} the shared memory {} offered", log_name_, ok ? "accepted" : "refused", in.from);
  return answer;
}

// This process's doorbell, made (and watched) the first time a peer's
// ring needs it; null when that cannot be done here.
const Bell* ShmReceiver::bell() {
  if (!bell_ && !bell_failed_) {
    bell_ = make_bell(rng_);
    if (!bell_ || !inner_.watch(bell_->socket->fd)) {
      bell_.reset();
      bell_failed_ = true;
      logger().debug("{}: no doorbell here: messages from peers on this host stay on the wire", log_name_);
    }
  }
  return bell_ ? &*bell_ : nullptr;
}

// Opens every slot an offer names and reads its token back.
std::optional<InPeer> ShmReceiver::open_slots(std::span<const std::byte> names, const Control& c) {
  if (c.count == 0 || c.count > kMaxSlotsOffered) return std::nullopt;
  std::vector<std::string> files(1);
  for (std::byte b : names) {
    if (b == std::byte{0}) {
      files.emplace_back();
      if (files.size() > kMaxSlotsOffered + 2) return std::nullopt;
      continue;
    }
    files.back().push_back(static_cast<char>(b));
    if (files.back().size() > 250) return std::nullopt;
  }
  if (!files.back().empty()) return std::nullopt;  // the last name ends in a NUL
  files.pop_back();
  if (files.size() != c.count && files.size() != c.count + 1) return std::nullopt;
  InPeer peer;
  peer.token = c.token;
  for (std::size_t i = 0; i < c.count; ++i) {
    auto file = open_file(files[i], kSlotHeaderBytes);
    if (!file || file->second->header()->token != c.token) return std::nullopt;
    peer.slots.push_back(InSlot{std::move(file->first), std::move(file->second), {}});
  }
  if (files.size() > c.count) open_ring(peer, files.back());
  return peer;
}

// A file an offer names, mapped whole: only names such an offer makes
// ("/asgd-" and no other slash), of `at_least` bytes.
std::optional<std::pair<std::unique_ptr<Fd>, std::shared_ptr<Region>>> ShmReceiver::open_file(const std::string& name,
                                                                                  std::size_t at_least) {
  if (!name.starts_with("/asgd-") || name.find('/', 1) != std::string::npos) return std::nullopt;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  auto file = std::make_unique<Fd>(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < at_least) return std::nullopt;
  auto region = map_region(fd, static_cast<std::size_t>(st.st_size));
  if (!region) return std::nullopt;
  return std::make_pair(std::move(file), std::move(region));
}

// The ring an offer names, when it is one: without it the peer's
// descriptors come on the wire.
void ShmReceiver::open_ring(InPeer& peer, const std::string& name) {
  auto file = open_file(name, kRingHeaderBytes + 4096);
  if (!file) return;
  Ring ring{std::move(file->second)};
  const RingHeader* h = ring.header();
  if (h->token != peer.token || h->capacity != ring.capacity() || h->capacity % 8 != 0) return;
  peer.ring = std::move(ring);  // the mapping outlives the descriptor
}

// Messages from a peer come in sequence from here on: through its ring,
// or on the wire.
void ShmReceiver::on_ring_open(const PeerId& from, const Control& c) {
  auto it = in_.find(from);
  if (it == in_.end() || it->second.token != c.token || !it->second.ring || it->second.open) return reject(from);
  it->second.open = true;
}

// The next message in sequence from any peer's ring (or one an earlier
// call read and keeps in `ready_`), peers taken in turn.
std::optional<Incoming> ShmReceiver::from_rings() {
  if (!ready_.empty()) {
    Incoming in = std::move(ready_.front());
    ready_.pop_front();
    return in;
  }
  if (in_.empty()) return std::nullopt;
  auto it = in_.upper_bound(last_ring_);
  for (std::size_t k = 0; k < in_.size(); ++k, ++it) {
    if (it == in_.end()) it = in_.begin();
    if (!readable(it->first, it->second)) continue;
    if (auto m = next_from_ring(it->first, it->second)) {
      last_ring_ = it->first;
      return m;
    }
  }
  return std::nullopt;
}

bool ShmReceiver::readable(const PeerId& from, const InPeer& p) const {
  return p.open && !p.broken && !(paused_ && from.starts_with("r:"));
}

// The ring's next entry when it is the message due; nullopt when the ring
// is empty or the message due travels on the wire (p.blocked_at).
std::optional<Incoming> ShmReceiver::next_from_ring(const PeerId& from, InPeer& p) {
  while (true) {
    p.seen_tail = p.ring->header()->tail.load(std::memory_order_acquire);
    Message m;
    std::uint64_t next = 0;
    const RingEntry e = ring_peek(*p.ring, limits_.max_parts + 2, m, next);
    if (e == RingEntry::none) {
      p.blocked_at.reset();
      return std::nullopt;
    }
    if (e == RingEntry::malformed) {
      p.broken = true;
      reject(from);
      logger().warn("{}: the shared-memory ring of {} is malformed: nothing more is read from it", log_name_, from);
      return std::nullopt;
    }
    const std::optional<Control> c = read_control(m);
    if (!c || c->kind != Kind::data || c->token != p.token || c->seq == 0 || seq_after(p.expected, c->seq)) {
      ring_consume(*p.ring, next);  // not a message of this ring, or one delivered already
      reject(from);
      continue;
    }
    if (c->seq != p.expected && !gave_up_waiting(from, p, c->seq)) return std::nullopt;
    p.blocked_at.reset();
    p.stalled.reset();
    ring_consume(*p.ring, next);
    p.expected = next_seq(p.expected);
    ++counts_.ring_received;
    Incoming in{from, std::move(m)};
    if (auto rebuilt = rebuild(in, *c)) return Incoming{from, std::move(*rebuilt)};
    reject(from);
  }
}

// The ring's next message is `seq`, and an earlier one is on the wire:
// true when it has been waited for too long (then taken as lost).
// (A review saw a message that was only late taken as lost: the receiver,
// paused, read nothing for 5 s, then read the ring before the socket where
// it waited, and dropped it when it came.)
bool ShmReceiver::gave_up_waiting(const PeerId& from, InPeer& p, std::uint32_t seq) {
  const Clock::time_point now = Clock::now();
  if (!p.stalled || p.blocked_at != seq || now - p.looked > kLookedAway) p.stalled = now;
  p.blocked_at = seq;
  p.looked = now;
  const auto waited = now - *p.stalled;
  const bool wire_read_since = wire_empty_at_ >= *p.stalled + kRingStall;
  if (waited < kRingStallAnyway && (waited < kRingStall || !wire_read_since)) return false;
  lost(from, p, seq);
  return true;
}

void ShmReceiver::lost(const PeerId& from, InPeer& p, std::uint32_t seq) {
  logger().warn("{}: {} message(s) from {} never came (its connection was reset?); going on from the next",
                log_name_, seq - p.expected, from);
  counts_.shm_rejected += seq - p.expected;
  p.expected = seq;
}

// A message in sequence that came on the wire: the ones before it are
// in the ring (written before it was sent), delivered first.
std::optional<Incoming> ShmReceiver::on_sequenced(Incoming& in, const Control& c) {
  auto it = in_.find(in.from);
  if (it == in_.end() || !it->second.open || it->second.token != c.token || seq_after(it->second.expected, c.seq)) {
    reject(in.from);
    return std::nullopt;
  }
  InPeer& p = it->second;
  while (c.seq != p.expected) {
    if (auto earlier = next_from_ring(in.from, p)) {
      ready_.push_back(std::move(*earlier));
    } else if (!p.broken && p.blocked_at && seq_after(c.seq, *p.blocked_at)) {
      lost(in.from, p, *p.blocked_at);  // and the one in the ring is next
    } else {
      lost(in.from, p, c.seq);
    }
  }
  p.expected = next_seq(p.expected);
  if (auto m = rebuild(in, c)) {
    ready_.push_back(Incoming{in.from, std::move(*m)});
  } else {
    reject(in.from);
  }
  return from_rings();
}

// Before a wait: each readable ring's receiver sleeps (its senders ring
// the doorbell). False, and awake, when a ring was written to since it
// was last read.
bool ShmReceiver::sleep_on_rings() {
  bool any = false;
  for (auto& [from, p] : in_) {
    if (!readable(from, p)) continue;
    p.ring->header()->sleeping.store(1, std::memory_order_relaxed);
    any = true;
  }
  if (!any) return true;
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with ring_notify's
  for (auto& [from, p] : in_) {
    if (readable(from, p) && p.ring->header()->tail.load(std::memory_order_relaxed) != p.seen_tail) {
      wake_on_rings();
      return false;
    }
  }
  return true;
}

void ShmReceiver::wake_on_rings() {
  for (auto& [from, p] : in_)
    if (p.open && p.ring) p.ring->header()->sleeping.store(0, std::memory_order_relaxed);
}

// The message a data control message describes, its slot parts pointing
// into the peer's slots; nullopt when anything about it is wrong.
std::optional<Message> ShmReceiver::rebuild(Incoming& in, const Control& c) {
  auto it = in_.find(in.from);
  if (it == in_.end() || it->second.token != c.token || in.message.size() < 2) return std::nullopt;
  if (c.count == 0 || c.count > limits_.max_parts || in.message[1].bytes.size() != c.count * kDescriptorBytes)
    return std::nullopt;
  const bool bound = in.from.starts_with("r:");
  const std::size_t max_part = bound ? std::min(limits_.bound_max_part_bytes, limits_.max_message_bytes)
                                     : limits_.max_message_bytes;
  InPeer& peer = it->second;
  const std::byte* at = in.message[1].bytes.data();
  std::size_t next_inline = 2;
  std::size_t total = 0;
  std::vector<bool> taken(peer.slots.size(), false);
  Message out;
  for (std::uint32_t i = 0; i < c.count; ++i) {
    const auto slot = get<std::uint32_t>(at);
    const auto offset = get<std::uint32_t>(at);
    const auto length = get<std::uint64_t>(at);
    const auto generation = get<std::uint64_t>(at);
    if (length > max_part || (total += length) > limits_.max_message_bytes) return std::nullopt;
    if (slot == kInline) {
      if (next_inline >= in.message.size() || in.message[next_inline].bytes.size() != length) return std::nullopt;
      out.push_back(std::move(in.message[next_inline++]));
      continue;
    }
    if (offset != 0 && !(slot & kYours)) return std::nullopt;
    if (slot & kYours) {
      auto part = returned_(in.from, slot & ~kYours, offset, length, generation);
      if (!part) return std::nullopt;
      ++counts_.shm_received;
      out.push_back(std::move(*part));
      continue;
    }
    if (slot >= peer.slots.size() || taken[slot]) return std::nullopt;
    taken[slot] = true;
    auto part = read_slot(peer.slots[slot], length, generation);
    if (!part) return std::nullopt;
    ++counts_.shm_received;
    out.push_back(std::move(*part));
  }
  if (next_inline != in.message.size()) return std::nullopt;
  return out;
}

std::optional<Part> ShmReceiver::read_slot(InSlot& slot, std::uint64_t length, std::uint64_t generation) {
  if (slot.region->capacity() < length) {  // the sender grew the slot since: map it again
    struct stat st {};
    if (fstat(slot.file->fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < kSlotHeaderBytes + length)
      return std::nullopt;
    auto region = map_region(slot.file->fd, static_cast<std::size_t>(st.st_size));
    if (!region) return std::nullopt;
    slot.region = std::move(region);
  }
  return leased_part(slot.region, 0, length, generation, &slot.lease);
}


}  // namespace asgd::messaging::shm_detail
