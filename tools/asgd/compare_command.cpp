// `asgd compare`: the same job under each policy (and worker count), each
// repeated with seeds seed, seed+1, ..., run one after another in this
// process (or, --processes, each as processes on this machine:
// compare_processes.cpp); results.csv, curves.csv, report.html and
// runs/*.jsonl in --out.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "asgd/job.hpp"
#include "base/cpus.hpp"
#include "base/folder_lock.hpp"
#include "experiments/compare.hpp"
#include "experiments/report.hpp"
#include "policies/registry.hpp"
#include "runtime/cluster.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

namespace fs = std::filesystem;
using experiments::RunRecord;

struct CompareOptions {
  JobOptions job;
  std::string policies;
  std::uint32_t repeats = 1;
  std::string out;
  bool processes = false;  ///< each run as asgd cluster (a process per role) instead of in this process
};

// Where the timings came from, for the report: "2 CPU cores (Intel Xeon
// ...)", or "1 usable CPU of 2 cores (...)" where a binding or a control
// group's limit leaves the runs fewer than the host has.
std::string host_description() {
  std::string model;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; model.empty() && std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos) model = line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  const unsigned cores = std::thread::hardware_concurrency();
  const unsigned usable = usable_cpus();
  std::string out = cores ? std::to_string(cores) + (cores == 1 ? " CPU core" : " CPU cores") : "CPU cores unknown";
  if (cores && usable < cores) out = std::to_string(usable) + (usable == 1 ? " usable CPU of " : " usable CPUs of ") + out;
  if (!model.empty()) out += " (" + model + ")";
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,:/=+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The command as given, for the report's header.
std::string command_line(const CompareOptions& o) {
  std::string out = "asgd compare --policies " + shell_quote(o.policies) + " --repeats " + std::to_string(o.repeats) +
                    " --out " + shell_quote(o.out) + (o.processes ? " --processes" : "");
  if (!o.job.config_file.empty()) out += " --config " + shell_quote(o.job.config_file);
  for (const auto& [key, opt] : o.job.options)
    if (opt->count() > 0) out += " --" + key + " " + shell_quote(o.job.flags.at(key));
  return out;
}

class Outputs {
 public:
  Outputs(const fs::path& dir, experiments::ReportInput report) : dir_(dir), report_(std::move(report)) {}

  experiments::ReportInput& report() { return report_; }

  /// Rewrites results.csv, curves.csv and report.html from the runs so far.
  Status write() {
    auto& r = report_;
    r.target = experiments::choose_target(r.runs, r.config.target_accuracy);
    r.generated_at = utc_now();
    if (Status s = experiments::write_file((dir_ / "results.csv").string(), experiments::results_csv(r.runs, r.target));
        !s.ok())
      return s;
    if (Status s = experiments::write_file((dir_ / "curves.csv").string(), experiments::curves_csv(r.runs)); !s.ok())
      return s;
    return experiments::write_file((dir_ / "report.html").string(), experiments::report_html(r));
  }

 private:
  fs::path dir_;
  experiments::ReportInput report_;
};

// What each finished run prints: one line.
void print_run(std::size_t done, std::size_t total, const RunRecord& r) {
  double best = 0.0;
  for (const auto& p : r.curve) best = std::max(best, p.val_accuracy);
  const JobSummary& s = r.summary;
  std::printf("[%zu/%zu] %-14s seed %llu  test acc %.4f  best val %.4f  train %.2f s  %.0f samples/s  "
              "staleness mean %.2f max %.0f\n",
              done, total, experiments::run_id(r).c_str(), static_cast<unsigned long long>(r.seed),
              s.final_test_accuracy, best, s.train_s, s.samples_per_s, s.staleness_mean, s.staleness_max);
  std::fflush(stdout);
}

void print_summary(const experiments::ReportInput& in) {
  if (in.target)
    std::printf("target: validation accuracy >= %g (%s)\n", in.target->accuracy,
                in.target->given ? "--target-accuracy" : "the highest every run reached");
  const bool multi = in.workers.size() > 1;
  for (const auto& g : experiments::group_stats(in.runs, in.policies, in.target)) {
    const std::string name = multi ? g.policy + " x" + std::to_string(g.workers) : g.policy;
    if (g.time_to_target_s)
      std::printf("%-12s time to target %.2f s (min %.2f, max %.2f; %zu of %zu reached)", name.c_str(),
                  g.time_to_target_s->mean, g.time_to_target_s->min, g.time_to_target_s->max, g.reached, g.runs);
    else
      std::printf("%-12s time to target: not reached", name.c_str());
    std::printf("  test acc %.4f (%.4f-%.4f)  %.0f samples/s\n", g.final_test_accuracy.mean,
                g.final_test_accuracy.min, g.final_test_accuracy.max, g.samples_per_s.mean);
  }
  for (const auto& row : experiments::scaling_rows(experiments::group_stats(in.runs, in.policies, in.target)))
    std::printf("%-12s %u worker%s: speedup %.2fx, efficiency %.0f%% (%s, against %u)\n", row.policy.c_str(),
                row.workers, row.workers == 1 ? "" : "s", row.speedup, 100.0 * row.efficiency, row.measure.c_str(),
                row.base_workers);
}

// What a comparison runs: the shared job, each policy and worker count.
struct Comparison {
  JobConfig base;
  std::vector<std::string> policies;
  std::vector<std::uint32_t> worker_counts;
  std::string workers_text;  ///< --workers as given; empty when not
};

// The flags compare refuses: an exit code, or nothing when they are fine.
std::optional<int> refused_flags(const CompareOptions& o) {
  if (o.repeats == 0) {
    print_error("--repeats 0: expected a whole number >= 1");
    return kExitUsage;
  }
  if (o.job.options.at("metrics-out")->count() > 0) {
    print_error("--metrics-out " + o.job.flags.at("metrics-out") +
                ": compare writes one metrics file per run, to DIR/runs/<run>.jsonl; leave the flag out");
    return kExitUsage;
  }
  if (o.job.options.at("policy")->count() > 0) {
    print_error("--policy " + o.job.flags.at("policy") + ": compare runs each policy of --policies; leave --policy out");
    return kExitUsage;
  }
  if (o.job.options.at("resume")->count() > 0) {
    print_error("--resume " + o.job.flags.at("resume") +
                ": compare starts every run from the beginning, under its own policy; resume one job with asgd train "
                "--resume");
    return kExitUsage;
  }
  return std::nullopt;
}

// Two entries that name one policy with the same settings here ("ssp" and
// "ssp:3", "ssp:2" and "ssp:02"): an exit code, else nothing.
std::optional<int> refused_same_policies(const std::string& text, const Comparison& c) {
  std::vector<std::pair<std::string, PolicyOptions>> seen;
  for (const std::string& p : c.policies) {
    const JobConfig run = experiments::config_for_run(c.base, p, c.worker_counts.front(), 0);
    auto options = resolve_policy_options(PolicyConfig{run.policy, run.policy_options});
    if (!options) continue;  // validate() said why already
    const std::string name = p.substr(0, p.find(':'));
    for (const auto& [other, other_options] : seen)
      if (other.substr(0, other.find(':')) == name && other_options == *options) {
        print_error("--policies " + text + ": '" + other + "' and '" + p + "' are the same policy with the same settings");
        return kExitUsage;
      }
    seen.emplace_back(p, std::move(*options));
  }
  return std::nullopt;
}

// A policy's setting that no policy of the list takes: each run drops the
// settings of other policies, so it had no effect, exit 0. An exit code,
// else nothing.
std::optional<int> refused_settings_no_run_takes(const std::string& text, const Comparison& c) {
  auto taken = [&](auto&& takes) {
    return std::any_of(c.policies.begin(), c.policies.end(), [&](const std::string& p) {
      return takes(experiments::config_for_run(c.base, p, c.worker_counts.front(), 0));
    });
  };
  for (const auto& [name, value] : c.base.policy_options)
    if (!taken([&](const JobConfig& run) { return run.policy_options.contains(name); })) {
      std::string takers;
      for (const KnobUse& use : policy_knobs())
        if (use.knob->name == name)
          for (const PolicyEntry* e : use.policies) takers += (takers.empty() ? "" : ", ") + e->name;
      print_error("--" + name + ": applies to --policy " + takers + " only, and --policies " + text + " has none of them");
      return kExitUsage;
    }
  if (c.base.staleness_aware_lr && !taken([](const JobConfig& run) { return run.staleness_aware_lr.has_value(); })) {
    print_error("--staleness-aware-lr: applies to --policy async and ssp only, and --policies " + text +
                " has neither");
    return kExitUsage;
  }
  return std::nullopt;
}

// What compare sets apart from the shared job, for each run to set on its own.
struct SetApart {
  ConfigSettings file;  ///< the --config file's settings
  bool workers_given = false;  ///< --workers, a list (c.workers_text)
  std::string devices;  ///< a --device list: each run takes its first items
  std::vector<std::pair<std::string, std::string>> per_policy;  ///< a policy's own settings, from a flag or the file
  std::optional<std::string> in_file(const std::string& key) const {
    for (const auto& [k, text] : file)
      if (k == key) return text;
    return std::nullopt;
  }
};

// The job's options less what compare sets apart (`apart`, and the
// --workers list in c.workers_text), from the flags and the config file
// alike: one of its settings may be given in either.
Result<JobOptions> shared_job_options(const CompareOptions& o, Comparison& c, SetApart& apart) {
  if (!o.job.config_file.empty()) {
    auto read = read_toml_file(o.job.config_file);
    if (!read) return read.status();
    apart.file = std::move(read).value();
  }
  // Given in the file, --resume would continue a job's checkpoint in every run.
  if (auto dir = apart.in_file("resume"))
    return Status::InvalidArgument("config file " + o.job.config_file + ": resume = " + *dir +
                                   ": compare starts every run from the beginning, under its own policy; resume one "
                                   "job with asgd train --resume");
  JobOptions job = o.job;
  std::set<std::string> file_keys_apart;  // the file's keys the runs set, left out of the shared job
  if (auto policy = apart.in_file("policy")) {
    std::printf("note: policy %s from %s is replaced by each policy of --policies\n", policy->c_str(),
                o.job.config_file.c_str());
    file_keys_apart.insert("policy");
  }
  // --workers may list several counts here; every run gets one of them.
  apart.workers_given = job.options.at("workers")->count() > 0;
  if (apart.workers_given) c.workers_text = job.flags.at("workers");
  job.options.erase("workers");
  // So may --device: each run takes the first of its items, one per worker
  // (checked per run below).
  apart.devices = job.options.at("device")->count() > 0 ? job.flags.at("device") : apart.in_file("device").value_or("");
  if (apart.devices.find(',') != std::string::npos) {
    job.options.erase("device");
    file_keys_apart.insert("device");
  } else {
    apart.devices.clear();
  }
  // Settings of one policy (--staleness for ssp, ...) would fail the shared
  // job's check under the default policy: they are set after it, from the
  // flag or else the file, and each run keeps those of its own policy
  // (config_for_run).
  std::vector<std::string> keys{"staleness-aware-lr"};
  for (const KnobUse& use : policy_knobs()) keys.push_back(use.knob->name);
  for (const std::string& key : keys) {
    if (job.options.at(key)->count() > 0) apart.per_policy.emplace_back(key, job.flags.at(key));
    else if (auto text = apart.in_file(key)) apart.per_policy.emplace_back(key, *text);
    job.options.erase(key);
    file_keys_apart.insert(key);
  }
  // The file read once: load_job takes the rest from here.
  job.config_settings.emplace();
  for (const auto& setting : apart.file)
    if (!file_keys_apart.contains(setting.first)) job.config_settings->push_back(setting);
  return job;
}

// Reads the shared job and the lists into `c`: an exit code when they are
// not valid, else nothing.
std::optional<int> plan_comparison(const CompareOptions& o, Comparison& c) {
  auto policies = experiments::parse_policy_list(o.policies);
  if (!policies) {
    print_error(policies.status().message());
    return kExitUsage;
  }
  c.policies = *policies;
  SetApart apart;
  auto shared = shared_job_options(o, c, apart);
  if (!shared) {
    print_error(shared.status().message());
    return kExitUsage;
  }
  JobOptions job = std::move(shared).value();
  if (auto code = load_job(job, c.base)) return *code;
  if (!apart.devices.empty()) c.base.device = apart.devices;
  for (const auto& [key, text] : apart.per_policy) {
    if (Status s = set_job_field(c.base, key, text); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
  }
  c.worker_counts = {c.base.workers};
  if (apart.workers_given) {
    auto parsed = experiments::parse_worker_list(c.workers_text);
    if (!parsed) {
      print_error(parsed.status().message());
      return kExitUsage;
    }
    c.worker_counts = *parsed;
  }
  // Curves need points between epochs to tell fast policies apart.
  if (o.job.options.at("eval-every")->count() == 0 && !apart.in_file("eval-every") && c.base.eval_every_s == 0.0)
    c.base.eval_every_s = 0.5;
  if (!c.base.metrics_out.empty())
    std::printf("note: metrics-out from %s is replaced by one file per run in %s/runs/\n", o.job.config_file.c_str(),
                o.out.c_str());
  c.base.metrics_out.clear();
  for (std::uint32_t w : c.worker_counts)
    for (const std::string& p : c.policies) {
      const JobConfig run = experiments::config_for_run(c.base, p, w, 0);
      Status s = validate(run);
      if (s.ok() && o.processes) s = validate_for_cluster(run, WorkersOn::this_host);
      if (!s.ok()) {
        // Named by the run it refuses: the whole --policies list was blamed
        // for a --device list too short for one worker count.
        const std::string with = c.worker_counts.size() > 1 ? " with --workers " + std::to_string(w) : "";
        print_error("the " + p + " run" + with + ": " + s.message());
        return kExitUsage;
      }
    }
  if (auto code = refused_same_policies(o.policies, c)) return *code;
  if (auto code = refused_settings_no_run_takes(o.policies, c)) return *code;
  // A checkpoint folder that cannot be written fails now, not at the first
  // run with the comparison's folder already made.
  if (!c.base.checkpoint_dir.empty()) {
    if (Status s = prepare_checkpoint_dir(c.base); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
  }
  return std::nullopt;
}

// A run's record completed from its summary: energy, the curve in time
// order, and each epoch's samples (`total_samples`, or when 0, from the
// summary: samples_per_s is training samples / train_s).
RunRecord finish_record(RunRecord rec, std::uint64_t total_samples) {
  if (rec.summary.energy.measured) {
    rec.energy_j = rec.summary.energy.joules;
    rec.edp_js = rec.summary.energy.edp_js();
  }
  std::stable_sort(rec.curve.begin(), rec.curve.end(), [](const auto& a, const auto& b) { return a.wall_s < b.wall_s; });
  if (total_samples == 0)
    total_samples = static_cast<std::uint64_t>(std::llround(rec.summary.samples_per_s * rec.summary.train_s));
  experiments::fill_epoch_samples(rec, total_samples);
  return rec;
}

// One run of the comparison: its record, or why it failed (cancelled when
// interrupted).
Result<RunRecord> run_one(const Comparison& c, const fs::path& dir, const std::string& policy, std::uint32_t workers,
                          std::uint32_t repeat, bool processes, std::stop_token stop, std::string& id) {
  RunRecord rec;
  rec.policy = policy;
  rec.workers = workers;
  rec.repeat = repeat;
  JobConfig config = experiments::config_for_run(c.base, policy, workers, repeat);
  rec.seed = config.seed;
  const TrainingSettings settings = training_settings(config, processes ? Placement::processes : Placement::one_process);
  rec.lr = settings.lr;
  rec.batch = settings.batch;
  id = experiments::run_id(rec);
  config.metrics_out = (dir / "runs" / (id + ".jsonl")).string();
  if (!c.base.checkpoint_dir.empty()) config.checkpoint_dir = (fs::path(c.base.checkpoint_dir) / id).string();
  if (processes) {
    auto ran = run_as_processes(config, std::move(rec), dir / "runs", id, stop);
    if (!ran) return ran.status();
    return finish_record(std::move(ran).value(), 0);
  }

  std::mutex mu;  // the callbacks come from runtime threads
  std::uint64_t total_samples = 0;
  JobCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& m) {
    std::lock_guard lock(mu);
    rec.curve.push_back(experiments::curve_point(m));
  };
  callbacks.on_eval = [&](const EvalPoint& e) {
    std::lock_guard lock(mu);
    rec.curve.push_back(experiments::curve_point(e));
  };
  callbacks.on_progress = [&](const Progress& progress) {
    std::lock_guard lock(mu);
    total_samples = progress.total_samples;
  };
  auto result = run_job(config, callbacks, stop);
  if (!result) return result.status();
  rec.summary = *result;
  return finish_record(std::move(rec), total_samples);
}

// The files' last write, the summary, and the exit code.
int finish_comparison(const CompareOptions& o, Outputs& outputs, const fs::path& dir, std::size_t total,
                      const std::optional<Status>& failure, const std::string& failed_run) {
  const std::size_t done = outputs.report().runs.size();
  const bool interrupted = !failure && done < total;
  if (failure)
    outputs.report().incomplete = "run " + failed_run + " failed (" + error_text(*failure) + "); " +
                                  std::to_string(done) + " of " + std::to_string(total) + " runs finished.";
  else if (interrupted)
    outputs.report().incomplete =
        "interrupted after " + std::to_string(done) + " of " + std::to_string(total) + " runs.";
  if (Status s = outputs.write(); !s.ok()) {
    print_error(s.message());
    return kExitFailure;
  }
  print_summary(outputs.report());
  std::printf("results: %s\ncurves:  %s\nreport:  %s\n", (dir / "results.csv").c_str(), (dir / "curves.csv").c_str(),
              (dir / "report.html").c_str());
  std::fflush(stdout);
  if (failure) {
    // Runs as processes name their own log (runs/<run>.log) in the status.
    const bool details = !o.processes && !is_usage_error(*failure);
    print_error("run " + failed_run + " failed: " + error_text(*failure) +
                (details ? " (details in " + logs_at(o.job.log) + ")" : "") +
                (done == 0 ? "; no run finished" : "; the " + std::to_string(done) + " finished runs are in " + o.out));
    return kExitFailure;  // a run failed: what the user gave was taken (exit 2 is for before anything runs)
  }
  if (interrupted) {
    print_error("interrupted; " + std::to_string(done) + " of " + std::to_string(total) + " runs finished, written to " +
                o.out);
    return kExitFailure;
  }
  return kExitOk;
}

// True when `csv` exists and has a line after its header (or cannot be
// read: then it is not ours to replace).
bool holds_rows(const fs::path& csv) {
  std::error_code ec;
  if (!fs::exists(csv, ec) && !ec) return false;
  std::ifstream in(csv);
  if (!in) return true;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line))
    if (!line.empty()) return true;
  return false;
}

// The comparison's folder made and held (its lock) for this comparison:
// its lock, or why not.
Result<FolderLock> take_out_folder(const CompareOptions& o) {
  const fs::path dir(o.out);
  std::error_code ec;
  // Another comparison's results would be replaced in part (its runs/
  // kept): a folder that no longer matches itself. One in which no run
  // finished (its files a header each) is taken again.
  for (const char* name : {"results.csv", "curves.csv"}) {
    if (!holds_rows(dir / name)) continue;
    return Status::InvalidArgument("--out " + o.out + ": holds an earlier comparison (" + name +
                                   "); give a new folder, or remove that one first");
  }
  fs::create_directories(dir / "runs", ec);
  if (ec) return Status::InvalidArgument("--out " + o.out + ": cannot create " + (dir / "runs").string() + ": " + ec.message());
  // Two comparisons in one folder wrote into each other's files (no row
  // is there until a run ends): the folder is one comparison's at a time.
  auto held = FolderLock::try_hold(dir);
  if (!held)
    return Status::InvalidArgument("--out " + o.out + ": " +
                                   (held.status().code() == StatusCode::unavailable ? "another asgd compare is writing there"
                                                                                     : held.status().message()) +
                                   "; give another folder");
  return held;
}

int run_compare(const CompareOptions& o) {
  if (auto code = refused_flags(o)) return *code;
  Comparison c;
  if (auto code = plan_comparison(o, c)) return *code;
  const fs::path dir(o.out);
  auto held = take_out_folder(o);
  if (!held) {
    print_error(held.status().message());
    return kExitUsage;
  }
  experiments::ReportInput report;
  report.config = c.base;
  report.config.workers = c.worker_counts.front();
  report.placement = o.processes ? Placement::processes : Placement::one_process;
  report.policies = c.policies;
  report.workers = c.worker_counts;
  report.repeats = o.repeats;
  report.command = command_line(o);
  report.host = host_description();
  Outputs outputs(dir, std::move(report));
  if (Status s = outputs.write(); !s.ok()) {
    print_error("--out " + o.out + ": " + s.message());
    return kExitUsage;
  }

  const std::size_t total = static_cast<std::size_t>(o.repeats) * c.worker_counts.size() * c.policies.size();
  auto plural = [](std::size_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); };
  std::printf("asgd compare: %s on %s, policies %s, workers %s, %s, %s: %s (data: %s; out: %s)\n",
              c.base.model.c_str(), c.base.dataset.c_str(), o.policies.c_str(),
              !c.workers_text.empty() ? c.workers_text.c_str() : std::to_string(c.base.workers).c_str(),
              plural(c.base.epochs, "epoch").c_str(), plural(o.repeats, "repeat").c_str(),
              plural(total, "run").c_str(), resolve_data_dir(c.base).c_str(), o.out.c_str());
  std::fflush(stdout);

  Interrupts interrupts;
  std::optional<Status> failure;
  std::string failed_run;
  for (std::uint32_t r = 0; r < o.repeats && !failure; ++r) {
    for (std::uint32_t w : c.worker_counts) {
      for (const std::string& p : c.policies) {
        if (failure || interrupts.token().stop_requested()) break;
        std::string id;
        auto rec = run_one(c, dir, p, w, r, o.processes, interrupts.token(), id);
        if (!rec) {
          if (rec.status().code() != StatusCode::cancelled) {
            failure = rec.status();
            failed_run = id;
          }
          break;
        }
        outputs.report().runs.push_back(std::move(rec).value());
        print_run(outputs.report().runs.size(), total, outputs.report().runs.back());
        if (Status s = outputs.write(); !s.ok()) {
          print_error(s.message());
          return kExitFailure;
        }
      }
    }
  }
  return finish_comparison(o, outputs, dir, total, failure, failed_run);
}

}  // namespace

std::function<int()> add_compare_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "compare", "run the same job under each policy (and worker count), repeated; CSV files and an HTML report");
  auto opts = std::make_shared<CompareOptions>();
  cmd->add_option("--policies", opts->policies, "policies to compare, as given to --policy: bsp,ssp:3,async")
      ->type_name("LIST")
      ->required();
  cmd->add_option("--repeats", opts->repeats, "runs per policy and worker count, with seeds seed..seed+R-1 (default 1)")
      ->type_name("R");
  cmd->add_option("--out", opts->out, "folder for results.csv, curves.csv, report.html and runs/ (created)")
      ->type_name("DIR")
      ->required();
  cmd->add_flag("--processes", opts->processes,
                "run each job as processes on this machine, as asgd cluster does (a coordinator, the shards and the "
                "workers each a process), instead of in this process");
  add_job_flags(cmd, opts->job, true);
  // What differs from train's flags.
  opts->job.options.at("workers")->description("worker actors, >= 1; here also a list such as 1,2,4 (every count runs)");
  opts->job.options.at("device")->description(
      "where workers compute: one device for all, or a list, of which each run takes one per worker: with "
      "--workers 1,2, --device cuda:0,cpu compares the GPU alone with the GPU and the CPU together");
  opts->job.options.at("eval-every")->description(
      "also evaluate every S seconds of training (compare's default 0.5, for finer curves; 0: per epoch only)");
  opts->job.options.at("policy")->description("not taken by compare: list the policies in --policies");
  opts->job.options.at("metrics-out")->description("not taken by compare: each run writes DIR/runs/<run>.jsonl");
  opts->job.options.at("resume")->description("not taken by compare: every run starts from the beginning");
  opts->job.options.at("checkpoint-dir")->description(
      "write each run's trained model to DIR/<run>/model.ckpt at the end (for asgd export)");
  return [opts] { return run_compare(*opts); };
}

}  // namespace asgd::cli
