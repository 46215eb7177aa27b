// asgd compare --processes: one run of a comparison as processes on this
// machine. The run's settings go to runs/<id>.toml, a child `asgd cluster`
// runs them (a coordinator, the shards and the workers as processes, its
// output in runs/<id>.log) and writes runs/<id>.jsonl, which is read back
// into the run's record: its curve and its summary, as in one process.

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "base/process.hpp"
#include "experiments/compare.hpp"
#include "runtime/config_file.hpp"
#include "runtime/metrics.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Runs `args` with its output in `log` until it exits; on `stop`, SIGTERM
// (the job stops as on Ctrl-C), and SIGKILL 30 s later. Its exit status, or
// -1 when it did not start, or nullopt when stopped.
std::optional<int> run_child(const std::vector<std::string>& args, const fs::path& log, std::stop_token stop) {
  auto spawned = spawn_logged(args, log);
  if (!spawned) return -1;
  const pid_t pid = *spawned;
  int status = 0;
  std::optional<Clock::time_point> killed_at;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (stop.stop_requested() && !killed_at) {
      kill(pid, SIGTERM);
      killed_at = Clock::now();
    }
    if (killed_at && Clock::now() - *killed_at > std::chrono::seconds(30)) kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // A run that had finished when the stop came is kept.
  if (killed_at && code != 0) return std::nullopt;
  return code;
}

// Why a child `asgd cluster` that exited with `code` failed, from its
// "asgd: error: ..." lines in `log`: the coordinator's (it says why the job
// ended), else the last. Its status code is the one the text starts with
// ("training diverged: ..."); exit 2 is a usage error.
Status child_failure(const fs::path& log, int code) {
  std::ifstream in(log);
  const std::string mark = "asgd: error: ";
  std::string last, coordinator;
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(mark);
    if (at == std::string::npos) continue;
    last = line.substr(at + mark.size());
    if (line.rfind("[coordinator]", 0) == 0) coordinator = last;
  }
  std::string why = coordinator.empty() ? last : coordinator;
  // Its "(details in the log on stderr)": that log is `log`, named below.
  if (const auto details = why.rfind(" (details in "); details != std::string::npos) why.erase(details);
  const std::string exited = "asgd cluster exited with status " + std::to_string(code);
  if (why.empty()) return Status::Internal(exited + " (its output: " + log.string() + ")");
  const std::string where = " (" + exited + "; its output: " + log.string() + ")";
  if (code == kExitUsage) return Status::InvalidArgument(why + where);
  for (StatusCode c : {StatusCode::not_found, StatusCode::corruption, StatusCode::io_error, StatusCode::timeout,
                       StatusCode::cancelled, StatusCode::diverged, StatusCode::internal, StatusCode::unavailable}) {
    const std::string prefix = std::string(to_string(c)) + ": ";
    if (why.rfind(prefix, 0) == 0) return Status::WithCode(c, why.substr(prefix.size()) + where);
  }
  return Status::Internal(why + where);
}

}  // namespace

Result<experiments::RunRecord> run_as_processes(const JobConfig& config, experiments::RunRecord rec,
                                                const fs::path& runs, const std::string& id, std::stop_token stop) {
  const fs::path settings = runs / (id + ".toml"), log = runs / (id + ".log");
  {
    std::ofstream out(settings);
    out << to_toml(config);
    if (!out) return Status::IOError("cannot write " + settings.string());
  }
  const auto code = run_child({fs::read_symlink("/proc/self/exe").string(), "cluster", "--config", settings.string(),
                               "--metrics-out", config.metrics_out, "--log-level", "warn"},
                              log, stop);
  if (!code) return Status::Cancelled("interrupted");
  if (*code != 0) return child_failure(log, *code);
  std::ifstream in(config.metrics_out);
  bool summary = false;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const std::string event = j.is_object() ? j.value("event", "") : "";
    if (event == "epoch") {
      auto m = epoch_from_json(j);
      if (!m) return m.status();
      rec.curve.push_back(experiments::curve_point(*m));
    } else if (event == "eval") {
      auto e = eval_from_json(j);
      if (!e) return e.status();
      rec.curve.push_back(experiments::curve_point(*e));
    } else if (event == "summary") {
      auto s = summary_from_json(j);
      if (!s) return s.status();
      rec.summary = *s;
      summary = true;
    }
  }
  if (!summary) return Status::Internal("asgd cluster wrote no summary to " + config.metrics_out);
  return rec;
}

}  // namespace asgd::cli
