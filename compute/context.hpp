#pragma once
// The compute resources of one job: how many threads each of its models may
// compute on (--threads), and the thread pools that give them those threads.
// A job makes one and hands it to every model it builds, so that two jobs
// (or two asgd::Runtimes) in one process each keep their own budget instead
// of sharing a process-wide setting.

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "compute/thread_pool.hpp"

namespace asgd {

/// Thread-safe: a job's workers take their pools from it concurrently.
class ComputeContext {
 public:
  /// `threads` per model, the model's own caller included (0 counts as 1).
  /// BLAS runs single-threaded from then on, inside the pools (see
  /// compute/blas.hpp).
  explicit ComputeContext(std::size_t threads);
  ComputeContext(const ComputeContext&) = delete;
  ComputeContext& operator=(const ComputeContext&) = delete;

  std::size_t threads() const { return threads_; }

  /// A new pool of threads() threads for one model: a pool runs one loop at
  /// a time, so models that compute at once each need their own. The
  /// context keeps it (and its parked threads) until the context ends.
  std::shared_ptr<ThreadPool> make_pool();

  /// How many pools (models) it has handed out.
  std::size_t pools() const;

  /// The most threads any loop of this context's pools has run on so far:
  /// what a job's models actually used of the budget.
  std::size_t widest_loop() const;

 private:
  const std::size_t threads_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<ThreadPool>> pools_;  // guarded by mutex_
};

}  // namespace asgd
