#include "compute/thread_pool.hpp"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace asgd {

namespace {

// How long a thread polls before it sleeps on a futex: a layer's products
// come one after another, microseconds apart, and waking a sleeping thread
// costs tens of microseconds on a VM (measured: with sleeping helpers one
// 2-thread mlp worker ran at 70k samples/s, with OpenBLAS's spinning
// threads at 117k). Bounded, so idle threads give their core back.
constexpr int kSpinRounds = 16384;

inline void pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Waits until `value` differs from `old`: polls first, then sleeps.
template <class T>
void wait_for_change(const std::atomic<T>& value, T old) {
  for (int i = 0; i < kSpinRounds; ++i) {
    if (value.load(std::memory_order_acquire) != old) return;
    pause();
  }
  value.wait(old, std::memory_order_acquire);
}

}  // namespace

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ThreadPool::run(std::size_t chunks, Call call, void* fn) {
  const std::size_t threads = std::min(size_, chunks);
  if (threads > widest_.load(std::memory_order_relaxed)) widest_.store(threads, std::memory_order_relaxed);
  if (threads <= 1) {
    for (std::size_t c = 0; c < chunks; ++c) call(fn, c, 0);
    return;
  }
  if (helpers_.size() + 1 < threads) {
    cursors_ = std::make_unique<Cursor[]>(threads);  // no helper is running a loop now
    while (helpers_.size() + 1 < threads) {
      const std::size_t thread = helpers_.size() + 1;
      helpers_.emplace_back([this, thread, seen = generation_.load()] { helper_loop(thread, seen); });
    }
  }
  call_ = call;
  fn_ = fn;
  threads_ = threads;
  for (std::size_t t = 0; t < threads; ++t) {
    cursors_[t].next.store(chunks * t / threads, std::memory_order_relaxed);
    cursors_[t].end = chunks * (t + 1) / threads;
  }
#if defined(__x86_64__)
  csr_ = _mm_getcsr();  // helpers flush denormals exactly when the caller does
#endif
  // Every helper reports back (those past `threads` without working), so
  // that none can still be reading this loop's fields when the next one is
  // written.
  pending_.store(static_cast<std::uint32_t>(helpers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  work(0);
  for (std::uint32_t left; (left = pending_.load(std::memory_order_acquire)) != 0;) wait_for_change(pending_, left);
}

// Own run first, then the others' in turn.
void ThreadPool::work(std::size_t thread) {
  for (std::size_t i = 0; i < threads_; ++i) {
    Cursor& run = cursors_[(thread + i) % threads_];
    for (std::size_t c; (c = run.next.fetch_add(1, std::memory_order_relaxed)) < run.end;) call_(fn_, c, thread);
  }
}

void ThreadPool::helper_loop(std::size_t thread, std::uint32_t seen) {
  for (;;) {
    wait_for_change(generation_, seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    if (thread < threads_) {
#if defined(__x86_64__)
      _mm_setcsr(csr_);
#endif
      work(thread);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

Chunks sample_chunks(std::size_t batch, std::size_t threads) {
  const std::size_t wanted = std::max<std::size_t>(8, 2 * threads);
  const std::size_t size = std::max<std::size_t>((batch + wanted - 1) / wanted, 1);
  return {size, (batch + size - 1) / size};
}

}  // namespace asgd
