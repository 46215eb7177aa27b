// training_settings (asgd/job.hpp): the learning rate, momentum, warm-up and
// policy options a job trains with when the user left them to asgd, by
// policy and number of workers. Beside the policies, whose names it reads, so
// that the layers above (the coordinator, every cluster role) plan with it.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <string>
#include <vector>

#include "asgd/job.hpp"
#include "policies/registry.hpp"

namespace asgd {

namespace {

// The samples behind a stale step grow with the workers: at batch 64, 8 and
// 16 workers ended 5 epochs under async and ssp at 0.959-0.970 in some
// seeds (in one process, where CAF runs a worker several steps in a row,
// and across processes, which push as the scheduler lets them). Holding
// workers x batch at 256, what 4 workers at 64 hold, 8 workers at batch 32
// and 16 at 16 reached 0.9759-0.9827 (docs/policies.md). A rate or
// momentum given keeps 64, the batch it was chosen for.
std::uint32_t batch_for(const JobConfig& c, bool stale, std::vector<std::string>& adjusted) {
  if (c.batch) return *c.batch;
  if (!stale || c.workers <= 4 || c.lr || c.momentum) return 64;
  const std::uint32_t batch = std::max(8u, 256 / c.workers);
  adjusted.push_back(fmt::format(
      "batch {} per worker (256 / {} workers: at most 256 samples in flight, as with 4 workers at 64)", batch,
      c.workers));
  return batch;
}

}  // namespace

TrainingSettings training_settings(const JobConfig& c, Placement where) {
  TrainingSettings t;
  const std::uint32_t twice_up_to = where == Placement::processes ? 16 : 8;
  const std::string policy = c.policy.substr(0, c.policy.find(':'));
  const std::uint32_t n = c.workers;
  // The defaults were chosen on two workers under async. bsp, allreduce
  // and gossip take one step per clock from every worker's gradient: their
  // rate is async's per sample, 0.02 x N. Beyond two workers (hogwild
  // aside, whose in-process workers write one buffer) averaging takes more
  // samples per update: its rate grows with the workers (the linear
  // scaling rule from two workers). async and ssp instead apply staler gradients: their
  // staleness-aware steps (on by default, unless the rate or momentum is
  // given) take a step staler than usual with less momentum and the rate
  // times workers / its staleness. Every policy but hogwild ramps the rate up
  // over the first epoch (bsp, allreduce and gossip over half of it).
  // (docs/policies.md has the measurements.)
  const bool more = n > 2 && policy != "hogwild";
  const bool stale = takes_staleness_aware_lr(policy);
  // bsp and allreduce take one step per clock with the mean of every
  // worker's gradient, and gossip moves the workers' mean by it: at 0.02 x
  // N that is async's rate per sample (0.02 for each worker's gradient).
  const bool one_mean = policy == "bsp" || policy == "allreduce" || policy == "gossip";
  auto say = [&](const std::string& what) { t.adjusted.push_back(what); };
  const bool stale_steps = c.staleness_aware_lr ? *c.staleness_aware_lr : stale && !c.lr && !c.momentum;
  if (c.lr) {
    t.lr = *c.lr;
  } else if (policy == "easgd") {
    // The elastic pull holds each worker back towards the center: at 0.02
    // two workers ended 3 epochs at 0.970, at 0.04 at 0.974-0.976.
    t.lr = 0.04;
    say("lr 0.04 (easgd: twice the rate, against the elastic pull)");
  } else if (one_mean) {
    t.lr = 0.02 * n;
    say(fmt::format("lr {:g} (0.02 x {} workers: one step per clock from every worker's gradient, async's rate per "
                    "sample)",
                    t.lr, n));
  } else if (more && !stale) {
    t.lr = 0.02 * n / 2;
    say(fmt::format("lr {:g} (0.02 x {} workers / 2, the linear scaling rule)", t.lr, n));
  } else if (more && stale && stale_steps && !c.momentum && n < twice_up_to) {
    // With the stale steps damped, the fresh ones can take up to twice the
    // two-worker rate: to 8 worker processes, or 4 workers in one process,
    // where CAF runs a worker several fresh steps in a row and twice the
    // rate diverged at 8 (one seed of three).
    const double factor = std::min(2.0, static_cast<double>(twice_up_to) / n);
    t.lr = 0.02 * factor;
    say(fmt::format("lr {:.3g} (0.02 x {:.3g}, with the staleness-aware steps below)", t.lr, factor));
  }
  if (c.momentum) t.momentum = *c.momentum;
  t.batch = batch_for(c, stale, t.adjusted);
  const auto unset = [&](const char* knob) { return c.policy_options.count(knob) == 0; };
  if (policy == "averaging" && n > 8 && unset("local-steps")) {
    t.policy_options["local-steps"] = 4;
    say("--local-steps 4 (more than 8 workers average twice as often)");
  }
  if (policy == "easgd" && n != 2 && unset("moving-rate")) {
    // Zhang et al. (2015) keep beta = workers x alpha at 0.9.
    t.policy_options["moving-rate"] = 0.9 / n;
    say(fmt::format("--moving-rate {:.3g} (0.9 / {} workers)", 0.9 / n, n));
  }
  if (c.lr_warmup_epochs) {
    t.lr_warmup_epochs = *c.lr_warmup_epochs;
  } else if (more && one_mean) {
    t.lr_warmup_epochs = 0.5;
    say("lr warm-up over the first half epoch");
  } else if (more) {
    t.lr_warmup_epochs = 1.0;
    say("lr warm-up over the first epoch");
  }
  t.staleness_aware_lr = stale_steps;
  if (!c.staleness_aware_lr && stale_steps) {
    if (more)
      say(fmt::format("staleness-aware steps (a step over {:g} updates stale takes momentum 0.5, one over {:g} the "
                      "rate times {} / its staleness)",
                      std::max(1.0, n / 4.0), std::max(1.0, n / 2.0), std::max(2u, n)));
  }
  return t;
}

}  // namespace asgd
