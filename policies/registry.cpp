#include "policies/registry.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "policies/async.hpp"
#include "policies/averaging.hpp"
#include "policies/bsp.hpp"
#include "policies/decentralized.hpp"
#include "policies/easgd.hpp"
#include "policies/hogwild.hpp"
#include "policies/ssp.hpp"

namespace asgd {

const std::vector<PolicyEntry>& policy_registry() {
  static const std::vector<PolicyEntry> entries = {
      bsp_policy_entry(), ssp_policy_entry(), async_policy_entry(), hogwild_policy_entry(), averaging_policy_entry(),
      easgd_policy_entry(), allreduce_policy_entry(), gossip_policy_entry(),
  };
  return entries;
}

std::vector<std::string> known_policies() {
  std::vector<std::string> names;
  for (const PolicyEntry& e : policy_registry()) names.push_back(e.name);
  return names;
}

const PolicyEntry* find_policy(const std::string& name) {
  const std::string base = name.substr(0, name.find(':'));
  for (const PolicyEntry& e : policy_registry())
    if (e.name == base) return &e;
  return nullptr;
}

std::string policy_spellings(const std::string& separator) {
  std::string out;
  for (const PolicyEntry& e : policy_registry()) {
    out += (out.empty() ? "" : separator) + e.name;
    if (!e.argument.empty()) out += separator + e.name + ":" + e.knobs.front().metavar;
  }
  return out;
}

std::vector<KnobUse> policy_knobs() {
  std::vector<KnobUse> out;
  for (const PolicyEntry& e : policy_registry()) {
    for (const PolicyKnob& k : e.knobs) {
      auto it = std::find_if(out.begin(), out.end(), [&](const KnobUse& u) { return u.knob->name == k.name; });
      if (it == out.end()) out.push_back({&k, {&e}});
      else it->policies.push_back(&e);
    }
  }
  return out;
}

namespace {

std::string names_of(const std::vector<const PolicyEntry*>& entries) {
  std::string out;
  for (const PolicyEntry* e : entries) out += (out.empty() ? "" : ", ") + e->name;
  return out;
}

Status check_knob(const PolicyKnob& k, double v) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format("--{} {}: must be {}", k.name, v, why));
  };
  if (!std::isfinite(v)) return bad("a finite number");
  if (k.whole && v != std::floor(v)) return bad("a whole number");
  if (k.above_min && static_cast<float>(v) <= static_cast<float>(k.min))
    return bad(fmt::format("> {} (as a 32-bit float)", k.min));
  if (v < k.min) return bad(fmt::format(">= {}", k.min));
  if (v > k.max) return bad(fmt::format("<= {}", k.max));
  return {};
}

// The policies that take a ":V": "ssp and gossip".
std::string with_argument() {
  std::vector<std::string> names;
  for (const PolicyEntry& e : policy_registry())
    if (!e.argument.empty()) names.push_back(e.name);
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

// The ":V" of "NAME:V", for a policy that takes one.
Result<double> argument_of(const PolicyEntry& e, const std::string& name, std::size_t colon) {
  const std::string arg = name.substr(colon + 1);
  const PolicyKnob* knob = nullptr;
  for (const PolicyKnob& k : e.knobs)
    if (k.name == e.argument) knob = &k;
  if (!knob)
    return Status::InvalidArgument("'" + name + "': only " + with_argument() + " take a parameter (NAME:S)");
  // Digits only, then their value, however large: check_knob says how
  // large it may be (99999999999 was "not a whole number").
  double v = 0;
  const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), v);
  if (arg.empty() || !std::all_of(arg.begin(), arg.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      ec != std::errc() || end != arg.data() + arg.size())
    return Status::InvalidArgument("'" + name + "': write " + e.name + ":" + knob->metavar + " with " + knob->metavar +
                                   " a whole number >= 0");
  return v;
}

}  // namespace

Result<PolicyOptions> resolve_policy_options(const PolicyConfig& c) {
  const PolicyEntry* e = find_policy(c.name);
  if (!e) return Status::InvalidArgument("unknown policy '" + c.name + "' (known: " + policy_spellings(", ") + ")");
  PolicyOptions given = c.options;
  if (const auto colon = c.name.find(':'); colon != std::string::npos) {
    auto v = argument_of(*e, c.name, colon);
    if (!v) return v.status();
    if (auto it = given.find(e->argument); it != given.end() && it->second != *v)
      return Status::InvalidArgument(fmt::format("'{}' disagrees with --{} {}", c.name, e->argument, it->second));
    given[e->argument] = *v;
  }
  PolicyOptions out;
  for (const PolicyKnob& k : e->knobs) {
    const auto it = given.find(k.name);
    out[k.name] = it == given.end() ? k.default_value : it->second;
    if (Status s = check_knob(k, out[k.name]); !s.ok()) return s;
  }
  for (const auto& [name, value] : given) {
    if (out.count(name)) continue;
    std::vector<const PolicyEntry*> takers;
    for (const KnobUse& u : policy_knobs())
      if (u.knob->name == name) takers = u.policies;
    if (takers.empty()) return Status::InvalidArgument("no policy takes a setting '" + name + "'");
    return Status::InvalidArgument(fmt::format("--{} applies to --policy {} only, not to --policy {}", name,
                                               names_of(takers), e->name));
  }
  return out;
}

bool takes_staleness_aware_lr(const std::string& policy) {
  const std::string name = policy.substr(0, policy.find(':'));
  return name == "async" || name == "ssp";
}

Result<std::unique_ptr<ConsistencyPolicy>> make_policy(const PolicyConfig& config) {
  auto options = resolve_policy_options(config);
  if (!options) return options.status();
  return find_policy(config.name)->make(*options);
}

}  // namespace asgd
