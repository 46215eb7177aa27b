#pragma once
// The pieces of make_shm_transport (messaging/shm_transport.cpp): its
// control messages and the slots, as both processes see them. Internal.
//
// The two sides talk through control messages of their own, each
// beginning with a 24-byte part
//   u32 magic "ASHM" | u16 version | u16 kind | u64 token | u32 count | u32 seq
// (a wire frame begins with "ASGD", so neither is taken for the other):
//   offer    count slots; one more part: their names, each ending in a NUL,
//            and after them the name of a ring (messaging/shm_ring.hpp)
//            when the sender made one
//   accept   the offer's token: every slot opened, the token read back; one
//            more part when the ring was opened too: the name of the
//            receiver's doorbell
//   refuse   the offer's token: not here (another host, another /dev/shm)
//   ring_open  on the wire, after everything the sender sent there before
//            it: from here on every message comes as a data message with a
//            sequence number `seq` (1, 2, ...), through the ring or, when
//            too large for it, on the wire, and the receiver delivers them
//            in that order
//   data     count parts; one more part: a descriptor per part (u32 slot or
//            kInline, u32 offset, u64 length, u64 generation), then the
//            inline parts in order. A slot with kYours set is one of the
//            receiver's own, handed back: the part was received from it and
//            written over in place (a shard's reply over the gradient), so
//            it returns without a copy.
// A slot is a POSIX shared memory object: a 64-byte SlotHeader, then the
// bytes of the one part it holds at a time.

#include <sys/mman.h>
#include <unistd.h>

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "messaging/transport.hpp"

namespace asgd::messaging::shm_detail {

constexpr std::uint32_t kShmMagic = 0x4D485341;  // "ASHM" read as little-endian bytes
constexpr std::uint16_t kShmVersion = 2;
enum class Kind : std::uint16_t { offer = 1, accept = 2, refuse = 3, data = 4, ring_open = 5 };
constexpr std::size_t kControlBytes = 24;
constexpr std::size_t kDescriptorBytes = 24;
constexpr std::uint32_t kInline = 0xFFFFFFFF;
constexpr std::uint32_t kYours = 0x80000000;
constexpr std::size_t kMaxSlotsOffered = 64;
constexpr std::size_t kSlotHeaderBytes = 64;    // keeps a slot's bytes 64-byte aligned
constexpr std::size_t kGrowBy = 64u << 10;      // slot files grow in steps of this

// The start of every slot, in shared memory: both processes touch `held`
// and read `generation`, so both are lock-free atomics (address-free).
struct SlotHeader {
  std::uint64_t token;                   // the offer's: names the slot set
  std::atomic<std::uint32_t> held;       // 1 from the sender's write until the receiver lets go
  std::uint32_t reserved;
  std::atomic<std::uint64_t> generation; // of the message the slot holds
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes);

struct Control {
  Kind kind;
  std::uint64_t token;
  std::uint32_t count;
  std::uint32_t seq;  // a data message's place after ring_open; 0 before it
};

template <class T>
inline void put(std::byte*& at, T v) {
  std::memcpy(at, &v, sizeof v);
  at += sizeof v;
}

template <class T>
inline T get(const std::byte*& at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  at += sizeof v;
  return v;
}

inline Part control_part(Kind kind, std::uint64_t token, std::uint32_t count, std::uint32_t seq = 0) {
  std::vector<std::byte> bytes(kControlBytes);
  std::byte* at = bytes.data();
  put(at, kShmMagic);
  put(at, kShmVersion);
  put(at, static_cast<std::uint16_t>(kind));
  put(at, token);
  put(at, count);
  put(at, seq);
  return Part::take(std::move(bytes));
}

inline std::optional<Control> read_control(const Message& m) {
  if (m.empty() || m[0].bytes.size() != kControlBytes) return std::nullopt;
  const std::byte* at = m[0].bytes.data();
  if (get<std::uint32_t>(at) != kShmMagic || get<std::uint16_t>(at) != kShmVersion) return std::nullopt;
  Control c;
  c.kind = static_cast<Kind>(get<std::uint16_t>(at));
  c.token = get<std::uint64_t>(at);
  c.count = get<std::uint32_t>(at);
  c.seq = get<std::uint32_t>(at);
  return c;
}

// A mapping of a slot file, unmapped when its last user lets go (a received
// part keeps the mapping it points into).
struct Region {
  std::byte* base = nullptr;
  std::size_t size = 0;
  Region(std::byte* b, std::size_t s) : base(b), size(s) {}
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() { munmap(base, size); }
  SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(base); }
  std::byte* bytes() const { return base + kSlotHeaderBytes; }
  std::size_t capacity() const { return size - kSlotHeaderBytes; }
};

inline std::shared_ptr<Region> map_region(int fd, std::size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::make_shared<Region>(static_cast<std::byte*>(p), size);
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// What a received part's owner holds: the slot goes back to its sender
// when the last copy of the part's owner is dropped, on whatever thread.
// A slot handed back to its sender (kYours) stays held: the sender's lease
// on it lets it go.
struct Lease {
  explicit Lease(std::shared_ptr<Region> r) : region(std::move(r)) {}
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() {
    if (!handed_back.load(std::memory_order_acquire)) region->header()->held.store(0, std::memory_order_release);
  }
  std::shared_ptr<Region> region;
  std::atomic<bool> handed_back{false};
};

inline std::size_t round_up(std::size_t n, std::size_t step) { return (n + step - 1) / step * step; }

/// A file this process writes in shared memory: a slot (one per slot file
/// it offered a peer), or a ring.
struct OutSlot {
  std::string name;  // empty once unlinked
  std::unique_ptr<Fd> file;
  std::shared_ptr<Region> region;
};

/// Creates "/asgd-PID-TOKEN-INDEX" (mode 0600; unique among the transports
/// of a process, and across processes) of `size` bytes, mapped; nullopt,
/// with why in `*why`, when it cannot (no /dev/shm, a full one).
std::optional<OutSlot> make_slot_file(std::uint64_t token, std::size_t index, std::size_t size, std::string* why);

/// Removes the POSIX shared memory objects in `dir` (where they live) whose
/// owner no longer runs: `owner_of` reads the owner's pid of the object
/// named `name` (a name in `dir`), or 0 for one that is not of its kind,
/// which stays, as does one whose process runs (or cannot be asked).
/// Returns how many it removed.
std::size_t remove_orphans(const std::string& dir, const std::function<pid_t(const std::string& name)>& owner_of);

/// Removes the slot files in `dir` whose names say a process that no
/// longer runs offered them ("asgd-PID-TOKEN-INDEX"): a process killed
/// between its offer and the peer's answer leaves its offer's names
/// behind, which nobody else knows. Returns how many it removed.
std::size_t remove_stale_slots(const std::string& dir = "/dev/shm");

}  // namespace asgd::messaging::shm_detail
