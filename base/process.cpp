#include "base/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace asgd {

Result<pid_t> spawn_logged(const std::vector<std::string>& args, const std::filesystem::path& log) {
  if (args.empty()) return Status::InvalidArgument("spawn_logged: no program");
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::IOError("cannot start " + args[0] + ": " + std::strerror(rc));
  return pid;
}

bool process_runs(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

bool process_can_act(pid_t pid) {
  if (!process_runs(pid)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;  // gone meanwhile
  const auto close = line.rfind(')');  // the state follows the name, which may hold anything
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
  return state != 'Z' && state != 'X';
}

std::string how_it_ended(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
  }
  return "exited with status " + std::to_string(WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 1);
}

std::string own_program_path() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec || self.empty() ? "/proc/self/exe" : self.string();
}

}  // namespace asgd
