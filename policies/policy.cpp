#include "policies/policy.hpp"

#include <charconv>

#include "policies/async.hpp"
#include "policies/averaging.hpp"
#include "policies/bsp.hpp"
#include "policies/hogwild.hpp"
#include "policies/ssp.hpp"

namespace asgd {

const std::vector<std::string>& known_policies() {
  static const std::vector<std::string> names = {"bsp", "ssp", "async", "hogwild", "averaging"};
  return names;
}

namespace {

/// Default ssp staleness when neither "ssp:S" nor --staleness gives one.
constexpr std::uint32_t kDefaultStaleness = 3;
/// Default averaging round length when --local-steps is not given.
constexpr std::uint32_t kDefaultLocalSteps = 8;

Status only_for(const char* setting, const char* policies, const std::string& name) {
  return Status::InvalidArgument(std::string(setting) + " applies to " + policies + " only, not to --policy " + name);
}

}  // namespace

Result<std::unique_ptr<ConsistencyPolicy>> make_policy(const PolicyConfig& c) {
  std::string base = c.name;
  std::optional<std::uint32_t> staleness = c.staleness;
  if (const auto colon = c.name.find(':'); colon != std::string::npos) {
    base = c.name.substr(0, colon);
    const std::string arg = c.name.substr(colon + 1);
    std::uint32_t s = 0;
    const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), s);
    if (base != "ssp" || arg.empty() || ec != std::errc() || end != arg.data() + arg.size())
      return Status::InvalidArgument("'" + c.name + "': only ssp takes a parameter, as ssp:S with S a whole number >= 0");
    if (staleness && *staleness != s)
      return Status::InvalidArgument("'" + c.name + "' disagrees with --staleness " + std::to_string(*staleness));
    staleness = s;
  }
  if (c.fetch_every == 0) return Status::InvalidArgument("fetch-every must be >= 1, got 0");
  if (c.push_every == 0) return Status::InvalidArgument("push-every must be >= 1, got 0");
  if (c.local_steps == 0u) return Status::InvalidArgument("local-steps must be >= 1, got 0");
  if (base != "async" && (c.fetch_every != 1 || c.push_every != 1))
    return only_for("--fetch-every and --push-every", "--policy async", base);
  if (base != "ssp" && staleness) return only_for("--staleness", "--policy ssp", base);
  if (base != "bsp" && c.backup_workers != 0) return only_for("--backup-workers", "--policy bsp", base);
  if (base != "averaging" && c.local_steps) return only_for("--local-steps", "--policy averaging", base);

  std::unique_ptr<ConsistencyPolicy> p;
  if (base == "async") p = std::make_unique<AsyncPolicy>(c.fetch_every, c.push_every);
  else if (base == "ssp") p = std::make_unique<SspPolicy>(staleness.value_or(kDefaultStaleness));
  else if (base == "bsp") p = std::make_unique<BspPolicy>(c.backup_workers);
  else if (base == "averaging") p = std::make_unique<AveragingPolicy>(c.local_steps.value_or(kDefaultLocalSteps));
  else if (base == "hogwild") p = std::make_unique<HogwildPolicy>();
  else return Status::InvalidArgument("unknown policy '" + c.name + "' (known: bsp, ssp, ssp:S, async, hogwild, averaging)");
  return p;
}

}  // namespace asgd
