#pragma once
// The threads a model's layers split their batches across. A pool runs a
// loop of numbered chunks on the calling thread plus helper threads started
// on first use and parked between loops: spawning threads per call cost
// 60-250 us on the 2-core VM, waking a parked one about 2 us. Pools come
// from the job's ComputeContext (compute/context.hpp), one per model.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace asgd {

/// Thread t owns the t-th of `threads` equal runs of chunks, so that
/// consecutive layers, which cut the batch alike, find their samples in the
/// same core's cache; a thread that has finished its own run takes chunks
/// from the others', so one that starts late (its core busy with other work,
/// as on a worker's machine beside its messaging threads) does not hold up
/// the rest. Not thread-safe: one caller at a time.
class ThreadPool {
 public:
  /// A pool of `threads` threads, the caller's included (0 counts as 1).
  explicit ThreadPool(std::size_t threads) : size_(threads ? threads : 1) {}
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  std::size_t threads() const { return size_; }

  /// The most threads a loop of this pool has run on so far (a loop of
  /// fewer chunks than threads runs on fewer). Safe to read from any thread.
  std::size_t widest_loop() const { return widest_.load(std::memory_order_relaxed); }

  /// Calls fn(chunk, thread) for every chunk in [0, chunks) on up to
  /// threads() threads (thread 0 is the caller; `thread` indexes per-thread
  /// scratch) and returns when all calls have returned. Which thread runs a
  /// chunk varies from call to call, so results that must not depend on it
  /// are accumulated per chunk. fn must not throw.
  template <class Fn>
  void run(std::size_t chunks, Fn& fn) {
    run(chunks, [](void* f, std::size_t chunk, std::size_t thread) { (*static_cast<Fn*>(f))(chunk, thread); }, &fn);
  }

 private:
  using Call = void (*)(void*, std::size_t, std::size_t);
  void run(std::size_t chunks, Call call, void* fn);
  void work(std::size_t thread);
  void helper_loop(std::size_t thread, std::uint32_t seen);

  struct alignas(64) Cursor {  // a cache line each: threads claim from their own without contention
    std::atomic<std::size_t> next{0};
    std::size_t end = 0;
  };

  const std::size_t size_;
  std::atomic<std::size_t> widest_{0};
  std::vector<std::thread> helpers_;  // helper i is thread i + 1
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::uint32_t> pending_{0};
  std::unique_ptr<Cursor[]> cursors_;  // per thread: the rest of its run of chunks
  std::atomic<bool> stop_{false};
  Call call_ = nullptr;
  void* fn_ = nullptr;
  std::size_t threads_ = 0;
  unsigned csr_ = 0;
};

/// Runs fn(chunk, thread) for every chunk on `pool`, or on the calling
/// thread alone (thread 0) when `pool` is null: a layer that no model has
/// given a pool computes single-threaded.
template <class Fn>
void run_chunks(ThreadPool* pool, std::size_t chunks, Fn& fn) {
  if (pool) return pool->run(chunks, fn);
  for (std::size_t c = 0; c < chunks; ++c) fn(c, std::size_t{0});
}

/// How many threads `pool` runs loops on; 1 for none.
inline std::size_t threads_of(const ThreadPool* pool) { return pool ? pool->threads() : 1; }

/// A batch cut into chunks of consecutive samples: at least 8 (so that a
/// late thread can hand work over), independent of the thread count up to 4,
/// so that per-chunk partial sums make results identical with 1, 2 or 4
/// threads.
struct Chunks {
  std::size_t size, count;
  std::pair<std::size_t, std::size_t> range(std::size_t chunk, std::size_t batch) const {
    return {chunk * size, std::min(batch, (chunk + 1) * size)};
  }
};

Chunks sample_chunks(std::size_t batch, std::size_t threads);

}  // namespace asgd
