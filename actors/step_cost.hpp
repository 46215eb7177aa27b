#pragma once
// What a worker's training step costs on its device, as it measures before
// training (--worker-weights auto), and the batches that balance a job's
// workers by it (balanced_batches, job_plan.hpp).

namespace asgd {

/// A training step of B samples takes fixed_s + B x per_sample_s seconds. A
/// GPU's fixed part (the parameters' copies, launches) is large beside its
/// per-sample part, a CPU's small: a rate measured at one batch size
/// misjudges both at another.
struct StepCost {
  double fixed_s = 0.0;
  double per_sample_s = 0.0;
};

}  // namespace asgd
