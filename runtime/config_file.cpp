#include "runtime/config_file.hpp"

#include "base/flag_text.hpp"

#include <spdlog/fmt/fmt.h>
#include <toml.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "actors/checkpoint.hpp"
#include "base/paths.hpp"
#include "policies/registry.hpp"

namespace asgd {

namespace {

template <class Int>
Status parse_uint(const std::string& text, Int& out) {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const bool integer = !text.empty() && ptr == end && (ec == std::errc() || ec == std::errc::result_out_of_range);
  constexpr std::uint64_t kMax = std::min<std::uint64_t>(std::numeric_limits<Int>::max(), kLargestSettingInteger);
  if (integer && (ec != std::errc() || v > kMax))
    return Status::InvalidArgument("expected an integer from 0 to " + std::to_string(kMax));
  if (!integer) return Status::InvalidArgument("expected a non-negative integer");
  out = static_cast<Int>(v);
  return {};
}

Status parse_double(const std::string& text, double& out) {
  // from_chars for floating point is in libstdc++ 11+; strtod would accept
  // leading spaces and hex, which a config value should not.
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  if (!text.empty() && ptr == end && ec == std::errc::result_out_of_range)  // 1e400, 1e-400
    return Status::InvalidArgument("a number past what a double holds (about 1.8e308, or below 2.2e-308)");
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(out))
    return Status::InvalidArgument("expected a number");
  return {};
}

// The shortest text that reads back as `v` exactly (0.013, not
// 0.012999999999999999).
std::string number_text(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

template <class Int>
FieldAccess uint_field(Int JobConfig::*member) {
  return {[member](JobConfig& c, const std::string& t) { return parse_uint(t, c.*member); },
          [member](const JobConfig& c) -> std::optional<std::string> { return std::to_string(c.*member); }};
}

// A field whose unset value means "the default" (training_settings): read
// and written as its plain number is, absent from the text when unset.
template <class T>
FieldAccess optional_field(std::optional<T> JobConfig::*member) {
  return {[member](JobConfig& c, const std::string& t) {
            T v{};
            Status s;
            if constexpr (std::is_floating_point_v<T>) s = parse_double(t, v);
            else s = parse_uint(t, v);
            if (s.ok()) c.*member = v;
            return s;
          },
          [member](const JobConfig& c) -> std::optional<std::string> {
            if (!(c.*member)) return std::nullopt;
            if constexpr (std::is_floating_point_v<T>) return number_text(*(c.*member));
            else return std::to_string(*(c.*member));
          }};
}

FieldAccess double_field(double JobConfig::*member) {
  return {[member](JobConfig& c, const std::string& t) { return parse_double(t, c.*member); },
          [member](const JobConfig& c) -> std::optional<std::string> { return number_text(c.*member); }};
}

FieldAccess string_field(std::string JobConfig::*member) {
  return {[member](JobConfig& c, const std::string& t) {
            c.*member = t;
            return Status{};
          },
          [member](const JobConfig& c) -> std::optional<std::string> { return c.*member; }};
}

// A policy's knob as a field: JobConfig::policy_options[name].
FieldAccess knob_field(const std::string& name) {
  return {[name](JobConfig& c, const std::string& t) {
            double v = 0;
            Status s = parse_double(t, v);
            if (s.ok()) c.policy_options[name] = v;
            return s;
          },
          [name](const JobConfig& c) -> std::optional<std::string> {
            const auto it = c.policy_options.find(name);
            if (it == c.policy_options.end()) return std::nullopt;
            return number_text(it->second);
          }};
}

// The fields, with every policy knob (policies/registry.hpp) after "policy".
std::vector<ConfigField> with_policy_knobs(std::vector<ConfigField> fields) {
  std::vector<ConfigField> knobs;
  for (const KnobUse& use : policy_knobs()) {
    std::string doc;
    for (const PolicyEntry* e : use.policies) {
      for (const PolicyKnob& k : e->knobs) {
        if (k.name != use.knob->name) continue;
        // Each doc starts with its policy's name ("ssp: how many ...").
        const std::string value = k.default_doc.empty() ? fmt::format("{:g}", k.default_value) : k.default_doc;
        doc += (doc.empty() ? "" : "; ") + k.doc + " (default " + value + ")";
      }
    }
    knobs.push_back({use.knob->name, doc, use.knob->metavar, knob_field(use.knob->name)});
  }
  const auto policy = std::find_if(fields.begin(), fields.end(), [](const ConfigField& f) { return f.key == "policy"; });
  fields.insert(policy + 1, knobs.begin(), knobs.end());
  return fields;
}

std::string normalize(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

Status parse_bool(const std::string& t, bool& out) {
  if (t == "true" || t == "1") out = true;
  else if (t == "false" || t == "0") out = false;
  else return Status::InvalidArgument("expected true or false");
  return {};
}

FieldAccess bool_field(bool JobConfig::*member) {
  return {[member](JobConfig& c, const std::string& t) { return parse_bool(t, c.*member); },
          [member](const JobConfig& c) -> std::optional<std::string> { return c.*member ? "true" : "false"; }};
}

// --staleness-aware-lr: true, false or unset (the default by policy).
FieldAccess staleness_aware_field() {
  return {[](JobConfig& c, const std::string& t) {
            bool on = false;
            Status s = parse_bool(t, on);
            if (s.ok()) c.staleness_aware_lr = on;
            return s;
          },
          [](const JobConfig& c) -> std::optional<std::string> {
            if (!c.staleness_aware_lr) return std::nullopt;
            return *c.staleness_aware_lr ? "true" : "false";
          }};
}

// --target-accuracy: a number or unset.
FieldAccess target_accuracy_field() {
  return {[](JobConfig& c, const std::string& t) {
            double v = 0;
            Status s = parse_double(t, v);
            if (s.ok()) c.target_accuracy = v;
            return s;
          },
          [](const JobConfig& c) -> std::optional<std::string> {
            if (!c.target_accuracy) return std::nullopt;
            return number_text(*c.target_accuracy);
          }};
}

}  // namespace

const std::vector<ConfigField>& job_config_fields() {
  static const std::vector<ConfigField> fields = with_policy_knobs({
      {"dataset", "dataset: mnist | fashion-mnist | cifar10 (default mnist)", "NAME", string_field(&JobConfig::dataset)},
      {"data-dir", "the dataset's folder (default $ASGD_DATA_DIR/NAME, else ./data/NAME)", "DIR",
       string_field(&JobConfig::data_dir)},
      {"model", "model: mlp | lenet | resnet-mini | resnet18 (default mlp)", "NAME", string_field(&JobConfig::model)},
      {"policy", "consistency policy: " + policy_spellings(" | ") + " (default async)", "NAME", string_field(&JobConfig::policy)},
      {"staleness-aware-lr",
       "async, ssp: a step over workers/2 updates stale takes the rate times workers/staleness, one over workers/4 "
       "momentum 0.5: true | false (default true, false when --lr or --momentum is given)",
       "BOOL", staleness_aware_field()},
      {"worker-weights", "per-worker batch weights: W0,W1,... or auto (measured step costs: equally long steps) (default equal)", "LIST",
       string_field(&JobConfig::worker_weights)},
      {"straggler",
       "slow workers, for experiments: W:FACTOR (every step of worker W), random:P:FACTOR (each step of every "
       "worker with chance P), pause:W:EVERY:SECONDS (worker W stalls after every EVERY-th step); "
       "combine with ','; none for none; seeded by --seed",
       "SPEC",
       string_field(&JobConfig::straggler)},
      {"augment",
       "augment training images: crop (shift by up to 1/8 of the side), flip (mirror half of them), crop,flip or none "
       "(default crop,flip for cifar10, none otherwise); seeded by --seed",
       "LIST", string_field(&JobConfig::augment)},
      {"workers", "worker actors (default 2)", "N", uint_field(&JobConfig::workers)},
      {"shards", "parameter shards (default 1)", "M", uint_field(&JobConfig::shards)},
      {"device", "where workers compute: cpu | cuda | cuda:K, or a list with one per worker (cuda:0,cpu) (default cpu)",
       "DEV", string_field(&JobConfig::device)},
      {"epochs", "passes over the training data (default 3)", "E", uint_field(&JobConfig::epochs)},
      {"batch",
       "samples per worker step (default 64; under async and ssp with more than 4 workers, 256 / workers, at least 8, "
       "unless --lr or --momentum is given)",
       "B", optional_field(&JobConfig::batch)},
      {"lr",
       "base learning rate (default 0.02; bsp, allreduce and gossip 0.02 x workers; beyond 2 workers averaging "
       "0.02 x workers / 2, async and ssp up to 0.04; easgd 0.04: the start-up line says)",
       "X",
       optional_field(&JobConfig::lr)},
      {"lr-warmup", "epochs over which the rate ramps up at the start (default 0; with more than 2 workers 0.5 "
                    "for bsp, allreduce and gossip, 1 for the others but hogwild)",
       "E", optional_field(&JobConfig::lr_warmup_epochs)},
      {"lr-schedule", "constant | cosine (decay to 0 over the job) | step (x0.1 at 50% and 75%) (default cosine)", "NAME",
       string_field(&JobConfig::lr_schedule)},
      {"optimizer", "shard optimizer: sgd | momentum | adagrad | adam (default momentum)", "NAME",
       string_field(&JobConfig::optimizer)},
      {"momentum", "momentum coefficient (default 0.9)", "X", optional_field(&JobConfig::momentum)},
      {"weight-decay", "L2 coefficient added to every gradient (default 0)", "X",
       double_field(&JobConfig::weight_decay)},
      {"seed", "seed for initialisation, validation split and shuffling (default 1)", "N",
       uint_field(&JobConfig::seed)},
      {"target-accuracy", "report the training time until validation accuracy reaches A", "A",
       target_accuracy_field()},
      {"stop-at-target",
       "true: once an evaluation finds --target-accuracy reached, stop training and test (default false)", "BOOL",
       bool_field(&JobConfig::stop_at_target)},
      {"eval-every", "also evaluate on the validation split every S seconds of training (default 0: per epoch only)",
       "S", double_field(&JobConfig::eval_every_s)},
      {"metrics-out", "write metrics as JSON Lines to FILE", "FILE", string_field(&JobConfig::metrics_out)},
      {"checkpoint-dir", "write the trained model to DIR/model.ckpt at the end (for asgd export)", "DIR",
       string_field(&JobConfig::checkpoint_dir)},
      {"checkpoint-every", "with --checkpoint-dir: shard checkpoints every S seconds, to resume from (default 30; 0: off)",
       "S", double_field(&JobConfig::checkpoint_every_s)},
      {"resume", "continue the job checkpointed in DIR (its job.toml and shard-K.ckpt files)", "DIR",
       string_field(&JobConfig::resume)},
      {"validation-size", "training images held out for validation (default 5000)", "N",
       uint_field(&JobConfig::validation_size)},
      {"threads", "compute threads per worker (default usable CPUs / workers on them)", "N", uint_field(&JobConfig::threads)},
      {"prefetch", "batches each data feeder keeps ready (default 4)", "N", uint_field(&JobConfig::prefetch)},
      {"compress", "tensors between processes: none | fp16 (default none)", "NAME", string_field(&JobConfig::compress),
       true},
      {"rpc-timeout", "seconds to wait for any reply before failing (default 60)", "S",
       double_field(&JobConfig::rpc_timeout_s)},
      {"heartbeat-timeout", "declare a process dead after S silent seconds: a worker (the job goes on), a shard, or the coordinator (the others stop) (default 10)", "S",
       double_field(&JobConfig::heartbeat_timeout_s), true},
      {"status-port", "serve /metrics, /status and a live page over HTTP on port P (default 0: off)", "P",
       uint_field(&JobConfig::status_port)},
      {"status-address", "the address the status server binds (default 127.0.0.1)", "ADDR",
       string_field(&JobConfig::status_address)},
  });
  return fields;
}

Status set_job_field(JobConfig& config, const std::string& key, const std::string& text) {
  const std::string k = normalize(key);
  const auto& fields = job_config_fields();
  auto it = std::find_if(fields.begin(), fields.end(), [&](const ConfigField& f) { return f.key == k; });
  if (it == fields.end()) {
    std::vector<std::string> keys;
    for (const ConfigField& f : fields) keys.push_back(f.key);
    const std::string best = nearest(k, keys);
    return Status::InvalidArgument("unknown setting '" + key + "'" +
                                   (best.empty() ? "" : "; did you mean '" + best + "'?"));
  }
  Status s = it->set(config, text);
  if (!s.ok()) return Status::InvalidArgument("--" + k + (text.empty() ? "" : " " + text) + ": " + s.message());
  return {};
}

namespace {

// The TOML type a field's value has: text (a name, a path, a list), a
// number or a boolean, by the field's metavar.
enum class TomlKind { text, number, boolean };

// nullopt for a key that is no setting (set_job_field says so).
std::optional<TomlKind> toml_kind(const std::string& key) {
  const auto& fields = job_config_fields();
  auto f = std::find_if(fields.begin(), fields.end(), [&](const ConfigField& c) { return c.key == normalize(key); });
  if (f == fields.end()) return std::nullopt;
  static const std::set<std::string> text = {"NAME", "DIR", "FILE", "PATH", "LIST", "SPEC", "DEV", "ADDR"};
  if (f->value_name == "BOOL") return TomlKind::boolean;
  return text.contains(f->value_name) ? TomlKind::text : TomlKind::number;
}

// Why `value` is not of `key`'s type, if it is not. A user's file gives
// numbers and booleans as such; asgd's own (job.toml, the coordinator's)
// give every value as a string, which `strict` false accepts. "" (the key
// left out) goes for any key.
std::optional<std::string> wrong_type(const std::string& key, const toml::value& value, bool strict) {
  const auto known = toml_kind(key);
  if (!known) return std::nullopt;  // set_job_field says it is not a setting ("bogus = 1" was told to quote it)
  const TomlKind kind = *known;
  if (value.is_string() && (value.as_string().str.empty() || !strict || kind == TomlKind::text)) return std::nullopt;
  if (kind == TomlKind::text && !value.is_string()) return "must be a string (in quotes)";
  if (kind == TomlKind::number && !value.is_integer() && !value.is_floating()) return "must be a number";
  if (kind == TomlKind::boolean && !value.is_boolean()) return "must be true or false";
  return std::nullopt;
}

// The settings of a parsed file, each checked (its type, its value) on a
// scratch configuration.
Result<ConfigSettings> toml_settings(const toml::value& root, const std::string& origin, bool strict) {
  if (!root.is_table()) return Status::InvalidArgument("config file " + origin + ": not a TOML table");
  // data_dir and data-dir are one key: given both, which one won depended
  // on the table's hash order.
  std::map<std::string, std::string> spelled;  // normalized key -> as written
  for (const auto& [key, value] : root.as_table())
    if (auto [at, fresh] = spelled.emplace(normalize(key), key); !fresh)
      return Status::InvalidArgument("config file " + origin + ": '" + at->second + "' and '" + key +
                                     "' are the same key, given twice");
  ConfigSettings settings;
  JobConfig scratch;
  for (const auto& [key, value] : root.as_table()) {
    if (value.is_table())
      return Status::InvalidArgument("config file " + origin + ": [" + key +
                                     "] is a table; asgd's settings are keys at the top of the file");
    if (auto why = wrong_type(key, value, strict))
      return Status::InvalidArgument("config file " + origin + ": key '" + key + "' " + *why + ", not " +
                                     toml::format(value));
    // "" is the key left out (its default, or on --resume the resumed
    // job's value), as job.toml writes an empty path: `epochs = ""` was
    // parsed as a number.
    if (value.is_string() && value.as_string().str.empty() && toml_kind(key)) continue;
    std::string text;
    if (value.is_string()) {
      text = value.as_string().str;
    } else if (value.is_boolean()) {
      text = value.as_boolean() ? "true" : "false";
    } else if (value.is_integer()) {
      // toml11 reads an integer past 64 bits as the largest (or smallest) one.
      if (const auto i = value.as_integer(); i == std::numeric_limits<std::int64_t>::max() ||
                                              i == std::numeric_limits<std::int64_t>::min())
        return Status::InvalidArgument("config file " + origin + ": key '" + key + "': the integer is out of range");
      text = std::to_string(value.as_integer());
    } else if (value.is_floating()) {
      text = number_text(value.as_floating());
    } else {
      return Status::InvalidArgument("config file " + origin + ": key '" + key +
                                     "' must be a string, a number or a boolean");
    }
    Status s = set_job_field(scratch, key, text);
    if (!s.ok()) return Status::InvalidArgument("config file " + origin + ": " + s.message());
    settings.emplace_back(normalize(key), std::move(text));
  }
  return settings;
}

Status apply_settings(const Result<ConfigSettings>& settings, JobConfig& config) {
  if (!settings) return settings.status();
  for (const auto& [key, text] : *settings)
    if (Status s = set_job_field(config, key, text); !s.ok()) return s;  // (toml_settings checked it)
  return {};
}

// toml11's message in one line of plain words: where (line and column, read
// from its source excerpt and caret) and what, with the offending line.
//   [error] bad format: unknown value appeared
//    --> job.toml
//      |
//    2 | epochs = = 3
//      |          ^--- here
std::string describe_toml_error(const std::exception& e) {
  std::istringstream in(e.what());
  std::string line, what, source, number;
  std::size_t column = 0;
  std::getline(in, what);
  if (what.rfind("[error] ", 0) == 0) what = what.substr(8);
  // toml11 names its parser function first ("toml::parse_key: ..."): not for users.
  if (what.rfind("toml::", 0) == 0 && what.find(": ") != std::string::npos) what = what.substr(what.find(": ") + 2);
  while (std::getline(in, line)) {
    const std::size_t bar = line.find(" | ");
    const std::size_t caret = line.find('^');
    if (caret != std::string::npos && line.find('|') != std::string::npos) {
      column = caret - line.find('|') - 1;
    } else if (bar != std::string::npos && line.find_first_not_of(' ') < bar) {
      number = line.substr(line.find_first_not_of(' '), bar - line.find_first_not_of(' '));
      source = line.substr(bar + 3);
    }
  }
  if (number.empty()) return what;
  return "line " + number + (column > 0 ? ", column " + std::to_string(column) : "") + ": " + what + " (`" + source +
         "`)";
}

}  // namespace

Result<ConfigSettings> read_toml_file(const std::string& path, bool written_by_asgd) {
  const PathLook file = look_at(path);
  if (file.kind == PathKind::missing) return Status::NotFound("config file " + path + " does not exist");
  if (file.kind == PathKind::unreadable)
    return Status::InvalidArgument("config file " + path + " cannot be read: " + file.error);
  // (A folder reads as a huge stream, a device as an endless one.)
  if (file.kind != PathKind::file) return Status::InvalidArgument("config file " + path + " is not a regular file");
  toml::value root;
  try {
    root = toml::parse(path);
  } catch (const std::exception& e) {
    return Status::InvalidArgument("config file " + path + ", " + describe_toml_error(e));
  }
  return toml_settings(root, path, !written_by_asgd);
}

Status apply_toml_file(const std::string& path, JobConfig& config, bool written_by_asgd) {
  return apply_settings(read_toml_file(path, written_by_asgd), config);
}

Status apply_toml_text(const std::string& text, const std::string& origin, JobConfig& config) {
  toml::value root;
  try {
    std::istringstream in(text);
    root = toml::parse(in, origin);
  } catch (const std::exception& e) {
    return Status::InvalidArgument("config " + origin + ", " + describe_toml_error(e));
  }
  return apply_settings(toml_settings(root, origin, false), config);
}

namespace {

// `key = text` as TOML: a number or boolean field's text as it is, when
// TOML reads it back as that type (set_job_field then parses the same
// text), else as a string.
std::string toml_line(const std::string& key, const std::string& text) {
  const TomlKind kind = toml_kind(key).value_or(TomlKind::text);
  const std::string bare = key + " = " + text + "\n";
  if (kind != TomlKind::text && !text.empty()) {
    try {
      std::istringstream in(bare);
      const toml::value v = toml::parse(in).at(key);
      if (kind == TomlKind::boolean ? v.is_boolean() : (v.is_integer() || v.is_floating())) return bare;
    } catch (const std::exception&) {
      // not a TOML value as it is: quoted below
    }
  }
  return key + " = " + toml::format(toml::value(text)) + "\n";
}

}  // namespace

std::string to_toml(const JobConfig& config) {
  std::string out;
  for (const ConfigField& f : job_config_fields()) {
    if (auto v = f.access.get(config)) out += toml_line(f.key, *v);
  }
  return out;
}

bool is_checkpoint_folder_file(const std::string& name) {
  return name == kJobSettingsFile || name == kCheckpointFile ||
         (name.starts_with("shard-") && (name.ends_with(".ckpt") || name.ends_with(".ckpt.claim") ||
                                         name.ends_with(".tmp")));
}

}  // namespace asgd
