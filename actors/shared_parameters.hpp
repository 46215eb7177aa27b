#pragma once
// The one parameter buffer that hogwild workers share inside a process. Each
// worker reads and writes `values` without locks: that race is Hogwild's
// design (Recht et al. 2011), not an accident, and the values are plain
// floats, so a torn update loses part of one step at worst. The per-worker
// clocks are atomics, so staleness is measured without locks too.

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "policies/policy.hpp"

namespace asgd {

struct SharedParameters {
  SharedParameters(std::vector<float> initial, std::uint32_t workers)
      : values(std::move(initial)), clocks(workers), live(workers) {
    for (auto& l : live) l.store(true, std::memory_order_relaxed);
  }

  std::vector<float> values;              // (num_params,)
  std::vector<std::atomic<Clock>> clocks; // per worker: steps applied
  std::vector<std::atomic<bool>> live;    // per worker: not yet finished

  /// The slowest live worker's clock; the largest clock when none is live.
  Clock min_live_clock() const {
    Clock lowest = std::numeric_limits<Clock>::max(), highest = 0;
    for (std::size_t w = 0; w < clocks.size(); ++w) {
      const Clock c = clocks[w].load(std::memory_order_acquire);
      highest = std::max(highest, c);
      if (live[w].load(std::memory_order_acquire)) lowest = std::min(lowest, c);
    }
    return lowest == std::numeric_limits<Clock>::max() ? highest : lowest;
  }
};

}  // namespace asgd
