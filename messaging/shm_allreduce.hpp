#pragma once
// The all-reduce of a collective whose ranks all run on one host: through
// one shared memory segment instead of the ring over ZeroMQ
// (messaging/zmq_collective.cpp uses it when every rank joined the segment;
// messaging/shm_allreduce.cpp says how). Internal.
//
// Each rank copies its gradient into its own area of the segment; once every
// rank still in has done so, each sums one slice of the vector over all of
// them into the result, in rank order and with the weights the in-process
// collective uses (the same bits as messaging/local_collective.cpp, so as a
// bsp shard), and the mean is read in place. A rank that dies has its slice
// summed by the others; one whose process is gone is dropped when its owner
// is told (leave).

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "messaging/collective.hpp"

namespace asgd::messaging {

class ShmAllreduce {
 public:
  using Ready = Collective::Ready;
  /// What start() found: the group works in shared memory (go), or it does
  /// not (every rank of the group comes to the same answer), and the ring
  /// should run the round instead.
  enum class Mode { shared_memory, ring };

  /// Rank `rank` of the group whose ranks listen at `endpoints` registers in
  /// the group's segment (rank 0 creates it); never blocks. nullptr when
  /// shared memory fails here: the group then uses the ring. Whether every
  /// rank shares this host is settled at the first all-reduce (start()).
  static std::unique_ptr<ShmAllreduce> join(const std::vector<std::string>& endpoints, Rank rank,
                                            std::chrono::milliseconds settle);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  /// This rank's contribution to `round` (see Collective::allreduce_mean);
  /// does not block: the group's own thread waits for the others and calls
  /// `ready` with Mode::shared_memory once mean() can be read, or with
  /// Mode::ring when the group turned out not to share a host (at the first
  /// round only: then nothing was contributed here).
  using Done = std::function<void(Mode)>;
  void start(Round round, std::span<const float> data, double weight, Done done);
  bool busy() const;

  /// After done(shared_memory): valid until this rank's next start().
  std::span<const float> mean() const;
  double total() const;

  /// Rank `r` is out (it left, or its process died): nobody waits for it.
  void leave(Rank r);
  /// For a timeout's message; empty when nothing is in flight.
  std::string waiting_for() const;

  /// Removes the segments in `dir` (where POSIX shared memory lives) whose
  /// rank 0 no longer runs: a rank 0 that died before every rank had joined
  /// left its segment's name behind. A segment whose rank 0 runs, or that
  /// is not (yet) one of ours, stays. Returns how many it removed. join()
  /// does it once a process.
  static std::size_t remove_stale_segments(const std::string& dir = "/dev/shm");

  struct Segment;  // the shared layout (shm_allreduce.cpp)

 private:
  struct State;
  explicit ShmAllreduce(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace asgd::messaging
