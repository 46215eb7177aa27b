#pragma once
// One table of JobConfig's settable fields serves the command line and the
// TOML config file alike, so a key parses, and fails, the same way in both.

#include <functional>
#include <string>
#include <vector>

#include "asgd/job.hpp"

namespace asgd {

struct ConfigField {
  std::string key;    ///< flag without "--" and TOML key: "data-dir"
  std::string help;
  std::string value_name;  ///< "N", "X", "DIR", ...
  /// Parses `text` into the field. Errors: invalid_argument naming the
  /// expected kind of value.
  std::function<Status(JobConfig&, const std::string& text)> set;
};

const std::vector<ConfigField>& job_config_fields();

/// Sets one field by key ("workers" or "workers" spelled "workers"; '_' and
/// '-' are interchangeable). Errors name the key and the value.
Status set_job_field(JobConfig& config, const std::string& key, const std::string& text);

/// Applies every key of the TOML file at `path` to `config`. Unknown keys,
/// wrong types and unreadable files are errors naming the file and the key.
Status apply_toml_file(const std::string& path, JobConfig& config);

}  // namespace asgd
