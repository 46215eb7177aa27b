// `asgd train`: one job, configured by defaults, then a TOML file, then flags.

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>

#include "asgd/job.hpp"
#include "runtime/config_file.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;  // written by the signal handler only
extern "C" void on_sigint(int) { g_interrupted = 1; }

}  // namespace

int exit_code_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::invalid_argument:
    case StatusCode::not_found:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

Status setup_logging(const LogOptions& o) {
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  if (!o.log_file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(o.log_file, true));
    } catch (const spdlog::spdlog_ex& e) {
      return Status::InvalidArgument("--log-file " + o.log_file + ": " + e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("asgd", sinks.begin(), sinks.end());
  const auto level = spdlog::level::from_str(o.log_level);
  if (level == spdlog::level::off && o.log_level != "off")
    return Status::InvalidArgument("--log-level " + o.log_level + ": expected trace, debug, info, warn, error or off");
  logger->set_level(level);
  logger->set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  spdlog::set_default_logger(logger);
  return {};
}

std::optional<int> load_job(const JobOptions& o, JobConfig& config) {
  if (Status s = setup_logging(o.log); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  if (!o.config_file.empty()) {
    if (Status s = apply_toml_file(o.config_file, config); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
  }
  for (const auto& [key, opt] : o.options) {
    if (opt->count() == 0) continue;
    if (Status s = set_job_field(config, key, o.flags.at(key)); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
  }
  if (Status s = validate(config); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  const std::string dir = resolve_data_dir(config);
  if (!std::filesystem::is_directory(dir)) {
    print_error("data directory " + dir + " does not exist (set --data-dir, or ASGD_DATA_DIR to the folder holding " +
                config.dataset + "/)");
    return kExitUsage;
  }
  return std::nullopt;
}

std::string logs_at(const LogOptions& o) {
  return o.log_file.empty() ? "the log on stderr" : "the log in " + o.log_file;
}

Interrupts::Interrupts() {
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  watcher_ = std::jthread([this](std::stop_token done) {
    while (!done.stop_requested()) {
      if (g_interrupted) {
        stop_.request_stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

JobCallbacks progress_callbacks(const JobConfig& config) {
  JobCallbacks callbacks;
  callbacks.on_epoch = [epochs = config.epochs](const EpochMetrics& m) {
    std::printf("epoch %u/%u  loss %.4f  val_acc %.4f  %.0f samples/s  (%.1f s)\n", m.epoch, epochs, m.train_loss,
                m.val_accuracy, m.samples_per_s, m.wall_s);
    std::fflush(stdout);
  };
  callbacks.on_eval = [](const EvalPoint& e) {
    std::printf("  eval at %.2f s  val_acc %.4f\n", e.wall_s, e.val_accuracy);
    std::fflush(stdout);
  };
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
    print_error(code == kExitUsage ? s.message() : s.to_string() + " (details in " + logs_at(log) + ")");
    return code;
  }
  const JobSummary& sum = *result;
  std::printf("done: test accuracy %.4f, train %.1f s, wall %.1f s, %.0f samples/s, %llu updates, "
              "staleness mean %.2f p99 %.0f max %.0f\n",
              sum.final_test_accuracy, sum.train_s, sum.wall_s, sum.samples_per_s,
              static_cast<unsigned long long>(sum.updates_applied), sum.staleness_mean, sum.staleness_p99,
              sum.staleness_max);
  if (sum.time_to_target_s) std::printf("target accuracy reached after %.1f s of training\n", *sum.time_to_target_s);
  if (!config.metrics_out.empty()) std::printf("metrics: %s\n", config.metrics_out.c_str());
  return kExitOk;
}

namespace {

int run_train(const JobOptions& o) {
  JobConfig config;
  if (auto code = load_job(o, config)) return *code;
  const std::string dir = resolve_data_dir(config);
  auto plural = [](std::uint32_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); };
  std::printf("asgd train: %s on %s, policy %s, %s, %s, %s, batch %u, lr %g (data: %s)\n", config.model.c_str(),
              config.dataset.c_str(), config.policy.c_str(), plural(config.workers, "worker").c_str(),
              plural(config.shards, "shard").c_str(), plural(config.epochs, "epoch").c_str(), config.batch, config.lr,
              dir.c_str());
  std::fflush(stdout);

  Interrupts interrupts;
  auto result = run_job(config, progress_callbacks(config), interrupts.token());
  return report_outcome(result, config, o.log);
}

}  // namespace

void print_error(const std::string& message) {
  std::string line = message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::fprintf(stderr, "asgd: error: %s\n", line.c_str());
}

void add_log_flags(CLI::App* cmd, LogOptions& log) {
  cmd->add_option("--log-file", log.log_file, "also write the log to FILE")->type_name("FILE");
  cmd->add_option("--log-level", log.log_level, "trace | debug | info | warn | error | off (default info)")
      ->type_name("LEVEL");
}

void add_job_flags(CLI::App* cmd, JobOptions& opts) {
  cmd->add_option("--config", opts.config_file, "TOML file with job settings (flags override it)")->type_name("FILE");
  for (const ConfigField& f : job_config_fields()) {
    opts.options[f.key] = cmd->add_option("--" + f.key, opts.flags[f.key], f.help)->type_name(f.value_name);
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
  add_job_flags(cmd, *opts);
  return [opts] { return run_train(*opts); };
}

}  // namespace asgd::cli
