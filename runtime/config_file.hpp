#pragma once
// One table of JobConfig's settable fields serves the command line and the
// TOML config file alike, so a key parses, and fails, the same way in both.

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "asgd/job.hpp"
#include "asgd/status.hpp"

namespace asgd {

/// How to read and write one field as text.
struct FieldAccess {
  /// Parses `text` into the field. Errors: invalid_argument naming the
  /// expected kind of value.
  std::function<Status(JobConfig&, const std::string& text)> set;
  /// The field as text that `set` parses back to the same value; nullopt
  /// for an optional field that is not set.
  std::function<std::optional<std::string>(const JobConfig&)> get;
};

struct ConfigField {
  std::string key;    ///< flag without "--" and TOML key: "data-dir"
  std::string help;
  std::string value_name;  ///< "N", "X", "DIR", ...
  FieldAccess access;
  /// Matters only when shards and workers are processes (asgd cluster,
  /// coordinator); one-process commands list it apart in --help.
  bool across_processes = false;
  Status set(JobConfig& c, const std::string& text) const { return access.set(c, text); }
};

const std::vector<ConfigField>& job_config_fields();

/// DIR/job.toml: the settings a checkpointing job writes beside its shard
/// checkpoints; `--resume DIR` starts from them.
/// The largest integer a setting may take: a TOML integer is signed
/// 64-bit, and toml11 reads one past it as INT64_MAX, which the reader
/// refuses (a --seed of 2^63 was taken, then its own job.toml refused).
inline constexpr std::uint64_t kLargestSettingInteger = std::numeric_limits<std::int64_t>::max() - 1;

inline constexpr const char* kJobSettingsFile = "job.toml";
/// The last line of a job.toml: one without it was cut short.
inline constexpr const char* kJobSettingsEnd = "# end of the settings";

/// Whether `name` is one of the files a checkpointing job keeps in its
/// folder: job.toml, model.ckpt, shard-K.ckpt and the claim and temporary
/// files beside each.
bool is_checkpoint_folder_file(const std::string& name);

/// Sets one field by key ("workers" or "workers" spelled "workers"; '_' and
/// '-' are interchangeable). Errors name the key and the value.
Status set_job_field(JobConfig& config, const std::string& key, const std::string& text);

/// Every set field as TOML ("key = value" lines, strings quoted): what a
/// coordinator sends its processes; apply_toml_text reads it back.
std::string to_toml(const JobConfig& config);

/// A config file's settings in the file's order: each key as its flag is
/// named ("data-dir", whether the file wrote '-' or '_') and its value as
/// that flag's text.
using ConfigSettings = std::vector<std::pair<std::string, std::string>>;

/// The settings of the TOML file at `path`, each checked as
/// apply_toml_file checks them, none applied: for a caller that must know
/// which keys a file sets (`resume`, a policy's settings).
Result<ConfigSettings> read_toml_file(const std::string& path, bool written_by_asgd = false);

/// Applies TOML text (see apply_toml_file). `origin` names it in errors.
Status apply_toml_text(const std::string& text, const std::string& origin, JobConfig& config);

/// Applies every key of the TOML file at `path` to `config`. Unknown keys,
/// wrong types and unreadable files are errors naming the file and the key.
/// A number or boolean given as a string is a wrong type, unless the file
/// is asgd's own (`written_by_asgd`: job.toml, which writes every value as
/// a string).
Status apply_toml_file(const std::string& path, JobConfig& config, bool written_by_asgd = false);

}  // namespace asgd
