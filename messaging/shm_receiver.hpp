#pragma once
// The receiving side of make_shm_transport (messaging/shm_transport.cpp
// holds the sending side): the slots and rings that peers on this host
// offered, the doorbell they ring, and the order in which their messages
// are delivered. Internal; on the transport's thread only.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "messaging/shm_ring.hpp"
#include "messaging/shm_slots.hpp"
#include "messaging/transport.hpp"

namespace asgd::messaging::shm_detail {

/// The sequence number after `seq` on a link through shared memory: 0
/// means "not sequenced" there, so after 2^32 - 1 messages it wraps to 1
/// (it wrapped to 0: that message was dropped from the ring, or overtook
/// the ring's entries on the socket).
inline std::uint32_t next_seq(std::uint32_t seq) { return seq == UINT32_MAX ? 1 : seq + 1; }

using Clock = std::chrono::steady_clock;

// A peer's slot as this process reads it.
struct InSlot {
  std::unique_ptr<Fd> file;
  std::shared_ptr<Region> region;
  std::weak_ptr<Lease> lease;  // of the part last received in it
};

struct InPeer {
  std::uint64_t token = 0;
  std::vector<InSlot> slots;
  std::optional<Ring> ring;
  bool open = false;                          // ring_open came: every message is sequenced
  bool broken = false;                        // a malformed entry: the ring is read no more
  std::uint32_t expected = 1;                 // the sequence number delivered next
  std::uint64_t seen_tail = 0;                // the ring's tail when it was last read
  std::optional<std::uint32_t> blocked_at;    // the next entry's number, when an earlier one is on the wire
  std::optional<Clock::time_point> stalled;   // since when it waits so (while this process looks)
  Clock::time_point looked{};                 // when it last found the ring so
};

/// The part at [offset, offset + length) of `region`, when the slot holds
/// the message of `generation`; leased until its last owner lets go (and
/// remembered in `*lease`, for handing the slot back). Either side's slot:
/// the writer does not touch it until then, so the part is ours to write.
std::optional<Part> leased_part(const std::shared_ptr<Region>& region, std::uint64_t offset, std::uint64_t length,
                                std::uint64_t generation, std::weak_ptr<Lease>* lease);

class ShmReceiver {
 public:
  /// One of this process's own slots that a peer hands back (kYours), as a
  /// part; nullopt when it is not one.
  using ReturnedSlot = std::function<std::optional<Part>(const PeerId& from, std::uint32_t index, std::uint32_t offset,
                                                         std::uint64_t length, std::uint64_t generation)>;

  /// `inner` watches the doorbell; `limits` may change (set_bound_limits).
  ShmReceiver(Transport& inner, const TransportLimits& limits, bool enabled, const std::string& log_name,
              ReturnedSlot returned);

  /// An offer: its slots (and ring) opened; returns the answer to send.
  Message on_offer(const Incoming& in, const Control& c);
  /// From here on the peer's messages come in sequence.
  void on_ring_open(const PeerId& from, const Control& c);
  /// A data message from the wire: the message it describes, or the next
  /// one due (those before it in the ring come first); nullopt when none.
  std::optional<Incoming> on_data(Incoming& in, const Control& c);
  /// The next message due from any peer's ring, peers taken in turn.
  std::optional<Incoming> from_rings();
  /// Before a wait: says in each readable ring that its reader sleeps.
  /// False (and awake again) when one was written to since it was read.
  bool sleep_on_rings();
  void wake_on_rings();
  /// Whether the doorbell was rung since the last look (it is read).
  bool rung();
  /// The socket had nothing waiting when it was read: a message that
  /// travels on it and has not come by then is lost, not late.
  void wire_was_empty() { wire_empty_at_ = Clock::now(); }
  /// Backpressure: the rings of peers that connected to the bound endpoint
  /// are left unread, as the endpoint is.
  void pause(bool paused) {
    if (paused_ && !paused)  // a wait for a late message counts afresh from here
      for (auto& [from, p] : in_)
        if (p.stalled) p.stalled = p.looked = Clock::now();
    paused_ = paused;
  }
  void forget(const PeerId& peer) { in_.erase(peer); }
  /// Whether `peer`'s ring holds messages not yet read (or read and not
  /// yet returned by from_rings).
  bool unread_from(const PeerId& peer) const;
  InPeer* find(const PeerId& peer);
  /// Counts a malformed message from `from` (logged once a peer).
  void reject(const PeerId& from);
  /// shm_received, shm_rejected, ring_received.
  const TransportStats& counts() const { return counts_; }

 private:
  const Bell* bell();
  std::optional<InPeer> open_slots(std::span<const std::byte> names, const Control& c);
  std::optional<std::pair<std::unique_ptr<Fd>, std::shared_ptr<Region>>> open_file(const std::string& name,
                                                                                    std::size_t at_least);
  void open_ring(InPeer& peer, const std::string& name);
  bool readable(const PeerId& from, const InPeer& p) const;
  std::optional<Incoming> next_from_ring(const PeerId& from, InPeer& p);
  bool gave_up_waiting(const PeerId& from, InPeer& p, std::uint32_t seq);
  void lost(const PeerId& from, InPeer& p, std::uint32_t seq);
  std::optional<Incoming> on_sequenced(Incoming& in, const Control& c);
  std::optional<Message> rebuild(Incoming& in, const Control& c);
  std::optional<Part> read_slot(InSlot& slot, std::uint64_t length, std::uint64_t generation);

  Transport& inner_;
  const TransportLimits& limits_;
  bool enabled_;
  std::string log_name_;
  ReturnedSlot returned_;
  std::mt19937_64 rng_;
  std::map<PeerId, InPeer> in_;
  std::optional<Bell> bell_;  // where peers' rings ring this process (bell())
  bool bell_failed_ = false;
  bool paused_ = false;
  Clock::time_point wire_empty_at_{};  // wire_was_empty()
  std::deque<Incoming> ready_;  // read in sequence, not yet returned
  PeerId last_ring_;            // the ring read last
  std::map<PeerId, bool> logged_;
  TransportStats counts_;
};

}  // namespace asgd::messaging::shm_detail
