// asgd compare --processes: one run of a comparison as processes on this
// machine. The run's settings go to runs/<id>.toml, a child `asgd cluster`
// runs them (a coordinator, the shards and the workers as processes, its
// output in runs/<id>.log) and writes runs/<id>.jsonl, which is read back
// into the run's record: its curve and its summary, as in one process.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

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
std::optional<int> run_child(std::vector<std::string> args, const fs::path& log, std::stop_token stop) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
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
