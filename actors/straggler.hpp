#pragma once
// Simulated stragglers, for experiments (--straggler): how much longer each
// of a worker's steps takes. Three models, which may be combined (a comma
// between items) and add up:
//
//   W:F              worker W is persistently slow: every step takes F x
//                    its compute time (a slower device)
//   random:P:F       every worker, at every step, with probability P takes
//                    F x its compute time (transient delays: contention,
//                    network jitter)
//   pause:W:EVERY:S  worker W stalls S seconds after every EVERY-th step (a
//                    garbage-collection or preemption pause)
//
// Which steps are slowed follows from the job's seed, the worker and the
// step's number alone: the same seed slows the same steps of the same
// workers in every run, in one process or many.

#include <cstdint>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

struct Straggler {
  double factor = 1.0;            ///< W:F
  double chance = 0.0;            ///< random:P:F's P, in [0, 1]
  double chance_factor = 1.0;     ///< random:P:F's F
  std::uint64_t pause_every = 0;  ///< pause:W:EVERY:S's EVERY (0: no pauses)
  double pause_s = 0.0;           ///< pause:W:EVERY:S's S
  std::uint64_t stream = 0;       ///< the job's seed mixed with the worker's id

  bool slows() const { return factor > 1.0 || chance > 0.0 || pause_every > 0; }
  /// Whether the random model slows step `step`.
  bool random_hit(std::uint64_t step) const;
  /// Seconds to wait after step `step`, whose computing took `compute_s`.
  double delay_s(std::uint64_t step, double compute_s) const;
  /// A step's mean slow-down as a factor of its compute time (pauses left
  /// out): what --worker-weights auto calibrates with.
  double mean_factor() const { return factor + chance * (chance_factor - 1.0); }
};

/// Each worker's Straggler from --straggler (see above; empty: none slowed),
/// for a job of `workers` with seed `seed`. Errors: invalid_argument naming
/// the item: a worker that does not exist, a factor under 1, a chance
/// outside (0, 1], a pause interval under 1 step or a pause of 0 s or less.
Result<std::vector<Straggler>> parse_stragglers(const std::string& text, std::uint32_t workers, std::uint64_t seed);

}  // namespace asgd
