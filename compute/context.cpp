#include "compute/context.hpp"

#include <algorithm>

#include "compute/blas.hpp"

namespace asgd {

ComputeContext::ComputeContext(std::size_t threads) : threads_(std::max<std::size_t>(threads, 1)) {
  // Our pools split the products themselves; OpenBLAS's own threads (one
  // process-wide count) would multiply with theirs.
  blas::set_threads(1);
}

std::shared_ptr<ThreadPool> ComputeContext::make_pool() {
  auto pool = std::make_shared<ThreadPool>(threads_);
  const std::lock_guard lock(mutex_);
  pools_.push_back(pool);
  return pool;
}

std::size_t ComputeContext::pools() const {
  const std::lock_guard lock(mutex_);
  return pools_.size();
}

std::size_t ComputeContext::widest_loop() const {
  const std::lock_guard lock(mutex_);
  std::size_t widest = 0;
  for (const auto& pool : pools_) widest = std::max(widest, pool->widest_loop());
  return widest;
}

}  // namespace asgd
