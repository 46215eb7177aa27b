#pragma once
// Learning-rate schedules: a multiplier of the base rate as a function of
// how many updates have been applied. Shards apply them by their own update
// count, so the schedule needs no coordination between actors.

#include <cmath>
#include <cstdint>
#include <string>

namespace asgd {

struct LrSchedule {
  enum class Kind { constant, cosine, step };
  Kind kind = Kind::constant;
  std::uint64_t total_steps = 0;  ///< updates the whole job is expected to apply
  /// The first steps ramp the rate up linearly, from 1/warmup_steps of it
  /// at step 0 to all of it (Goyal et al. 2017); 0: no warm-up.
  std::uint64_t warmup_steps = 0;

  /// constant: 1. cosine: 0.5 * (1 + cos(pi * step / total_steps)), falling
  /// from 1 to 0 over the job (and staying at 0 past it). step: 1, then 0.1
  /// from half the job and 0.01 from three quarters (the milestones of the
  /// classic ResNet recipe, torch.optim.lr_scheduler.MultiStepLR with
  /// gamma 0.1). All are 1 when total_steps is 0.
  float scale(std::uint64_t step) const {
    const float ramp = step < warmup_steps ? static_cast<float>(step + 1) / static_cast<float>(warmup_steps) : 1.0f;
    if (kind == Kind::constant || total_steps == 0) return ramp;
    const double t = step >= total_steps ? 1.0 : static_cast<double>(step) / static_cast<double>(total_steps);
    if (kind == Kind::step) return ramp * (t < 0.5 ? 1.0f : t < 0.75 ? 0.1f : 0.01f);
    return ramp * static_cast<float>(0.5 * (1.0 + std::cos(3.14159265358979323846 * t)));
  }

  /// "constant", "cosine" or "step"; false for anything else.
  static bool parse(const std::string& name, Kind& out) {
    if (name == "constant") out = Kind::constant;
    else if (name == "cosine") out = Kind::cosine;
    else if (name == "step") out = Kind::step;
    else return false;
    return true;
  }
};

}  // namespace asgd
