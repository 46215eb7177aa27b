#pragma once
// Running the asgd binary from a test: a child process whose output goes to
// a log file, its own children found by their arguments, waits for a line
// in its log and for its exit.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_helpers.hpp"

extern char** environ;

namespace asgd_test {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `asgd ARGS` as a child of ours, stdout and stderr into `log`, in the
// working folder `cwd` (empty: ours).
inline pid_t start_asgd(const std::vector<std::string>& args, const std::filesystem::path& log,
                        const std::filesystem::path& cwd = {}) {
  std::vector<std::string> all = {asgd_cli_path()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, asgd_cli_path(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// The pid of the child of `parent` whose command line has every one of
// `words` as an argument; nullopt when there is none.
inline std::optional<pid_t> child_with_args(pid_t parent, const std::vector<std::string>& words) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    const std::string cmdline = read_file(entry.path() / "cmdline");
    std::vector<std::string> args;
    for (std::size_t at = 0; at < cmdline.size();) {
      const auto end = cmdline.find('\0', at);
      args.push_back(cmdline.substr(at, end - at));
      at = end == std::string::npos ? cmdline.size() : end + 1;
    }
    bool all = true;
    for (std::size_t i = 0; all && i < words.size(); ++i) {
      // "--index" "1" must be adjacent
      auto it = std::find(args.begin(), args.end(), words[i]);
      all = it != args.end() && (i + 1 >= words.size() || words[i].rfind("--", 0) != 0 ||
                                 (it + 1 != args.end() && *(it + 1) == words[i + 1]));
    }
    if (all) return static_cast<pid_t>(std::stoi(name));
  }
  return std::nullopt;
}

// Polls `log` until it holds `needle`; the time it took, or nullopt. The
// harness's waits (this and wait_exit) stretch under a sanitizer; the
// bounds the tests assert on what they measured do not.
inline std::optional<double> wait_for_text(const std::filesystem::path& log, const std::string& needle, std::chrono::seconds limit,
                                    pid_t alive) {
  limit *= kSanitizerSlowdown;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < limit) {
    if (read_file(log).find(needle) != std::string::npos)
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waitpid(alive, nullptr, WNOHANG) == alive) return std::nullopt;  // it ended first
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

inline std::optional<int> wait_exit(pid_t pid, std::chrono::seconds limit) {
  limit *= kSanitizerSlowdown;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < limit) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return std::nullopt;
}

// A test's name for a policy parameter: "ssp:2" -> "ssp_2".
inline std::string policy_test_name(const ::testing::TestParamInfo<const char*>& p) {
  std::string n = p.param;
  for (char& c : n)
    if (c == ':') c = '_';
  return n;
}

}  // namespace asgd_test
