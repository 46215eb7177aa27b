#include "policies/policy.hpp"

#include <algorithm>

#include "policies/async.hpp"

namespace asgd {

const std::vector<std::string>& known_policies() {
  static const std::vector<std::string> names = {"bsp", "ssp", "async", "hogwild", "averaging"};
  return names;
}

Result<std::unique_ptr<ConsistencyPolicy>> make_policy(const PolicyConfig& c) {
  if (c.fetch_every == 0) return Status::InvalidArgument("fetch-every must be >= 1, got 0");
  if (c.push_every == 0) return Status::InvalidArgument("push-every must be >= 1, got 0");
  if (c.name == "async") return std::unique_ptr<ConsistencyPolicy>(std::make_unique<AsyncPolicy>(c.fetch_every, c.push_every));
  const auto& known = known_policies();
  if (std::find(known.begin(), known.end(), c.name) != known.end())
    return Status::InvalidArgument("policy '" + c.name + "' is not implemented in this build yet (available: async)");
  return Status::InvalidArgument("unknown policy '" + c.name + "' (known: bsp, ssp, async, hogwild, averaging)");
}

}  // namespace asgd
