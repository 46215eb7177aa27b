#pragma once
// What a worker's training step costs on its device, as it measures before
// training (--worker-weights auto), and the batches that balance a job's
// workers by it (balanced_batches, job_plan.hpp).

#include <cstddef>
#include <vector>

namespace asgd {

/// A training step of B samples takes fixed_s + B x per_sample_s seconds. A
/// GPU's fixed part (the parameters' copies, launches) is large beside its
/// per-sample part, a CPU's small: a rate measured at one batch size
/// misjudges both at another.
struct StepCost {
  double fixed_s = 0.0;
  double per_sample_s = 0.0;

  double seconds_at(double batch) const { return fixed_s + batch * per_sample_s; }
};

/// Records worker w's measurement c (workers measure in order, round after
/// round): its first, or the cheaper at `batch` of c and the one kept. What
/// else runs on the machine only ever slows a measurement, so over repeated
/// rounds the cheapest is the truest.
inline void keep_cheapest(std::vector<StepCost>& costs, std::size_t w, StepCost c, double batch) {
  if (w == costs.size()) costs.push_back(c);
  else if (c.seconds_at(batch) < costs.at(w).seconds_at(batch)) costs[w] = c;
}

}  // namespace asgd
