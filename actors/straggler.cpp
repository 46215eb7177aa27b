#include "actors/straggler.hpp"

#include <cmath>

#include "base/flag_text.hpp"
#include "base/random.hpp"

namespace asgd {

bool Straggler::random_hit(std::uint64_t step) const {
  if (chance <= 0.0) return false;
  std::uint64_t s = mix_seed(stream, step);
  const double uniform = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
  return uniform < chance;
}

double Straggler::delay_s(std::uint64_t step, double compute_s) const {
  double delay = compute_s * (factor - 1.0);
  if (random_hit(step)) delay += compute_s * (chance_factor - 1.0);
  if (pause_every > 0 && step > 0 && step % pause_every == 0) delay += pause_s;
  return delay;
}

namespace {

// Beyond these a step's delay overflows the clock it is slept on (which
// silently slept not at all); no experiment needs more.
constexpr double kMaxStragglerFactor = 1e6;
constexpr double kMaxPauseS = 86400;
constexpr const char* kFactorRange = "needs a factor of at least 1 and at most 1000000";

}  // namespace

Result<std::vector<Straggler>> parse_stragglers(const std::string& text, std::uint32_t workers, std::uint64_t seed) {
  std::vector<Straggler> out(workers);
  for (std::uint32_t w = 0; w < workers; ++w) out[w].stream = mix_seed(seed, w, 0x5354524147474c52ULL);
  // "none": no straggler, as the empty default is (a resume clears the
  // checkpointed job's so; a flag cannot be empty).
  if (text.empty() || text == "none") return out;
  for (const std::string& item : split(text, ',')) {
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("--straggler " + text + ": '" + item + "' " + why);
    };
    const std::vector<std::string> f = split(item, ':');
    auto worker = [&](const std::string& index, std::uint32_t& w) -> Status {
      if (!parse_number(index, w)) return bad("does not start with a worker's number");
      if (w >= workers)
        return bad("names worker " + std::to_string(w) + " of " + std::to_string(workers) + " (workers count from 0)");
      return {};
    };
    if (f[0] == "random") {
      double p = 0, factor = 0;
      if (f.size() != 3 || !parse_number(f[1], p) || !parse_number(f[2], factor)) return bad("is not random:P:FACTOR");
      if (!(p > 0 && p <= 1)) return bad("needs a chance P in (0, 1]");
      if (!(factor >= 1 && factor <= kMaxStragglerFactor)) return bad(kFactorRange);
      for (Straggler& s : out) {
        s.chance = p;
        s.chance_factor = factor;
      }
    } else if (f[0] == "pause") {
      std::uint32_t w = 0;
      std::uint64_t every = 0;
      double seconds = 0;
      if (f.size() != 4 || !parse_number(f[2], every) || !parse_number(f[3], seconds))
        return bad("is not pause:WORKER:EVERY:SECONDS");
      if (Status s = worker(f[1], w); !s.ok()) return s;
      if (every < 1) return bad("needs a pause every 1 step or more");
      if (!(seconds > 0 && seconds <= kMaxPauseS)) return bad("needs a pause of more than 0 s and at most 1 day");
      out[w].pause_every = every;
      out[w].pause_s = seconds;
    } else {
      std::uint32_t w = 0;
      double factor = 0;
      if (f.size() != 2 || !parse_number(f[1], factor))
        return bad("is not WORKER:FACTOR, random:P:FACTOR or pause:WORKER:EVERY:SECONDS");
      if (Status s = worker(f[0], w); !s.ok()) return s;
      if (!(factor >= 1 && factor <= kMaxStragglerFactor)) return bad(kFactorRange);
      out[w].factor = factor;
    }
  }
  return out;
}

}  // namespace asgd
