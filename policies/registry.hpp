#pragma once
// The policy registry: each policy file declares one PolicyEntry (its name,
// its knobs with their defaults and one-line docs, its factory), and
// registry.cpp lists them. Everything that names a policy or one of its
// settings reads it from here: make_policy, the command line's flags and
// TOML keys (runtime/config_file.cpp), `asgd compare`, `--help`.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "policies/policy.hpp"

namespace asgd {

/// A setting a policy takes. Its flag is --NAME and its TOML key NAME with
/// '-' written as '_' ("local-steps": --local-steps, local_steps).
struct PolicyKnob {
  std::string name;
  std::string metavar;       ///< for --help: "K"
  double default_value = 0;
  double min = 0;            ///< the smallest value allowed
  double max = 0;            ///< the largest value allowed
  bool whole = true;         ///< a whole number
  std::string doc;           ///< one line, without the default
  /// `min` itself is not allowed (easgd's moving rate: 0 never moves the
  /// center the job evaluates), nor a value that is `min` as a float.
  bool above_min = false;
  /// For --help, where the default follows the job (training_settings
  /// adjusts it for the worker count): "0.9 / workers"; empty: the value.
  std::string default_doc = {};
};

/// One policy: what `--policy NAME` selects.
struct PolicyEntry {
  std::string name;          ///< "ssp"
  std::string summary;       ///< one line for --help and docs
  /// The knob "NAME:V" sets ("staleness" for ssp:S); empty: NAME takes no ":V".
  std::string argument;
  std::vector<PolicyKnob> knobs;
  /// Builds the policy from every knob's value (defaults filled in).
  std::function<std::unique_ptr<ConsistencyPolicy>(const PolicyOptions&)> make;
};

/// Every policy, in the order --help lists them.
const std::vector<PolicyEntry>& policy_registry();

/// The entry for a policy name, with or without its ":V" ("ssp:3"); null
/// when no policy has that name.
const PolicyEntry* find_policy(const std::string& name);

/// Every way to name a policy, joined by `separator`: "bsp, ssp, ssp:S, ...".
std::string policy_spellings(const std::string& separator);

/// Every knob name any policy takes, each once, in registry order, with the
/// policies that take it ("local-steps" -> averaging, easgd).
struct KnobUse {
  const PolicyKnob* knob;                  ///< the first policy's declaration
  std::vector<const PolicyEntry*> policies;
};
std::vector<KnobUse> policy_knobs();

/// The policy's settings: every knob it takes, set from the name's ":V" and
/// `config.options`, the rest at their defaults. Errors: invalid_argument
/// naming the bad value (an unknown policy, a malformed ":V", a knob out of
/// its range, a knob the policy does not take).
Result<PolicyOptions> resolve_policy_options(const PolicyConfig& config);

/// Whether `policy` (as --policy spells it: "ssp", "ssp:3") takes
/// --staleness-aware-lr: async and ssp, whose shards apply each worker's
/// gradient on its own, however stale.
bool takes_staleness_aware_lr(const std::string& policy);

}  // namespace asgd
