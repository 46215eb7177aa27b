#pragma once
// The ring and the doorbell of make_shm_transport (messaging/shm_transport.cpp):
// once a peer on this host has taken a process's slots, every message to it
// (its descriptors and small parts) goes into a ring in shared memory
// instead of onto ZeroMQ, and the receiver is woken through a doorbell
// only when it sleeps. A message then crosses no ZeroMQ I/O thread: the
// sender's thread writes it, the receiver's thread reads it. Internal.
//
// A ring is a POSIX shared memory object the sender makes with its slots:
// a RingHeader, then `capacity` bytes of entries, each 8-byte aligned:
//   u32 parts | u32 body | u32 length per part | the parts' bytes
// (body: the bytes after the first 8), or a wrap marker (parts = kWrap)
// that sends the reader to the start. The sender publishes an entry by
// moving `tail` past it, after writing it whole: a sender killed while
// writing publishes nothing. The receiver copies an entry out and moves
// `head`. Both count bytes since the start, never wrapping.
//
// A doorbell is a Unix datagram socket in the abstract namespace (no
// file to leave behind) that the receiver binds and its transport's
// receive() watches (Transport::watch). The receiver sets `sleeping`
// before it waits; a sender that finds it set clears it and rings.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "messaging/shm_slots.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging::shm_detail {

constexpr std::size_t kRingHeaderBytes = 256;
constexpr std::size_t kRingCapacity = 256u << 10;
constexpr std::uint32_t kWrap = 0xFFFFFFFF;

struct RingHeader {
  std::uint64_t token;     // the offer's, as in its slots
  std::uint64_t capacity;  // bytes of entries after the header
  alignas(64) std::atomic<std::uint64_t> tail;      // written by the sender
  alignas(64) std::atomic<std::uint64_t> head;      // written by the receiver
  alignas(64) std::atomic<std::uint32_t> sleeping;  // 1: the receiver may be waiting on its doorbell
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);

/// A ring as either side maps it.
struct Ring {
  std::shared_ptr<Region> region;
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(region->base); }
  std::byte* entries() const { return region->base + kRingHeaderBytes; }
  std::size_t capacity() const { return region->size - kRingHeaderBytes; }
};

/// The bytes an entry for `m` takes (without a wrap marker before it).
std::size_t ring_entry_bytes(const Message& m);

/// The sender: writes `m` as the next entry and publishes it. False when
/// there is no room for it now (nothing written).
bool ring_write(const Ring& r, const Message& m);

enum class RingEntry { none, ready, malformed };

/// The receiver: the entry at the head, its parts copied into `out`, and
/// in `next` where the head goes once it is consumed (ring_consume). An
/// entry of more than `max_parts` parts, lengths that do not add up, or a
/// head and tail no writer could have left, is malformed.
RingEntry ring_peek(const Ring& r, std::size_t max_parts, Message& out, std::uint64_t& next);
void ring_consume(const Ring& r, std::uint64_t next);

/// The sender, after ring_write: rings `bell` when the receiver sleeps.
void ring_notify(const Ring& r, int bell);

/// A doorbell this process is rung at, named for the peers.
struct Bell {
  std::unique_ptr<Fd> socket;
  std::string name;
};
std::optional<Bell> make_bell(std::mt19937_64& rng);
/// A socket connected to the doorbell `name`; nullopt when there is none
/// by that name (another host, another network namespace) or it is not one
/// of ours.
std::unique_ptr<Fd> connect_bell(const std::string& name);
/// Whether the process that bound the doorbell `bell` is connected to is
/// gone (its socket closed: the datagram sent to ask is refused, or the
/// connection is no more). One that runs just gets rung once more.
bool bell_gone(int bell);
/// Reads every ring waiting on `bell`; returns how many there were.
std::size_t drain_bell(int bell);

}  // namespace asgd::messaging::shm_detail
