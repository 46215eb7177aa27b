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
  if (killed_at) return std::nullopt;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The last lines of a log, for an error message.
std::string tail(const fs::path& log, std::size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> last;
  for (std::string line; std::getline(in, line);) {
    if (line.find('\r') != std::string::npos) line = line.substr(line.rfind('\r') + 1);  // progress bars
    if (line.empty()) continue;
    last.push_back(line);
    if (last.size() > lines) last.erase(last.begin());
  }
  std::string out;
  for (const auto& l : last) out += "\n  " + l;
  return out;
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
  if (*code != 0)
    return Status::Internal("asgd cluster exited with status " + std::to_string(*code) + " (its output: " +
                            log.string() + ")" + tail(log, 5));
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
