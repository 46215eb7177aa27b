// The all-reduce in shared memory (messaging/shm_allreduce.hpp).
//
// The segment is a POSIX shared memory object named after the group's
// endpoints, created by rank 0 when it connects and unlinked by it once the
// group has settled whether to use it. Its header holds, per rank, whether
// it joined and its last contribution's round, length and weight; per
// slice, the last round it was summed for; the ranks still in; and a
// futex word every change bumps. After the header: the result, then one area
// per rank, each `capacity` floats (the longest vector so far, which every
// rank computes alike, so every rank lays the segment out alike).
//
// A round r: a rank copies its data into its area and publishes round r + 1
// as arrived; once every rank still in has arrived, the first to see it
// fixes the round's contributors (those arrived: a rank declared dead after
// it contributed still counts, one that never arrived does not), and each
// contributor sums its slice of the vector over all of them into the result;
// a rank waiting for a slice whose owner is gone sums it itself (the same
// bits). A rank writes its area for the next round only after every slice
// of this one is summed, so nobody reads an area while it is written, and
// the result is written only once every rank has started the next round,
// so a mean is read in place until its rank's next call.
//
// Waits spin for up to kSpin, then sleep on the futex (shared, not private:
// the waiters are other processes) in slices of 10 ms; they end when their
// condition holds or the object is destroyed; the caller's own timeout names
// what is missing (waiting_for).
#include "messaging/shm_allreduce.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "base/log.hpp"
#include "base/process.hpp"
#include "messaging/shm_slots.hpp"

namespace asgd::messaging {

namespace {  // its names differ from those of the files the unity build puts beside it

using SteadyClock = std::chrono::steady_clock;
constexpr std::uint32_t kSegmentMagic = 0x52415341;  // "ASAR"
constexpr std::uint32_t kSegmentVersion = 1;
constexpr std::size_t kSumBlock = 2048;  // floats summed over every area at a time (stays in L1)
constexpr auto kSpin = std::chrono::microseconds(50);
enum : std::uint32_t { kUnsettled = 0, kShared = 1, kRing = 2, kBroken = 3 };

inline std::uint64_t rank_bit(Rank r) { return std::uint64_t{1} << r; }

// out = 0 + k x src (0 + as the in-process collective starts from zeros:
// the same bits, -0 included), then out += k x src per further area.
[[gnu::noinline]] inline void first_term(float* __restrict out, float k, const float* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = 0.0f + k * src[i];
}
[[gnu::noinline]] inline void next_term(float* __restrict out, float k, const float* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] += k * src[i];
}

inline long futex_call(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

struct ShmAllreduce::Segment {
  struct alignas(64) RankLine {
    std::atomic<std::uint32_t> present;   // 1 once it joined
    std::atomic<std::uint32_t> pid;
    std::atomic<std::uint64_t> arrived;   // round + 1 of its last contribution
    std::atomic<std::uint64_t> length;    // of that contribution
    std::atomic<std::uint64_t> weight;    // its bits, as a double
  };

  struct alignas(64) SliceLine {
    std::atomic<std::uint64_t> claim;  // (round + 1) << 8 | the rank that sums it
    std::atomic<std::uint64_t> done;   // round + 1 it was last summed for
  };

  std::atomic<std::uint32_t> magic;  // written last by rank 0
  std::uint32_t version;
  std::uint32_t ranks;
  std::uint32_t creator;  // rank 0's pid
  std::atomic<std::uint32_t> mode;
  std::atomic<std::uint32_t> doorbell;  // the futex word
  std::atomic<std::uint32_t> sleepers;
  std::uint32_t reserved;
  std::atomic<std::uint64_t> live;          // bit r: rank r is still in
  std::atomic<std::uint64_t> claimed;       // round + 1 whose contributors someone is fixing
  std::atomic<std::uint64_t> frozen;        // round + 1 whose contributors are fixed
  std::atomic<std::uint64_t> contributors;  // and who they are
  RankLine rank[kMaxCollectiveRanks];
  SliceLine slice[kMaxCollectiveRanks];
};

namespace {
constexpr std::size_t kSegmentBytes = (sizeof(ShmAllreduce::Segment) + 4095) / 4096 * 4096;
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free);
}  // namespace

struct ShmAllreduce::State {
  std::string name;
  Rank rank = 0, ranks = 0;
  SteadyClock::time_point settle_by;
  int fd = -1;
  Segment* seg = nullptr;     // the header, mapped once
  float* data = nullptr;      // the result and the areas, remapped as they grow
  std::size_t data_bytes = 0;
  std::size_t capacity = 0;   // floats per area
  std::uint32_t mode = kUnsettled;
  std::atomic<std::uint64_t> departed{0};  // leave()s, for a segment not mapped yet

  std::thread thread;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false, pending = false, in_flight = false;
  Round round = 0;
  std::span<const float> input;
  double weight = 0;
  Done done;
  std::span<const float> mean;  // the last round's, in place
  double total = 0;
  std::atomic<int> phase{0};    // for waiting_for: 0 idle, 1 joining, 2 contributions, 3 slices

  ~State() {
    if (data) munmap(data, data_bytes);
    if (seg) munmap(seg, kSegmentBytes);
    if (fd >= 0) close(fd);
  }

  bool stopping() const {
    std::lock_guard lock(mu);
    return stop;
  }

  void ring() {
    seg->doorbell.fetch_add(1, std::memory_order_release);
    if (seg->sleepers.load(std::memory_order_acquire) > 0) futex_call(&seg->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  }

  // Until `ok()` holds (true) or this object is being destroyed (false).
  template <class Cond>
  bool wait(Cond ok) {
    const auto spin_until = SteadyClock::now() + kSpin;
    while (SteadyClock::now() < spin_until)
      for (int j = 0; j < 64; ++j) {
        if (ok()) return true;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
    const timespec slice{0, 10'000'000};
    for (;;) {
      const std::uint32_t seen = seg->doorbell.load(std::memory_order_acquire);
      if (ok()) return true;
      if (stopping()) return false;
      seg->sleepers.fetch_add(1, std::memory_order_acq_rel);
      futex_call(&seg->doorbell, FUTEX_WAIT, seen, &slice);
      seg->sleepers.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  bool map_header() {
    void* p = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    std::lock_guard lock(mu);  // leave() and waiting_for() read it from other threads
    seg = static_cast<Segment*>(p);
    return true;
  }

  // Rank 0: a new segment (a stale one of the same name is unlinked first).
  bool create() {
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(kSegmentBytes)) != 0 || !map_header()) return false;
    seg->version = kSegmentVersion;
    seg->ranks = ranks;
    seg->creator = static_cast<std::uint32_t>(getpid());
    seg->live.store(ranks == 64 ? ~0ULL : rank_bit(ranks) - 1);
    seg->magic.store(kSegmentMagic, std::memory_order_release);
    return true;
  }

  // Another rank: rank 0's segment, once it is there and written.
  bool open_existing() {
    const int f = shm_open(name.c_str(), O_RDWR, 0600);
    if (f < 0) return false;
    struct stat st {};
    if (fstat(f, &st) != 0 || static_cast<std::size_t>(st.st_size) < kSegmentBytes) {
      close(f);
      return false;
    }
    fd = f;
    if (!map_header()) return false;
    if (seg->magic.load(std::memory_order_acquire) != kSegmentMagic || seg->version != kSegmentVersion || seg->ranks != ranks ||
        !process_runs(static_cast<pid_t>(seg->creator))) {
      std::lock_guard lock(mu);
      munmap(seg, kSegmentBytes);
      seg = nullptr;
      close(fd);
      fd = -1;
      return false;
    }
    return true;
  }

  // The segment found and this rank registered in it (retried until the
  // settling deadline), then whether every rank did: the group's answer.
  std::uint32_t settle(std::size_t length) {
    phase = 1;
    while (!seg && SteadyClock::now() < settle_by && !stopping()) {
      if (open_existing()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!seg) return kRing;  // nobody here made it: the others find this rank missing and agree
    seg->live.fetch_and(~departed.load());
    seg->rank[rank].pid.store(static_cast<std::uint32_t>(getpid()));
    seg->rank[rank].present.store(1, std::memory_order_release);
    ring();
    auto all_present = [&] {  // a rank that left before it joined is not waited for
      const std::uint64_t live = seg->live.load(std::memory_order_acquire);
      for (Rank r = 0; r < ranks; ++r)
        if (seg->rank[r].present.load(std::memory_order_acquire) == 0 && (live & rank_bit(r))) return false;
      return true;
    };
    while (seg->mode.load() == kUnsettled && !all_present() && SteadyClock::now() < settle_by && !stopping())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (stopping()) return kBroken;  // a rank on its way out decides nothing for the others
    std::uint32_t want = all_present() && grow(length) ? kShared : kRing;
    std::uint32_t expected = kUnsettled;
    seg->mode.compare_exchange_strong(expected, want);
    const std::uint32_t settled = seg->mode.load();
    if (rank == 0) shm_unlink(name.c_str());  // everyone who will ever open it has
    ring();
    return settled;  // (run() grows this rank's mapping before each round)
  }

  // Room for vectors of `length` floats: the file grown (its pages reserved,
  // so that a full /dev/shm is an error here and not a SIGBUS later) and
  // mapped again.
  bool grow(std::size_t length) {
    if (length <= capacity) return true;
    const std::size_t bytes = (ranks + 1) * length * sizeof(float);
    struct stat st {};
    if (fstat(fd, &st) != 0) return false;
    const auto want = static_cast<off_t>(kSegmentBytes + bytes);
    if (st.st_size < want && ftruncate(fd, want) != 0) return false;
    if (const int e = posix_fallocate(fd, 0, want); e != 0) {
      logger().warn("worker {}'s collective: /dev/shm has no room for {} MiB of all-reduce buffers ({})", rank,
                    bytes >> 20, std::strerror(e));
      return false;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(kSegmentBytes));
    if (p == MAP_FAILED) return false;
    if (data) munmap(data, data_bytes);
    data = static_cast<float*>(p);
    data_bytes = bytes;
    capacity = length;
    return true;
  }

  float* area(Rank r) const { return data + (1 + static_cast<std::size_t>(r)) * capacity; }

  double weight_of(Rank r) const { return std::bit_cast<double>(seg->rank[r].weight.load(std::memory_order_acquire)); }

  void sum_slice(std::size_t index, const std::vector<Rank>& contributors, double weights, std::size_t length) {
    const std::size_t k = contributors.size(), begin = index * length / k, end = (index + 1) * length / k;
    if (weights > 0)
      for (std::size_t at = begin; at < end; at += kSumBlock) {
        const std::size_t n = std::min(kSumBlock, end - at);
        bool first = true;
        for (Rank q : contributors) {
          const double w = weight_of(q);
          if (w <= 0) continue;
          (first ? first_term : next_term)(data + at, static_cast<float>(w / weights), area(q) + at, n);
          first = false;
        }
      }
    // Only forward: a store of an earlier round must never undo a later one.
    std::uint64_t summed = seg->slice[index].done.load(std::memory_order_acquire);
    while (summed < round + 1 &&
           !seg->slice[index].done.compare_exchange_weak(summed, round + 1, std::memory_order_acq_rel)) {
    }
    ring();
  }

  bool went_on_without_this_rank() const {
    logger().error("worker {}'s collective: the others went on without this worker at step {} (it was declared lost)",
                   rank, round);
    return false;
  }

  bool own_bit_live() const { return (seg->live.load(std::memory_order_acquire) & rank_bit(rank)) != 0; }

  // Whether rank q's process may still write into the segment: it runs and
  // is not a zombie (killed, not yet reaped). A rank declared lost (its
  // heartbeats stopped) may only be stopped (SIGSTOP, a long pause) and
  // wake to finish what it was writing: its slice is taken over only once
  // it cannot (an audit saw a paused rank, woken, overwrite two rounds
  // later's mean in 12M places).
  bool may_still_write(Rank q) const {
    return process_can_act(static_cast<pid_t>(seg->rank[q].pid.load(std::memory_order_acquire)));  // (0: closed)
  }

  // This rank's contribution written and announced; then, once every live
  // rank has come, who contributed fixed (by the first rank there): those
  // that came and are not lost. False when the group stops, or this rank
  // was declared lost.
  bool contribute_and_freeze(std::size_t length, Round mark) {
    Segment::RankLine& me = seg->rank[rank];
    if (!own_bit_live()) return went_on_without_this_rank();  // and it writes nothing more
    if (weight > 0) std::memcpy(area(rank), input.data(), length * sizeof(float));
    me.length.store(length);
    me.weight.store(std::bit_cast<std::uint64_t>(weight > 0 ? weight : 0.0), std::memory_order_release);
    me.arrived.store(mark, std::memory_order_release);
    ring();
    phase = 2;
    if (!wait([&] {
          const std::uint64_t live = seg->live.load(std::memory_order_acquire);
          for (Rank q = 0; q < ranks; ++q)
            if ((live & rank_bit(q)) && seg->rank[q].arrived.load(std::memory_order_acquire) < mark) return false;
          return true;
        }))
      return false;
    std::uint64_t claimed = seg->claimed.load();
    while (claimed < mark && !seg->claimed.compare_exchange_weak(claimed, mark)) {
    }
    if (claimed < mark) {
      std::uint64_t mask = 0;
      const std::uint64_t live_now = seg->live.load(std::memory_order_acquire);
      for (Rank q = 0; q < ranks; ++q)
        if ((live_now & rank_bit(q)) && seg->rank[q].arrived.load(std::memory_order_acquire) >= mark)
          mask |= rank_bit(q);
      seg->contributors.store(mask, std::memory_order_release);
      seg->frozen.store(mark, std::memory_order_release);
      ring();
    }
    return wait([&] { return seg->frozen.load(std::memory_order_acquire) >= mark; });
  }

  // Every slice summed for round `mark`: this rank's own first, then any
  // whose holder is gone for good (declared lost, and its process can
  // write no more). False when the group stops or this rank is declared lost.
  bool sum_every_slice(const std::vector<Rank>& contributors, double sum, std::size_t length, Round mark,
                       std::size_t mine) {
    auto live = [&](Rank q) { return (seg->live.load(std::memory_order_acquire) & rank_bit(q)) != 0; };
    auto gone = [&](Rank q) { return !live(q) && !may_still_write(q); };
    // Claims slice i for this round and sums it; false when a rank that is
    // not gone holds it already, or this one was declared lost.
    auto try_sum = [&](std::size_t i) {
      std::uint64_t c = seg->slice[i].claim.load(std::memory_order_acquire);
      for (;;) {
        const auto holder = static_cast<Rank>(c & 0xFF);
        if ((c >> 8) >= mark && (holder == rank || !gone(holder))) return false;
        if (!own_bit_live()) return false;
        if (seg->slice[i].claim.compare_exchange_weak(c, mark << 8 | rank, std::memory_order_acq_rel)) break;
      }
      sum_slice(i, contributors, sum, length);
      return true;
    };
    try_sum(mine);
    for (std::size_t i = 0; i < contributors.size(); ++i) {
      auto summed = [&] { return seg->slice[i].done.load(std::memory_order_acquire) >= mark; };
      auto orphaned = [&] {
        const std::uint64_t c = seg->slice[i].claim.load(std::memory_order_acquire);
        return gone((c >> 8) >= mark ? static_cast<Rank>(c & 0xFF) : contributors[i]);
      };
      while (!summed()) {
        if (!wait([&] { return summed() || orphaned() || !own_bit_live(); })) return false;
        if (!own_bit_live()) {
          logger().error("worker {}'s collective: declared lost during step {}; it stops", rank, round);
          return false;
        }
        if (!summed()) try_sum(i);
      }
    }
    return true;
  }

  // One round, on the group's thread (see the top of this file).
  bool run_round() {
    const std::size_t length = input.size();
    const Round mark = round + 1;
    if (!contribute_and_freeze(length, mark)) return false;
    std::vector<Rank> contributors;
    const std::uint64_t mask = seg->contributors.load(std::memory_order_acquire);
    double sum = 0;
    for (Rank q = 0; q < ranks; ++q)
      if (mask & rank_bit(q)) {
        contributors.push_back(q);
        if (weight_of(q) > 0 && seg->rank[q].length.load() != length) {
          logger().error("worker {}'s collective: worker {} contributed {} values to an all-reduce of {}", rank, q,
                         seg->rank[q].length.load(), length);
          return false;
        }
        sum += weight_of(q);
      }
    const auto mine = static_cast<std::size_t>(std::find(contributors.begin(), contributors.end(), rank) -
                                               contributors.begin());
    if (mine == contributors.size()) return went_on_without_this_rank();
    phase = 3;
    if (!sum_every_slice(contributors, sum, length, mark, mine)) return false;
    total = sum;
    mean = sum > 0 ? std::span<const float>(data, length) : std::span<const float>();
    return true;
  }

  void run() {
    for (;;) {
      Done call;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || pending; });
        if (stop) return;
        pending = false;
        call = std::move(done);
      }
      if (mode == kUnsettled) {
        mode = settle(input.size());
        if (mode == kShared)
          logger().info("worker {}'s collective: every worker runs on this host; the all-reduce goes through shared "
                        "memory", rank);
        else if (mode == kRing)
          logger().info("worker {}'s collective: not every worker joined the shared memory here; the all-reduce goes "
                        "round the ring over tcp", rank);
      }
      if (mode == kRing) {
        finish(std::move(call), Mode::ring);
        continue;
      }
      const bool ok = mode == kShared && grow(input.size()) && run_round();
      if (!ok) {
        mode = kBroken;
        std::lock_guard lock(mu);
        if (stop) return;
        logger().error("worker {}'s collective: the all-reduce of step {} in shared memory cannot go on", rank, round);
        continue;  // in flight for good: the caller's timeout names it
      }
      finish(std::move(call), Mode::shared_memory);
    }
  }

  void finish(Done call, Mode m) {
    {
      std::lock_guard lock(mu);
      in_flight = false;
    }
    phase = 0;
    call(m);
  }
};

ShmAllreduce::ShmAllreduce(std::unique_ptr<State> state) : state_(std::move(state)) {}

std::size_t ShmAllreduce::remove_stale_segments(const std::string& dir) {
  // A segment's rank 0, from its header; 0 for a name or header not ours.
  return shm_detail::remove_orphans(dir, [](const std::string& name) -> pid_t {
    if (!name.starts_with("asgd-allreduce-")) return 0;
    const int fd = shm_open(("/" + name).c_str(), O_RDONLY, 0);
    if (fd < 0) return 0;
    struct stat st {};
    void* p = fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= kSegmentBytes
                  ? mmap(nullptr, kSegmentBytes, PROT_READ, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) return 0;
    const auto* seg = static_cast<const Segment*>(p);
    const bool ours = seg->magic.load(std::memory_order_acquire) == kSegmentMagic && seg->version == kSegmentVersion;
    const auto creator = static_cast<pid_t>(seg->creator);
    munmap(p, kSegmentBytes);
    return ours ? creator : 0;
  });
}

std::unique_ptr<ShmAllreduce> ShmAllreduce::join(const std::vector<std::string>& endpoints, Rank rank,
                                                 std::chrono::milliseconds settle) {
  static std::once_flag swept;  // once a process: what dead ranks 0 of earlier jobs left behind
  std::call_once(swept, [] {
    if (const std::size_t n = remove_stale_segments())
      logger().debug("collective: removed {} all-reduce segments whose rank 0 no longer runs", n);
  });
  if (endpoints.size() < 2 || endpoints.size() > kMaxCollectiveRanks || rank >= endpoints.size()) return nullptr;
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a of the endpoints: the group's name
  for (const auto& e : endpoints) {
    for (unsigned char c : e) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ '\n') * 1099511628211ULL;
  }
  auto s = std::make_unique<State>();
  s->name = fmt::format("/asgd-allreduce-{:016x}", h);
  s->rank = rank;
  s->ranks = static_cast<Rank>(endpoints.size());
  s->settle_by = SteadyClock::now() + settle;
  if (rank == 0) {
    if (!s->create()) {
      logger().warn("worker 0's collective: no shared memory for the all-reduce ({}): it uses the ring",
                    std::strerror(errno));
      shm_unlink(s->name.c_str());
      return nullptr;
    }
  }
  State* state = s.get();
  state->thread = std::thread([state] { state->run(); });
  return std::unique_ptr<ShmAllreduce>(new ShmAllreduce(std::move(s)));
}

ShmAllreduce::~ShmAllreduce() {
  {
    std::lock_guard lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  // It writes nothing more: the others may take over its slice once it is
  // declared lost, as for a process that ended.
  if (state_->seg) state_->seg->rank[state_->rank].pid.store(0, std::memory_order_release);
  if (state_->rank == 0 && state_->mode == kUnsettled) shm_unlink(state_->name.c_str());
}

void ShmAllreduce::start(Round round, std::span<const float> data, double weight, Done done) {
  {
    std::lock_guard lock(state_->mu);
    state_->round = round;
    state_->input = data;
    state_->weight = weight;
    state_->done = std::move(done);
    state_->pending = true;
    state_->in_flight = true;
  }
  state_->cv.notify_all();
}

bool ShmAllreduce::busy() const {
  std::lock_guard lock(state_->mu);
  return state_->in_flight;
}

std::span<const float> ShmAllreduce::mean() const { return state_->mean; }
double ShmAllreduce::total() const { return state_->total; }

void ShmAllreduce::leave(Rank r) {
  if (r >= state_->ranks) return;
  state_->departed.fetch_or(rank_bit(r));
  std::lock_guard lock(state_->mu);
  if (!state_->seg) return;  // settle() applies it once the segment is mapped
  state_->seg->live.fetch_and(~rank_bit(r), std::memory_order_acq_rel);
  state_->ring();
}

std::string ShmAllreduce::waiting_for() const {
  const State& s = *state_;
  std::lock_guard lock(s.mu);
  if (!s.in_flight) return {};
  const int phase = s.phase.load();
  if (phase <= 1 || !s.seg)
    return fmt::format("the all-reduce of step {}: waiting for every worker to join the shared memory", s.round);
  std::string who;
  const std::uint64_t live = s.seg->live.load();
  for (Rank q = 0; q < s.ranks; ++q) {
    const bool missing = phase == 2 ? s.seg->rank[q].arrived.load() < s.round + 1 : false;
    if ((live & rank_bit(q)) && missing) who += fmt::format("{}{}", who.empty() ? "" : ", ", q);
  }
  if (s.mode == kBroken) return fmt::format("the all-reduce of step {}: shared memory failed (see the log)", s.round);
  return phase == 2 ? fmt::format("the all-reduce of step {} in shared memory: workers {} have not contributed", s.round, who)
                    : fmt::format("the all-reduce of step {} in shared memory: slices not summed yet", s.round);
}

}  // namespace asgd::messaging
