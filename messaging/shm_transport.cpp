// Shared memory between processes on one host, a wrapper around another
// transport (make_shm_transport in transport.hpp says what it promises): the
// sending side, the offers and their answers; shm_slots.hpp has the control
// messages and slots, shm_ring.hpp rings and doorbells, shm_receiver.hpp the rest.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <utility>

#include "base/log.hpp"
#include "messaging/shm_receiver.hpp"
#include "messaging/shm_ring.hpp"
#include "messaging/shm_slots.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging::shm_detail {
namespace {

struct OutPeer {
  enum class State { offered, accepted, refused } state = State::offered;
  std::uint64_t token = 0;
  std::vector<OutSlot> slots;
  std::uint64_t generation = 0;
  // The ring (shm_ring.hpp): offered with the slots; written once the peer
  // has named its doorbell and ring_open has gone out on the wire.
  std::optional<OutSlot> ring;
  std::unique_ptr<Fd> bell;
  bool announced = false;  // ring_open sent
  std::uint32_t seq = 0;   // of the last message sent after it
  std::chrono::steady_clock::time_point asked{};  // when a full ring last made it ask whether the peer lives
  bool gone = false;  // its process is gone (its doorbell refused): let go at the next check
};

// How often a sender whose peer's ring stays full asks whether the peer's
// process is still there.
constexpr std::chrono::milliseconds kAskEvery{100};

// Messages a receiver takes from its rings in a row before it looks at the
// wire (a poll that finds nothing costs a few microseconds).
constexpr std::size_t kRingTurns = 16;

class ShmTransport final : public Transport {
 public:
  ShmTransport(std::unique_ptr<Transport> inner, TransportLimits limits, SharedMemoryOptions options,
               std::string log_name)
      : inner_(std::move(inner)), limits_(limits), options_(options), log_name_(std::move(log_name)),
        rng_(std::random_device{}()),
        receiver_(*inner_, limits_, options_.enabled, log_name_,
                  [this](const PeerId& from, std::uint32_t index, std::uint32_t offset, std::uint64_t length,
                         std::uint64_t generation) { return returned_slot(from, index, offset, length, generation); }) {}

  ~ShmTransport() override {
    for (auto& [peer, out] : out_) release_slots(out);
  }

  Result<std::string> bind(const std::string& endpoint) override { return inner_->bind(endpoint); }
  Result<PeerId> connect(const std::string& endpoint) override { return inner_->connect(endpoint); }

  // The peer behind `peer` is another process now: it gets a new offer, and
  // what the old one offered is forgotten.
  Status reconnect(const PeerId& peer, const std::string& endpoint) override {
    std::lock_guard lock(mu_);
    if (auto it = out_.find(peer); it != out_.end()) {
      release_slots(it->second);
      out_.erase(it);
    }
    receiver_.forget(peer);
    return inner_->reconnect(peer, endpoint);
  }

  Result<bool> send(const PeerId& peer, Message message) override {
    std::lock_guard lock(mu_);
    flush_controls();
    OutPeer* out = out_peer(peer);
    if (out == nullptr || out->state != OutPeer::State::accepted) return inner_->send(peer, std::move(message));
    if (out->bell) {
      if (!out->announced) {  // behind everything sent on the wire so far
        auto sent = inner_->send(peer, Message{control_part(Kind::ring_open, out->token, 0)});
        if (!sent.ok() || !*sent) return sent;
        out->announced = true;
      }
      return send_sequenced(peer, *out, message, true);
    }
    if (!has_large_part(message)) return inner_->send(peer, std::move(message));
    return send_through_slots(peer, *out, std::move(message));
  }

  // Into the peer's ring from any thread once ring_open has gone out; to a
  // peer that gets no slots (refused, not yet accepted, shared memory off),
  // on the wire (the inner transport's send_now) unless an answer waits.
  bool send_now(const PeerId& peer, const Message& message) override {
    std::lock_guard lock(mu_);
    auto it = out_.find(peer);
    if (it == out_.end()) return !options_.enabled && controls_.empty() && inner_->send_now(peer, message);
    if (it->second.state != OutPeer::State::accepted) return controls_.empty() && inner_->send_now(peer, message);
    if (!it->second.bell || !it->second.announced) return false;
    auto sent = send_sequenced(peer, it->second, message, false);
    return sent.ok() && *sent;
  }

  // The peers' rings first, then the wire; a receiver with rings to wait
  // on says so in them (`sleeping`) before it waits, so their senders ring.
  // After kRingTurns messages from the rings in a row the wire gets a look: a
  // receiver its rings keep busy (a shard applying pushes on this thread)
  // still reads its socket (the coordinator, peers elsewhere).
  Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
    std::unique_lock lock(mu_);  // not while it waits: send_now() goes on meanwhile
    while (true) {
      flush_controls();
      let_go_of_gone_peers();
      const bool wire_turn = ring_streak_ >= kRingTurns;  // a look at the socket without waiting
      if (!wire_turn) {
        if (auto m = receiver_.from_rings()) {
          ++ring_streak_;
          return m;
        }
      }
      ring_streak_ = 0;
      const auto left = wire_turn ? std::chrono::milliseconds(0)
                                  : std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                                             std::chrono::milliseconds(0));
      if (left.count() > 0 && !receiver_.sleep_on_rings()) continue;  // one was written to meanwhile
      lock.unlock();
      auto in = inner_->receive(left);
      lock.lock();
      receiver_.wake_on_rings();
      if (!in.ok()) return in;
      if (!*in) {  // woken (by wake() or a doorbell), the time is up, or nothing on the wire at its turn
        receiver_.wire_was_empty();
        const bool rung = left.count() > 0 && receiver_.rung();
        if (auto m = receiver_.from_rings()) return m;
        if ((rung || wire_turn) && Clock::now() < deadline) continue;  // rung for what was read already
        return in;
      }
      const std::optional<Control> control = read_control((*in)->message);
      if (!control) return in;
      if (auto rebuilt = on_control(**in, *control)) return rebuilt;
      if (Clock::now() >= deadline) return std::optional<Incoming>();
    }
  }

  TransportStats stats() const override {
    std::lock_guard lock(mu_);
    TransportStats s = inner_->stats();
    s.shm_peers = 0;
    for (const auto& [peer, out] : out_) s.shm_peers += out.state == OutPeer::State::accepted;
    s.shm_peers_gone = counts_.shm_peers_gone;
    s.shm_sent = counts_.shm_sent;
    s.shm_fallbacks = counts_.shm_fallbacks;
    s.ring_sent = counts_.ring_sent;
    s.shm_received = receiver_.counts().shm_received;
    s.shm_rejected = receiver_.counts().shm_rejected;
    s.ring_received = receiver_.counts().ring_received;
    return s;
  }

  // The rings of peers that connected to the bound endpoint are left
  // unread too: their senders find them full.
  void pause_bound(bool paused) override {
    std::lock_guard lock(mu_);
    receiver_.pause(paused);
    inner_->pause_bound(paused);
  }

  Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) override {
    std::lock_guard lock(mu_);
    limits_.bound_max_part_bytes = max_part_bytes;
    limits_.bound_max_connections = max_connections;
    return inner_->set_bound_limits(max_part_bytes, max_connections);
  }

  void wake() override { inner_->wake(); }

 private:
  bool has_large_part(const Message& m) const {
    for (const Part& p : m)
      if (p.bytes.size() >= options_.min_part_bytes) return true;
    return false;
  }

  // The peer's sending state; on the first message to it, the slots are
  // made and offered. Slots that cannot be made here (no /dev/shm, a full
  // one) leave the peer on the wire for good, as a refusal would, rather
  // than being tried again at every message. Null when shared memory is off,
  // or when the offer could not be sent now (the next message tries again).
  OutPeer* out_peer(const PeerId& peer) {
    if (auto it = out_.find(peer); it != out_.end()) return &it->second;
    if (!options_.enabled || options_.slots_per_peer == 0) return nullptr;
    OutPeer out;
    out.token = rng_();
    std::vector<std::byte> names;
    for (std::size_t i = 0; i < std::min(options_.slots_per_peer, kMaxSlotsOffered); ++i) {
      auto slot = make_slot(out.token, i);
      if (!slot) {
        release_slots(out);
        out.state = OutPeer::State::refused;
        return &out_.emplace(peer, std::move(out)).first->second;
      }
      for (char c : slot->name) names.push_back(static_cast<std::byte>(c));
      names.push_back(std::byte{0});
      out.slots.push_back(std::move(*slot));
    }
    if (auto ring = make_ring(out.token, out.slots.size())) {  // without one, descriptors go on the wire
      for (char c : ring->name) names.push_back(static_cast<std::byte>(c));
      names.push_back(std::byte{0});
      out.ring = std::move(*ring);
    }
    Message offer{control_part(Kind::offer, out.token, static_cast<std::uint32_t>(out.slots.size())),
                  Part::take(std::move(names))};
    auto sent = inner_->send(peer, std::move(offer));
    if (!sent.ok() || !*sent) {
      release_slots(out);
      return nullptr;
    }
    return &out_.emplace(peer, std::move(out)).first->second;
  }

  std::optional<OutSlot> make_slot(std::uint64_t token, std::size_t index) {
    auto s = make_file(token, index, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
    if (!s) return std::nullopt;
    s->region->header()->token = token;
    s->region->header()->held.store(0, std::memory_order_relaxed);
    s->region->header()->generation.store(0, std::memory_order_relaxed);
    return s;
  }

  std::optional<OutSlot> make_ring(std::uint64_t token, std::size_t index) {
    auto s = make_file(token, index, kRingHeaderBytes + kRingCapacity);
    if (!s) return std::nullopt;
    auto* h = reinterpret_cast<RingHeader*>(s->region->base);
    h->token = token;
    h->capacity = kRingCapacity;
    h->tail.store(0, std::memory_order_relaxed);
    h->head.store(0, std::memory_order_relaxed);
    h->sleeping.store(0, std::memory_order_relaxed);
    s->file.reset();  // a ring never grows: its mapping is enough
    return s;
  }

  std::optional<OutSlot> make_file(std::uint64_t token, std::size_t index, std::size_t size) {
    std::string why;
    auto s = make_slot_file(token, index, size, &why);
    if (s) bytes_ += size;
    else log_once(why);
    return s;
  }

  void release(OutSlot& s) {
    if (!s.name.empty()) shm_unlink(s.name.c_str());
    s.name.clear();
    if (s.region) bytes_ -= s.region->size;
    s.region.reset();
  }

  void release_slots(OutPeer& out) {
    for (OutSlot& s : out.slots) release(s);
    out.slots.clear();
    release_ring(out);
  }

  void release_ring(OutPeer& out) {
    if (out.ring) release(*out.ring);
    out.ring.reset();
    out.bell.reset();
  }

  // A free slot that holds `need` bytes (grown if it must be and may be),
  // the first in order: a worker waiting for each reply writes the same
  // slot every step, whose lines are still in the caches (taking them in
  // turn, each came back cold: about 6% of the default job's samples/s
  // across processes on the 2-core VM).
  std::optional<std::size_t> take_slot(OutPeer& out, std::size_t need) {
    for (std::size_t i = 0; i < out.slots.size(); ++i) {
      OutSlot& s = out.slots[i];
      if (s.region->header()->held.load(std::memory_order_acquire) != 0) continue;
      if (s.region->capacity() < need && !grow(s, need)) continue;
      return i;
    }
    return std::nullopt;
  }

  // posix_fallocate, not ftruncate: a full /dev/shm is an error here, not a
  // SIGBUS on the first write.
  bool grow(OutSlot& s, std::size_t need) {
    const std::size_t size = round_up(kSlotHeaderBytes + need, kGrowBy);
    if (bytes_ - s.region->size + size > options_.max_bytes) return false;
    if (posix_fallocate(s.file->fd, 0, static_cast<off_t>(size)) != 0) return false;
    auto region = map_region(s.file->fd, size);
    if (!region) return false;
    bytes_ += size - s.region->size;
    s.region = std::move(region);
    return true;
  }

  void write_slot(const OutSlot& s, std::span<const std::byte> bytes, std::uint64_t generation) {
    if (options_.mid_write_hook) {
      const std::size_t half = bytes.size() / 2;
      std::memcpy(s.region->bytes(), bytes.data(), half);
      options_.mid_write_hook();
      std::memcpy(s.region->bytes() + half, bytes.data() + half, bytes.size() - half);
    } else {
      std::memcpy(s.region->bytes(), bytes.data(), bytes.size());
    }
    s.region->header()->generation.store(generation, std::memory_order_relaxed);
    s.region->header()->held.store(1, std::memory_order_release);
  }

  // A message as descriptors: its large parts written into slots (or
  // handed back in the peer's own), the rest inline.
  struct Described {
    std::vector<std::byte> table;
    Message inline_parts;
    std::vector<std::size_t> used;                  // slots written
    std::vector<std::shared_ptr<Lease>> returned;  // the peer's slots handed back

    // Not sent after all: nobody will read them.
    void give_back(OutPeer& out) {
      for (std::size_t i : used) out.slots[i].region->header()->held.store(0, std::memory_order_relaxed);
      for (auto& lease : returned) lease->handed_back.store(false, std::memory_order_release);
    }
    // The data message: `control`, the table, the inline parts (moved out).
    Message take_message(Part control) {
      Message m{std::move(control), Part::take(std::move(table))};
      for (Part& p : inline_parts) m.push_back(std::move(p));
      return m;
    }
  };

  // nullopt when a large part finds every slot held, unless `inline_when_full`
  // (then it goes inline, counted as a fallback).
  std::optional<Described> describe(const PeerId& peer, OutPeer& out, const Message& message,
                                    bool inline_when_full) {
    Described d;
    d.table.resize(message.size() * kDescriptorBytes);
    std::byte* at = d.table.data();
    for (const Part& p : message) {
      if (auto yours = hand_back(peer, p)) {
        d.returned.push_back(std::move(yours->lease));
        put(at, yours->slot | kYours);
        put(at, yours->offset);
        put(at, static_cast<std::uint64_t>(p.bytes.size()));
        put(at, d.returned.back()->region->header()->generation.load(std::memory_order_relaxed));
        continue;
      }
      std::optional<std::size_t> slot;
      if (p.bytes.size() >= options_.min_part_bytes) slot = take_slot(out, p.bytes.size());
      if (slot) {
        write_slot(out.slots[*slot], p.bytes, ++out.generation);
        d.used.push_back(*slot);
      } else if (p.bytes.size() >= options_.min_part_bytes && !inline_when_full) {
        d.give_back(out);
        return std::nullopt;
      } else {
        counts_.shm_fallbacks += p.bytes.size() >= options_.min_part_bytes;
        d.inline_parts.push_back(p);
      }
      put(at, slot ? static_cast<std::uint32_t>(*slot) : kInline);
      put(at, std::uint32_t{0});
      put(at, static_cast<std::uint64_t>(p.bytes.size()));
      put(at, slot ? out.generation : std::uint64_t{0});
    }
    return d;
  }

  Result<bool> send_through_slots(const PeerId& peer, OutPeer& out, Message message) {
    auto d = describe(peer, out, message, false);
    if (!d) {
      ++counts_.shm_fallbacks;
      return inner_->send(peer, std::move(message));
    }
    if (d->inline_parts.size() + 2 > limits_.max_parts) {  // the wire message would be refused: send it as it is
      d->give_back(out);
      return inner_->send(peer, std::move(message));
    }
    const std::size_t through = d->used.size() + d->returned.size();
    auto sent = inner_->send(peer, d->take_message(control_part(Kind::data, out.token,
                                                                static_cast<std::uint32_t>(message.size()))));
    if (!sent.ok() || !*sent) d->give_back(out);
    else counts_.shm_sent += through;
    return sent;
  }

  // After ring_open: the next message in sequence, into the ring, or onto
  // the wire when it is too large for the ring (a large part inline, every
  // slot being held), which only the owning thread may (`may_use_wire`;
  // without it such a message is not sent). Would block while the ring is
  // half full, so that any entry it takes fits.
  Result<bool> send_sequenced(const PeerId& peer, OutPeer& out, const Message& message, bool may_use_wire) {
    const Ring ring{out.ring->region};
    const RingHeader* h = ring.header();
    const std::uint64_t used = h->tail.load(std::memory_order_relaxed) - h->head.load(std::memory_order_acquire);
    if (used > ring.capacity() / 2) {
      if (may_use_wire) drop_ring_if_gone(peer, out);
      return false;
    }
    auto d = describe(peer, out, message, may_use_wire);
    if (!d) return false;
    const std::size_t through = d->used.size() + d->returned.size();
    Message m = d->take_message(
        control_part(Kind::data, out.token, static_cast<std::uint32_t>(message.size()), next_seq(out.seq)));
    if (ring_entry_bytes(m) <= ring.capacity() / 4) {
      ring_write(ring, m);  // fits: at most a quarter, into at least half
      ring_notify(ring, out.bell->fd);
      ++counts_.ring_sent;
    } else if (!may_use_wire) {
      d->give_back(out);
      return false;
    } else if (m.size() > limits_.max_parts) {
      d->give_back(out);
      return Status::InvalidArgument("send to " + peer + ": a message of " + std::to_string(message.size()) +
                                     " parts with too many of them large to go through shared memory");
    } else if (auto sent = inner_->send(peer, std::move(m)); !sent.ok() || !*sent) {
      d->give_back(out);
      return sent;
    }
    out.seq = next_seq(out.seq);
    counts_.shm_sent += through;
    return true;
  }

  // A ring that stays full may have lost its reader: when the peer's
  // process is gone (its doorbell refuses), the ring goes, and what is
  // sent to the peer from now on goes on the wire, as to any peer that
  // left (order no longer matters: nobody reads it).
  void drop_ring_if_gone(const PeerId& peer, OutPeer& out) {
    const auto now = std::chrono::steady_clock::now();
    if (now - out.asked < kAskEvery) return;
    out.asked = now;
    if (!bell_gone(out.bell->fd)) return;
    logger().info("{}: {} no longer reads its shared-memory ring (its process is gone): the wire takes what follows",
                  log_name_, peer);
    release_ring(out);
    out.gone = true;
  }

  // Every options_.peer_check_every: a peer whose doorbell refuses (or refused a sender) is gone, and
  // once its last messages are read, so go the slots and ring we made for it and those of its we mapped
  // (a new process at its address later gets a new offer).
  void let_go_of_gone_peers() {
    const auto now = std::chrono::steady_clock::now();
    if (options_.peer_check_every.count() <= 0 || now < next_peer_check_) return;
    next_peer_check_ = now + options_.peer_check_every;
    for (auto it = out_.begin(); it != out_.end();) {
      OutPeer& out = it->second;
      if (receiver_.unread_from(it->first) ||
          (!out.gone && !(out.state == OutPeer::State::accepted && out.bell && bell_gone(out.bell->fd)))) {
        ++it;
        continue;
      }
      logger().info("{}: {}'s process is gone: the shared memory between us is let go", log_name_, it->first);
      release_slots(out);
      receiver_.forget(it->first);
      ++counts_.shm_peers_gone;
      it = out_.erase(it);
    }
  }

  struct HandBack {
    std::uint32_t slot;
    std::uint32_t offset;
    std::shared_ptr<Lease> lease;
  };

  // When `p` lies in a slot `peer` sent us and we still lease, that slot
  // goes back to it with the part in it.
  std::optional<HandBack> hand_back(const PeerId& peer, const Part& p) {
    if (p.bytes.size() < options_.min_part_bytes) return std::nullopt;
    InPeer* in = receiver_.find(peer);
    if (in == nullptr) return std::nullopt;
    for (std::size_t i = 0; i < in->slots.size(); ++i) {
      InSlot& slot = in->slots[i];
      const std::byte* begin = slot.region->bytes();
      if (p.bytes.data() < begin || p.bytes.data() + p.bytes.size() > begin + slot.region->capacity()) continue;
      auto lease = slot.lease.lock();
      if (!lease || lease->region != slot.region || lease->handed_back.exchange(true)) return std::nullopt;
      return HandBack{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(p.bytes.data() - begin),
                      std::move(lease)};
    }
    return std::nullopt;
  }

  // Handles a control message; returns the message a data one carried.
  std::optional<Incoming> on_control(Incoming& in, const Control& c) {
    switch (c.kind) {
      case Kind::offer:
        controls_.emplace_back(in.from, receiver_.on_offer(in, c));
        return std::nullopt;
      case Kind::accept:
      case Kind::refuse:
        on_answer(in, c);
        return std::nullopt;
      case Kind::ring_open:
        receiver_.on_ring_open(in.from, c);
        return std::nullopt;
      case Kind::data:
        return receiver_.on_data(in, c);
    }
    receiver_.reject(in.from);
    return std::nullopt;
  }

  void on_answer(const Incoming& in, const Control& c) {
    auto it = out_.find(in.from);
    if (it == out_.end() || it->second.token != c.token || it->second.state != OutPeer::State::offered) return;
    OutPeer& out = it->second;
    const PeerId& from = in.from;
    if (c.kind == Kind::refuse) {
      release_slots(out);
      out.state = OutPeer::State::refused;
      logger().debug("{}: {} refused shared memory: everything to it goes on the wire", log_name_, from);
      return;
    }
    // Both sides hold the files open now: the names can go.
    for (OutSlot& s : out.slots) {
      shm_unlink(s.name.c_str());
      s.name.clear();
    }
    if (out.ring && in.message.size() == 2) {
      const auto& b = in.message[1].bytes;
      out.bell = connect_bell(std::string(reinterpret_cast<const char*>(b.data()), b.size()));
    }
    if (!out.bell) release_ring(out);  // it opened none, or its doorbell is not here
    if (out.ring) {
      shm_unlink(out.ring->name.c_str());
      out.ring->name.clear();
    }
    out.state = OutPeer::State::accepted;
    logger().debug("{}: large parts to {} go through shared memory{}", log_name_, from,
                   out.bell ? ", and every message through its ring" : "");
  }

  // One of our own slots that `from` hands back (kYours): held since we
  // wrote it, now with the part it wrote over ours.
  std::optional<Part> returned_slot(const PeerId& from, std::uint32_t index, std::uint32_t offset,
                                    std::uint64_t length, std::uint64_t generation) {
    auto it = out_.find(from);
    if (it == out_.end() || it->second.state != OutPeer::State::accepted || index >= it->second.slots.size())
      return std::nullopt;
    return leased_part(it->second.slots[index].region, offset, length, generation, nullptr);
  }

  void flush_controls() {
    while (!controls_.empty()) {
      auto& [peer, message] = controls_.front();
      auto sent = inner_->send(peer, message);
      if (sent.ok() && !*sent) return;  // would block: next time
      controls_.pop_front();
    }
  }

  void log_once(const std::string& what) {
    if (logged_setup_) return;
    logged_setup_ = true;
    logger().info("{}: {}; large parts go on the wire", log_name_, what);
  }

  std::unique_ptr<Transport> inner_;
  TransportLimits limits_;
  SharedMemoryOptions options_;
  std::string log_name_;
  std::mt19937_64 rng_;
  // Guards all below and `limits_`: send_now() runs on other threads.
  // Never held while the inner transport waits.
  mutable std::mutex mu_;
  ShmReceiver receiver_;
  std::map<PeerId, OutPeer> out_;
  std::deque<std::pair<PeerId, Message>> controls_;  // answers to offers not yet taken by the transport
  bool logged_setup_ = false;
  std::size_t bytes_ = 0;  // of every slot this transport made
  TransportStats counts_;
  std::size_t ring_streak_ = 0;  // messages receive() took from the rings in a row
  std::chrono::steady_clock::time_point next_peer_check_{};  // let_go_of_gone_peers
};

}  // namespace
}  // namespace asgd::messaging::shm_detail

namespace asgd::messaging {

std::unique_ptr<Transport> make_shm_transport(std::unique_ptr<Transport> inner, TransportLimits limits,
                                              SharedMemoryOptions options, std::string log_name) {
  // Once a process: what killed processes of earlier jobs left behind.
  static std::once_flag swept;
  std::call_once(swept, [&log_name] {
    if (const std::size_t n = shm_detail::remove_stale_slots())
      logger().debug("{}: removed {} shared-memory slot files of processes that no longer run", log_name, n);
  });
  return std::make_unique<shm_detail::ShmTransport>(std::move(inner), limits, options, std::move(log_name));
}

}  // namespace asgd::messaging
