// `asgd train`: one job, configured by defaults, then a TOML file, then flags.

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <mutex>
#include <optional>
#include <cstdio>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "actors/checkpoint_claim.hpp"
#include "actors/parameter_shard.hpp"
#include "asgd/job.hpp"
#include "base/log.hpp"
#include "base/paths.hpp"
#include "dataset/augment.hpp"
#include "policies/registry.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"
#include "runtime/launcher.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

Status setup_logging(const LogOptions& o) {
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  if (!o.log_file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(o.log_file, true));
    } catch (const spdlog::spdlog_ex& e) {
      return Status::InvalidArgument("--log-file " + o.log_file + ": " + e.what());
    }
  }
  const auto level = spdlog::level::from_str(o.log_level);
  if (level == spdlog::level::off && o.log_level != "off")
    return Status::InvalidArgument("--log-level " + o.log_level + ": expected trace, debug, info, warn, error or off");
  replace_log_sinks(std::move(sinks));
  logger().set_level(level);
  logger().set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  // Each line reaches the file as it is logged (a `tail -f` sees it, a
  // killed process loses none), and a file that cannot be written (a full
  // disk) is said once on stderr instead of nowhere.
  logger().flush_on(spdlog::level::trace);
  logger().set_error_handler([file = o.log_file](const std::string& what) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr, "asgd: warning: --log-file %s: %s; its later lines may be missing\n", file.c_str(),
                   what.c_str());
  });
  return {};
}

namespace {

// A job.toml that ends with its end line (one cut short lost settings).
Status whole_settings_file(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  if (last != kJobSettingsEnd)
    return Status::Corruption(path + " is cut short (its last line is not '" + kJobSettingsEnd +
                              "'): its settings cannot be trusted");
  return {};
}

// What the checkpoints were cut by: each worker's steps of its batch (or
// batch weights), and the model's parameters into shards. Another value
// than the resumed job's would skip or repeat epochs, or not fit.
Status same_checkpointed_layout(const JobConfig& resumed, const JobConfig& now) {
  auto refuse = [](const std::string& flag, const std::string& was, const std::string& why) {
    return Status::InvalidArgument("the checkpointed job's " + flag + " (" + was + ") cannot change: " + why);
  };
  if (now.batch != resumed.batch)
    return refuse("--batch", resumed.batch ? std::to_string(*resumed.batch) : "the default",
                  "its checkpoints count steps of that size");
  if (now.worker_weights != resumed.worker_weights)
    return refuse("--worker-weights", resumed.worker_weights.empty() ? "equal" : resumed.worker_weights,
                  "its checkpoints count steps of those sizes");
  if (now.model != resumed.model) return refuse("--model", resumed.model, "its checkpoints hold that model's parameters");
  if (now.dataset != resumed.dataset)
    return refuse("--dataset", resumed.dataset, "its epochs are of that dataset's training set");
  if (now.validation_size != resumed.validation_size)
    return refuse("--validation-size", std::to_string(resumed.validation_size),
                  "its epochs are of the training set that leaves");
  // The seed draws the validation split: another would train the resumed
  // epochs on images the job validated on, and validate on trained ones.
  if (now.seed != resumed.seed && now.validation_size > 0)
    return refuse("--seed", std::to_string(resumed.seed),
                  "it chose the " + std::to_string(resumed.validation_size) +
                      " training images held out for validation");
  if (now.shards != resumed.shards)
    return refuse("--shards", std::to_string(resumed.shards), "its checkpoints hold the parameters cut that many ways");
  // (asgd cluster found out only once every process had started: seven
  // lines of errors, where this says it before any starts.)
  if (now.workers != resumed.workers)
    return refuse("--workers", std::to_string(resumed.workers), "its checkpoints count each worker's steps");
  return {};
}

// --resume DIR: the checkpointed job's own settings (DIR/job.toml) come
// first; a config file and flags may still change some (more epochs, a
// new metrics file).
Status apply_resumed_settings(const std::string& dir, JobConfig& config) {
  if (const PathLook folder = look_at(dir); folder.kind == PathKind::missing)
    return Status::InvalidArgument("--resume " + dir + ": does not exist (give the job's --checkpoint-dir)");
  else if (folder.kind != PathKind::folder && folder.kind != PathKind::unreadable)
    return Status::InvalidArgument("--resume " + dir + ": not a folder (give the job's --checkpoint-dir)");
  const std::string saved = (std::filesystem::path(dir) / kJobSettingsFile).string();
  if (const PathLook look = look_at(saved); look.kind == PathKind::missing)
    return Status::InvalidArgument("--resume " + dir + ": no " + kJobSettingsFile +
                                   " there (was the job run with --checkpoint-dir and --checkpoint-every?)");
  else if (look.kind == PathKind::unreadable)
    return Status::InvalidArgument("--resume " + dir + ": cannot read " + saved + ": " + look.error);
  if (Status s = whole_settings_file(saved); !s.ok()) return Status::InvalidArgument("--resume " + dir + ": " + s.message());
  return apply_toml_file(saved, config, /*written_by_asgd=*/true);
}

// The resumed job's shard checkpoints as files, checked in this process
// before anything starts: a damaged one was said by every process of a
// cluster (nine times, each with its exit status). Whether they are this
// job's (missing ones included) the job's plan says (plan_resume).
Status readable_shard_checkpoints(const std::string& dir, std::uint32_t shards) {
  for (std::uint32_t k = 0; k < shards; ++k) {
    const std::string path = shard_checkpoint_path(dir, k);
    auto saved = ShardCore::saved(path);
    if (!saved && saved.status().code() != StatusCode::not_found) return saved.status();
    if (Status s = saved ? claimable(path) : Status{}; !s.ok()) return s;
  }
  return {};
}

}  // namespace

std::optional<int> refuse_missing_data(const JobConfig& config) {
  const std::string dir = resolve_data_dir(config);
  const PathLook look = look_at(dir);
  if (look.kind == PathKind::folder) return std::nullopt;
  std::string what = look.kind == PathKind::missing      ? "does not exist"
                     : look.kind == PathKind::unreadable ? "cannot be read (" + look.error + ")"
                                                         : "is not a folder";
  // A path under a file "did not exist": say which part is the file.
  for (std::filesystem::path up = std::filesystem::path(dir).parent_path(); !up.empty() && up != up.parent_path();
       up = up.parent_path())
    if (look_at(up).kind == PathKind::file) {
      what = "cannot be: " + up.string() + " is a file";
      break;
    }
  print_error("data directory " + dir + " " + what + " (set --data-dir, or ASGD_DATA_DIR to the folder holding " +
              config.dataset + "/; asgd data fetch " + config.dataset + " downloads it there)");
  return kExitUsage;
}

namespace {

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !a.empty() && !b.empty() && std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

// Why the job's log or metrics file would write over another file given:
// the --config file (overwritten with JSON lines, exit 0) or each other.
// `metrics_out` is the flag's, else the config file's.
std::optional<std::string> overwriting(const std::string& log_file, const std::string& metrics_out,
                                       const std::string& config_file) {
  for (const auto& [flag, path] : {std::pair{"--metrics-out", metrics_out}, {"--log-file", log_file}})
    if (same_file(path, config_file)) return std::string(flag) + " " + path + ": is the --config file; give another file";
  if (same_file(log_file, metrics_out))
    return "--log-file " + log_file + ": is the --metrics-out file too; give each its own";
  return std::nullopt;
}

bool flag_given(const JobOptions& o, const std::string& key) {
  const auto flag = o.options.find(key);
  return flag != o.options.end() && flag->second->count() > 0;
}

// Settings an earlier asgd took that this one refuses, in a resumed job's
// job.toml: dropped with a word (a resume of such a job was refused, with
// no flag to clear them), the defaults they changed kept as they ran.
void forget_settings_no_longer_taken(JobConfig& config, const std::string& dir) {
  const bool stale_steps = takes_staleness_aware_lr(config.policy);
  if (config.momentum && config.optimizer != "momentum") {
    const TrainingSettings ran = training_settings(config);  // with the momentum counted as given
    if (!config.lr) config.lr = ran.lr;
    if (!config.lr_warmup_epochs) config.lr_warmup_epochs = ran.lr_warmup_epochs;
    if (!config.staleness_aware_lr && stale_steps) config.staleness_aware_lr = false;
    logger().warn("--resume {}: its job.toml gives --momentum {:g}, which --optimizer {} has no use for: dropped",
                  dir, *config.momentum, config.optimizer);
    config.momentum.reset();
  }
  if (config.prefetch > kMaxPrefetch) {
    logger().warn("--resume {}: its job.toml gives --prefetch {}, more than the {} taken now: {}", dir, config.prefetch,
                  kMaxPrefetch, kMaxPrefetch);
    config.prefetch = kMaxPrefetch;
  }
  if (config.staleness_aware_lr && !stale_steps) {
    logger().warn("--resume {}: its job.toml gives --staleness-aware-lr, which --policy {} has no use for: dropped",
                  dir, config.policy);
    config.staleness_aware_lr.reset();
  }
}

// Before the log file is emptied as logging starts: the log or metrics
// file must not be the config file or each other, nor the log one of a
// checkpoint folder's files (`--log-file DIR/job.toml` on a resume emptied
// the settings it was to resume). An exit code, else nothing.
std::optional<int> start_logging(const JobOptions& o, const ConfigSettings& from_file) {
  if (const std::string name = std::filesystem::path(o.log.log_file).filename().string();
      !name.empty() && is_checkpoint_folder_file(name)) {
    print_error("--log-file " + o.log.log_file + ": " + name +
                " is the name of a checkpoint folder's file (a job writes it, or --resume reads it); give another name");
    return kExitUsage;
  }
  std::string metrics_out;
  for (const auto& [key, text] : from_file)
    if (key == "metrics-out") metrics_out = text;
  if (flag_given(o, "metrics-out")) metrics_out = o.flags.at("metrics-out");
  if (auto why = overwriting(o.log.log_file, metrics_out, o.config_file)) {
    print_error(*why);
    return kExitUsage;
  }
  if (Status s = setup_logging(o.log); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  return std::nullopt;
}

// The file's settings, then the flags', onto `config`.
Status apply_given(const JobOptions& o, const ConfigSettings& from_file, JobConfig& config) {
  for (const auto& [key, text] : from_file)
    if (Status s = set_job_field(config, key, text); !s.ok())
      return Status::InvalidArgument("config file " + o.config_file + ": " + s.message());
  for (const auto& [key, opt] : o.options)
    if (opt->count() > 0)
      if (Status s = set_job_field(config, key, o.flags.at(key)); !s.ok()) return s;
  return {};
}

// Resumed under another policy: the settings of the old one go unless
// given now (async's --push-every refused the bsp the docs allow).
void drop_resumed_policy_settings(const JobOptions& o, const ConfigSettings& from_file, JobConfig& config) {
  std::set<std::string> given;
  for (const auto& [key, text] : from_file) given.insert(key);
  for (const auto& [key, opt] : o.options)
    if (opt->count() > 0) given.insert(key);
  std::erase_if(config.policy_options, [&](const auto& knob) { return !given.contains(knob.first); });
  if (!given.contains("staleness-aware-lr")) config.staleness_aware_lr.reset();
}

// "config file F: " when `message` names (--KEY followed by a space or a
// colon) a key the file gave and no flag did: its range errors read
// "--lr -0.5: must be ...", its type errors named the file.
std::string from_the_file(const JobOptions& o, const ConfigSettings& from_file, const std::string& message) {
  for (const auto& [key, text] : from_file) {
    const std::string named = "--" + key;
    for (std::size_t at = message.find(named); !flag_given(o, key) && at != std::string::npos;
         at = message.find(named, at + 1))
      if (const std::size_t end = at + named.size();
          end == message.size() || message[end] == ' ' || message[end] == ':')
        return "config file " + o.config_file + ": ";
  }
  return "";
}

}  // namespace

std::optional<int> load_job(const JobOptions& o, JobConfig& config, bool devices_here, bool data_here) {
  // The config file's settings, read first: its `resume` resumes as the
  // flag does (the checkpointed job's settings under the file's).
  auto read = o.config_settings  ? Result<ConfigSettings>(*o.config_settings)
              : o.config_file.empty() ? Result<ConfigSettings>(ConfigSettings{})
                                      : read_toml_file(o.config_file);
  if (!read) {
    print_error(read.status().message());
    return kExitUsage;
  }
  const ConfigSettings& from_file = *read;
  if (auto code = start_logging(o, from_file)) return code;
  std::string resume_dir;
  if (auto r = o.options.find("resume"); r != o.options.end()) {
    if (r->second->count() > 0) resume_dir = o.flags.at("resume");
    for (const auto& [key, text] : from_file)
      if (key == "resume" && resume_dir.empty()) resume_dir = text;
  }
  std::optional<JobConfig> resumed;  // the checkpointed job's settings
  if (!resume_dir.empty()) {
    if (Status s = apply_resumed_settings(resume_dir, config); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
    forget_settings_no_longer_taken(config, resume_dir);
    resumed = config;
    // The resumed folder is where the job goes on checkpointing, wherever
    // it was first written from (a --checkpoint-dir flag may still say
    // otherwise).
    config.checkpoint_dir = std::filesystem::absolute(resume_dir).lexically_normal().string();
  }
  if (Status s = apply_given(o, from_file, config); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  if (resumed && config.policy != resumed->policy) drop_resumed_policy_settings(o, from_file, config);
  if (Status s = resumed ? same_checkpointed_layout(*resumed, config) : Status{}; !s.ok()) {
    print_error("--resume " + resume_dir + ": " + s.message());
    return kExitUsage;
  }
  // An interval with nowhere to write was taken without a word. (The flag:
  // a settings file written by asgd holds every key, this one too.)
  if (flag_given(o, "checkpoint-every") && config.checkpoint_dir.empty()) {
    print_error("--checkpoint-every: applies with --checkpoint-dir (where the checkpoints go); give both");
    return kExitUsage;
  }
  if (Status s = resumed ? readable_shard_checkpoints(resume_dir, config.shards) : Status{}; !s.ok()) {
    print_error("--resume " + resume_dir + ": " + s.message());
    return kExitUsage;
  }
  if (Status s = validate_settings(config, devices_here); !s.ok()) {
    print_error(from_the_file(o, from_file, s.message()) + s.message());
    return kExitUsage;
  }
  if (auto why = overwriting(o.log.log_file, config.metrics_out, o.config_file)) {  // a resumed job's metrics file
    print_error(*why);
    return kExitUsage;
  }
  // Where this process writes it: before anything starts (not a job later).
  if (Status s = data_here ? writable_file(config.metrics_out) : Status{}; !s.ok()) {
    print_error("--metrics-out " + config.metrics_out + ": " + s.message());
    return kExitUsage;
  }
  return data_here ? refuse_missing_data(config) : std::nullopt;
}

std::string logs_at(const LogOptions& o) {
  return o.log_file.empty() ? "the log on stderr" : "the log in " + o.log_file;
}

namespace {

std::string clock_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string rate_text(double per_s) {
  char buf[32];
  if (per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", per_s / 1e6);
  else if (per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", per_s);
  return buf;
}

// Progress on stdout. On a terminal: one bar line redrawn in place, with
// the epoch and eval lines printed above it as they come. Otherwise plain
// lines: the epoch and eval lines, and a progress line every kPlainEvery.
class ProgressDisplay {
 public:
  ProgressDisplay(std::uint32_t epochs, bool plain)
      : epochs_(epochs), tty_(!plain && ::isatty(STDOUT_FILENO) == 1) {}

  void epoch(const EpochMetrics& m) {
    std::lock_guard lock(mu_);
    clear_bar();
    std::printf("epoch %u/%u  loss %.4f  val_acc %.4f  %.0f samples/s  (%.1f s)\n", m.epoch, epochs_, m.train_loss,
                m.val_accuracy, m.samples_per_s, m.wall_s);
    redraw();
  }

  void eval(const EvalPoint& e) {
    std::lock_guard lock(mu_);
    clear_bar();
    std::printf("  eval at %.2f s  val_acc %.4f\n", e.wall_s, e.val_accuracy);
    redraw();
  }

  void progress(const Progress& p) {
    std::lock_guard lock(mu_);
    last_ = p;
    if (tty_) {
      redraw();
    } else if (p.wall_s - last_plain_s_ >= kPlainEvery) {
      last_plain_s_ = p.wall_s;
      std::printf("progress %s\n", summary(p).c_str());
      std::fflush(stdout);
    }
  }

  ~ProgressDisplay() {
    std::lock_guard lock(mu_);
    clear_bar();
  }

 private:
  static constexpr double kPlainEvery = 10.0;

  std::string summary(const Progress& p) const {
    const double done = p.total_samples ? static_cast<double>(p.samples) / static_cast<double>(p.total_samples) : 0.0;
    std::string s = fmt::format("{:3.0f}%  epoch {}/{}", 100.0 * std::min(done, 1.0), p.epoch, p.epochs);
    s += "  ETA " + (p.eta_s ? clock_text(*p.eta_s) : std::string("?"));
    if (std::isfinite(p.train_loss)) s += fmt::format("  loss {:.4f}", p.train_loss);
    if (p.val_accuracy) s += fmt::format("  acc {:.4f}", *p.val_accuracy);
    s += "  " + rate_text(p.samples_per_s) + " samples/s";
    return s;
  }

  void redraw() {
    if (!tty_ || !last_) {
      std::fflush(stdout);
      return;
    }
    const Progress& p = *last_;
    const double done = p.total_samples ? static_cast<double>(p.samples) / static_cast<double>(p.total_samples) : 0.0;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(std::min(done, 1.0) * kWidth);
    const std::string bar = "[" + std::string(static_cast<std::size_t>(filled), '#') +
                            std::string(static_cast<std::size_t>(kWidth - filled), '.') + "] ";
    std::printf("\r\x1b[2K%s%s", bar.c_str(), summary(p).c_str());
    drawn_ = true;
    std::fflush(stdout);
  }

  void clear_bar() {
    if (drawn_) std::printf("\r\x1b[2K");
    drawn_ = false;
  }

  std::mutex mu_;
  std::uint32_t epochs_;
  bool tty_;
  bool drawn_ = false;
  std::optional<Progress> last_;
  double last_plain_s_ = 0.0;
};

}  // namespace

JobCallbacks progress_callbacks(const JobConfig& config, bool plain) {
  auto display = std::make_shared<ProgressDisplay>(config.epochs, plain);
  JobCallbacks callbacks;
  callbacks.on_epoch = [display](const EpochMetrics& m) { display->epoch(m); };
  callbacks.on_eval = [display](const EvalPoint& e) { display->eval(e); };
  callbacks.on_progress = [display](const Progress& p) { display->progress(p); };
  return callbacks;
}

int report_outcome(const Result<JobSummary>& result, const JobConfig& config, const LogOptions& log) {
  if (!result) {
    const Status& s = result.status();
    if (s.code() == StatusCode::cancelled) {
      print_error("interrupted; the job was stopped before its end");
      return kExitFailure;
    }
    const int code = exit_code_for(s);
    print_error(code == kExitUsage ? error_text(s) : error_text(s) + " (details in " + logs_at(log) + ")");
    return code;
  }
  const JobSummary& sum = *result;
  std::printf("done: test accuracy %.4f, train %.1f s, wall %.1f s, %.0f samples/s, %llu updates, "
              "staleness mean %.2f p99 %.0f max %.0f\n",
              sum.final_test_accuracy, sum.train_s, sum.wall_s, sum.samples_per_s,
              static_cast<unsigned long long>(sum.updates_applied), sum.staleness_mean, sum.staleness_p99,
              sum.staleness_max);
  if (sum.time_to_target_s)
    std::printf("target accuracy reached after %.1f s of training%s\n", *sum.time_to_target_s,
                sum.stopped_at_target ? "; training stopped there (--stop-at-target)" : "");
  if (!config.metrics_out.empty()) std::printf("metrics: %s\n", config.metrics_out.c_str());
  return kExitOk;
}

void print_job_heading(const char* command, const JobConfig& config, Placement placement) {
  auto plural = [](std::uint32_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); };
  const TrainingSettings training = training_settings(config, placement);
  const auto augment = data::parse_augment(config.augment, config.dataset);  // validated by load_job
  const std::string augmented = augment && augment->any() ? ", augment " + data::to_string(*augment) : "";
  std::printf("asgd %s: %s on %s, policy %s, %s, %s, %s, batch %u, lr %g%s (data: %s)\n", command,
              config.model.c_str(), config.dataset.c_str(), config.policy.c_str(),
              plural(config.workers, "worker").c_str(), plural(config.shards, "shard").c_str(),
              plural(config.epochs, "epoch").c_str(), training.batch, training.lr, augmented.c_str(),
              resolve_data_dir(config).c_str());
  if (training.adjusted.empty()) return;
  std::string line;
  for (const auto& a : training.adjusted) line += (line.empty() ? "" : "; ") + a;
  // (Each adjustment names a flag: --batch, --local-steps and --moving-rate
  // were left out of a list here.)
  std::printf("defaults adjusted for this policy and worker count (set --lr, --momentum, --batch, --lr-warmup, "
              "--staleness-aware-lr, --local-steps or --moving-rate to choose): %s\n",
              line.c_str());
}

namespace {

int run_train(const JobOptions& o) {
  JobConfig config;
  if (auto code = load_job(o, config)) return *code;
  print_job_heading("train", config, Placement::one_process);
  if (config.compress != "none")
    logger().warn("--compress {} applies across processes (asgd cluster): in one process nothing goes over a wire",
                  config.compress);
  // srun -n 4 asgd train: four whole jobs, side by side, said once (rank 0).
  if (auto launch = detect_launch(process_environment(), "auto"); launch && launch->world_size > 1 && launch->rank == 0)
    logger().warn("asgd train runs a whole job in each of the {} ranks {} started; asgd cluster spreads one job "
                  "over them",
                  launch->world_size, to_string(launch->kind));
  std::fflush(stdout);

  Interrupts interrupts;
  auto result = run_job(config, progress_callbacks(config), interrupts.token());
  return report_outcome(result, config, o.log);
}

}  // namespace

void add_log_flags(CLI::App* cmd, LogOptions& log) {
  cmd->add_option("--log-file", log.log_file, "also write the log to FILE")->type_name("FILE");
  cmd->add_option("--log-level", log.log_level, "trace | debug | info | warn | error | off (default info)")
      ->type_name("LEVEL");
}

void add_job_flags(CLI::App* cmd, JobOptions& opts, bool one_process) {
  cmd->add_option("--config", opts.config_file, "TOML file with job settings (flags override it)")->type_name("FILE");
  for (const ConfigField& f : job_config_fields()) {
    auto* o = cmd->add_option("--" + f.key, opts.flags[f.key], f.help)->type_name(f.value_name);
    if (one_process && f.across_processes)
      o->group("Across processes (asgd cluster; accepted here so one config file serves both)");
    opts.options[f.key] = o;
  }
  add_log_flags(cmd, opts.log);
}

std::vector<std::string> given_job_flags(const JobOptions& o) {
  std::vector<std::string> args;
  if (!o.config_file.empty()) args.insert(args.end(), {"--config", o.config_file});
  for (const auto& [key, opt] : o.options)
    if (opt->count() > 0) args.insert(args.end(), {"--" + key, o.flags.at(key)});
  if (!o.log.log_level.empty()) args.insert(args.end(), {"--log-level", o.log.log_level});
  return args;
}

std::function<int()> add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "run one training job in this process (no flags: the embedded default)");
  auto opts = std::make_shared<JobOptions>();
  add_job_flags(cmd, *opts, true);
  return [opts] { return run_train(*opts); };
}

}  // namespace asgd::cli
