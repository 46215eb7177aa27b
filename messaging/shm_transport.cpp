// Shared memory between processes on one host, as a wrapper around another
// transport (make_shm_transport in transport.hpp says what it promises;
// messaging/shm_slots.hpp holds its control messages and slots).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <utility>

#include "base/log.hpp"
#include "base/process.hpp"
#include "messaging/shm_slots.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging::shm_detail {
namespace {

using Clock = std::chrono::steady_clock;

class ShmTransport final : public Transport {
 public:
  ShmTransport(std::unique_ptr<Transport> inner, TransportLimits limits, SharedMemoryOptions options,
               std::string log_name)
      : inner_(std::move(inner)), limits_(limits), options_(options), log_name_(std::move(log_name)),
        rng_(std::random_device{}()) {}

  ~ShmTransport() override {
    for (auto& [peer, out] : out_) release_slots(out);
  }

  Result<std::string> bind(const std::string& endpoint) override { return inner_->bind(endpoint); }
  Result<PeerId> connect(const std::string& endpoint) override { return inner_->connect(endpoint); }

  // The peer behind `peer` is another process now: it gets a new offer, and
  // what the old one offered is forgotten.
  Status reconnect(const PeerId& peer, const std::string& endpoint) override {
    if (auto it = out_.find(peer); it != out_.end()) {
      release_slots(it->second);
      out_.erase(it);
    }
    in_.erase(peer);
    return inner_->reconnect(peer, endpoint);
  }

  Result<bool> send(const PeerId& peer, Message message) override {
    flush_controls();
    OutPeer* out = out_peer(peer);
    if (out == nullptr || out->state != OutPeer::State::accepted || !has_large_part(message))
      return inner_->send(peer, std::move(message));
    return send_through_slots(peer, *out, std::move(message));
  }

  Result<std::optional<Incoming>> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
    while (true) {
      flush_controls();
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      auto in = inner_->receive(std::max(left, std::chrono::milliseconds(0)));
      if (!in.ok() || !*in) return in;
      const std::optional<Control> control = read_control((*in)->message);
      if (!control) return in;
      if (auto rebuilt = on_control(**in, *control)) return rebuilt;
      if (Clock::now() >= deadline) return std::optional<Incoming>();
    }
  }

  TransportStats stats() const override {
    TransportStats s = inner_->stats();
    s.shm_peers = 0;
    for (const auto& [peer, out] : out_) s.shm_peers += out.state == OutPeer::State::accepted;
    s.shm_sent = counts_.shm_sent;
    s.shm_received = counts_.shm_received;
    s.shm_fallbacks = counts_.shm_fallbacks;
    s.shm_rejected = counts_.shm_rejected;
    return s;
  }

  void pause_bound(bool paused) override { inner_->pause_bound(paused); }

  Status set_bound_limits(std::size_t max_part_bytes, std::size_t max_connections) override {
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
    Message offer{control_part(Kind::offer, out.token, static_cast<std::uint32_t>(out.slots.size())),
                  Part::take(std::move(names))};
    auto sent = inner_->send(peer, std::move(offer));
    if (!sent.ok() || !*sent) {
      release_slots(out);
      return nullptr;
    }
    return &out_.emplace(peer, std::move(out)).first->second;
  }

  // Named by this process, the offer's random token and the slot's index:
  // unique among the transports of a process, and across processes.
  std::optional<OutSlot> make_slot(std::uint64_t token, std::size_t index) {
    OutSlot s;
    s.name = "/asgd-" + std::to_string(getpid()) + "-" + std::to_string(token) + "-" + std::to_string(index);
    const int fd = shm_open(s.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      log_once("cannot create shared memory " + s.name + ": " + std::strerror(errno));
      return std::nullopt;
    }
    s.file = std::make_unique<Fd>(fd);
    const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    if (posix_fallocate(fd, 0, static_cast<off_t>(size)) != 0 || !(s.region = map_region(fd, size))) {
      shm_unlink(s.name.c_str());
      log_once("cannot size shared memory " + s.name);
      return std::nullopt;
    }
    s.region->header()->token = token;
    s.region->header()->held.store(0, std::memory_order_relaxed);
    s.region->header()->generation.store(0, std::memory_order_relaxed);
    bytes_ += size;
    return s;
  }

  void release_slots(OutPeer& out) {
    for (OutSlot& s : out.slots) {
      if (!s.name.empty()) shm_unlink(s.name.c_str());
      if (s.region) bytes_ -= s.region->size;
    }
    out.slots.clear();
  }

  // A free slot that holds `need` bytes (grown if it must be and may be).
  std::optional<std::size_t> take_slot(OutPeer& out, std::size_t need) {
    for (std::size_t k = 0; k < out.slots.size(); ++k) {
      const std::size_t i = (out.next + k) % out.slots.size();
      OutSlot& s = out.slots[i];
      if (s.region->header()->held.load(std::memory_order_acquire) != 0) continue;
      if (s.region->capacity() < need && !grow(s, need)) continue;
      out.next = i + 1;
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

  Result<bool> send_through_slots(const PeerId& peer, OutPeer& out, Message message) {
    std::vector<std::byte> table(message.size() * kDescriptorBytes);
    std::byte* at = table.data();
    Message inline_parts;
    std::vector<std::size_t> used;
    std::vector<std::shared_ptr<Lease>> returned;
    const auto give_back = [&] {
      for (std::size_t i : used) out.slots[i].region->header()->held.store(0, std::memory_order_relaxed);
      for (auto& lease : returned) lease->handed_back.store(false, std::memory_order_release);
    };
    for (const Part& p : message) {
      if (auto yours = hand_back(peer, p)) {
        returned.push_back(std::move(yours->lease));
        put(at, yours->slot | kYours);
        put(at, yours->offset);
        put(at, static_cast<std::uint64_t>(p.bytes.size()));
        put(at, returned.back()->region->header()->generation.load(std::memory_order_relaxed));
        continue;
      }
      std::optional<std::size_t> slot;
      if (p.bytes.size() >= options_.min_part_bytes) {
        slot = take_slot(out, p.bytes.size());
        if (!slot) {
          give_back();
          ++counts_.shm_fallbacks;
          return inner_->send(peer, std::move(message));
        }
        write_slot(out.slots[*slot], p.bytes, ++out.generation);
        used.push_back(*slot);
      } else {
        inline_parts.push_back(p);
      }
      put(at, slot ? static_cast<std::uint32_t>(*slot) : kInline);
      put(at, std::uint32_t{0});
      put(at, static_cast<std::uint64_t>(p.bytes.size()));
      put(at, slot ? out.generation : std::uint64_t{0});
    }
    if (inline_parts.size() + 2 > limits_.max_parts) {  // the wire message would be refused: send it as it is
      give_back();
      return inner_->send(peer, std::move(message));
    }
    Message wire{control_part(Kind::data, out.token, static_cast<std::uint32_t>(message.size())),
                 Part::take(std::move(table))};
    for (Part& p : inline_parts) wire.push_back(std::move(p));
    auto sent = inner_->send(peer, std::move(wire));
    if (!sent.ok() || !*sent) {
      give_back();  // not sent: nobody will read them
    } else {
      counts_.shm_sent += used.size() + returned.size();
    }
    return sent;
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
    auto it = in_.find(peer);
    if (it == in_.end()) return std::nullopt;
    for (std::size_t i = 0; i < it->second.slots.size(); ++i) {
      InSlot& slot = it->second.slots[i];
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
        on_offer(in, c);
        return std::nullopt;
      case Kind::accept:
      case Kind::refuse:
        on_answer(in.from, c);
        return std::nullopt;
      case Kind::data:
        if (auto m = rebuild(in, c)) return Incoming{in.from, std::move(*m)};
        ++counts_.shm_rejected;
        if (!logged_[in.from]) {
          logged_[in.from] = true;
          logger().warn("{}: dropped a malformed shared-memory descriptor from {}; further ones are counted, not logged",
                        log_name_, in.from);
        }
        return std::nullopt;
    }
    ++counts_.shm_rejected;
    return std::nullopt;
  }

  void on_offer(const Incoming& in, const Control& c) {
    std::optional<InPeer> peer;
    if (options_.enabled && in.message.size() == 2) peer = open_slots(in.message[1].bytes, c);
    const bool ok = peer.has_value();
    if (ok) in_[in.from] = std::move(*peer);
    controls_.emplace_back(in.from, Message{control_part(ok ? Kind::accept : Kind::refuse, c.token, 0)});
    logger().debug("{}: {} the shared memory {} offered", log_name_, ok ? "accepted" : "refused", in.from);
  }

  // Opens every slot an offer names and reads its token back.
  std::optional<InPeer> open_slots(std::span<const std::byte> names, const Control& c) {
    if (c.count == 0 || c.count > kMaxSlotsOffered) return std::nullopt;
    InPeer peer;
    peer.token = c.token;
    std::string name;
    for (std::byte b : names) {
      if (b != std::byte{0}) {
        name.push_back(static_cast<char>(b));
        if (name.size() > 250) return std::nullopt;
        continue;
      }
      // Only names such an offer makes: "/asgd-" and no other slash.
      if (!name.starts_with("/asgd-") || name.find('/', 1) != std::string::npos) return std::nullopt;
      const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) return std::nullopt;
      InSlot slot{std::make_unique<Fd>(fd), nullptr, {}};
      struct stat st {};
      if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < kSlotHeaderBytes) return std::nullopt;
      slot.region = map_region(fd, static_cast<std::size_t>(st.st_size));
      if (!slot.region || slot.region->header()->token != c.token) return std::nullopt;
      peer.slots.push_back(std::move(slot));
      name.clear();
    }
    if (!name.empty() || peer.slots.size() != c.count) return std::nullopt;
    return peer;
  }

  void on_answer(const PeerId& from, const Control& c) {
    auto it = out_.find(from);
    if (it == out_.end() || it->second.token != c.token || it->second.state != OutPeer::State::offered) return;
    OutPeer& out = it->second;
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
    out.state = OutPeer::State::accepted;
    logger().debug("{}: large parts to {} go through shared memory", log_name_, from);
  }

  // The message a data control message describes, its slot parts pointing
  // into the peer's slots; nullopt when anything about it is wrong.
  std::optional<Message> rebuild(Incoming& in, const Control& c) {
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
        auto part = returned_slot(in.from, slot & ~kYours, offset, length, generation);
        if (!part) return std::nullopt;
        out.push_back(std::move(*part));
        continue;
      }
      if (slot >= peer.slots.size() || taken[slot]) return std::nullopt;
      taken[slot] = true;
      auto part = read_slot(peer.slots[slot], length, generation);
      if (!part) return std::nullopt;
      out.push_back(std::move(*part));
    }
    if (next_inline != in.message.size()) return std::nullopt;
    return out;
  }

  std::optional<Part> read_slot(InSlot& slot, std::uint64_t length, std::uint64_t generation) {
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

  // One of our own slots that `from` hands back (kYours): held since we
  // wrote it, now with the part it wrote over ours.
  std::optional<Part> returned_slot(const PeerId& from, std::uint32_t index, std::uint32_t offset,
                                    std::uint64_t length, std::uint64_t generation) {
    auto it = out_.find(from);
    if (it == out_.end() || it->second.state != OutPeer::State::accepted || index >= it->second.slots.size())
      return std::nullopt;
    return leased_part(it->second.slots[index].region, offset, length, generation, nullptr);
  }

  // The part at [offset, offset + length) of `region`, when the slot holds
  // the message of `generation`; leased until its last owner lets go (and
  // remembered in `*lease`, for handing the slot back). Either side's slot:
  // the writer does not touch it until then, so the part is ours to write.
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
    ++counts_.shm_received;
    return p;
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
  std::map<PeerId, OutPeer> out_;
  std::map<PeerId, InPeer> in_;
  std::deque<std::pair<PeerId, Message>> controls_;  // answers to offers not yet taken by the transport
  std::map<PeerId, bool> logged_;
  bool logged_setup_ = false;
  std::size_t bytes_ = 0;  // of every slot this transport made
  TransportStats counts_;
};

// "asgd-PID-TOKEN-INDEX", as make_slot names a slot: its PID, or 0.
pid_t offering_pid(std::string_view name) {
  if (!name.starts_with("asgd-")) return 0;
  name.remove_prefix(5);
  std::uint64_t numbers[3] = {};
  for (int k = 0; k < 3; ++k) {
    if (k > 0) {
      if (!name.starts_with('-')) return 0;
      name.remove_prefix(1);
    }
    const auto [at, ec] = std::from_chars(name.data(), name.data() + name.size(), numbers[k]);  // no digits: an error
    if (ec != std::errc()) return 0;
    name.remove_prefix(static_cast<std::size_t>(at - name.data()));
  }
  return name.empty() && numbers[0] <= static_cast<std::uint64_t>(INT32_MAX) ? static_cast<pid_t>(numbers[0]) : 0;
}

}  // namespace

std::size_t remove_stale_slots(const std::string& dir) {
  std::size_t removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const pid_t pid = offering_pid(name);
    if (pid == 0 || process_runs(pid)) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

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
