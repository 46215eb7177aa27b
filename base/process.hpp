#pragma once
// Starting a child process whose output goes to a file: the shard processes
// of `asgd bench load`, the runs of `asgd compare --processes`; and asking
// whether a process still runs.

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

/// Starts argv (argv[0] a path) with its stdin on /dev/null and its stdout
/// and stderr in `log` (created or truncated); its pid. The caller reaps it.
/// Errors: io_error naming the program when it cannot be started.
Result<pid_t> spawn_logged(const std::vector<std::string>& argv, const std::filesystem::path& log);

/// Whether process `pid` runs (also when it does, but this process may not
/// signal it); false for pid 0.
bool process_runs(pid_t pid);
/// process_runs, and not a zombie (ended, not yet reaped by its parent):
/// whether it can still do anything, such as write to shared memory.
bool process_can_act(pid_t pid);

/// How a child ended, from waitpid's status: "exited with status 3", "was
/// killed by signal 9 (SIGKILL)".
std::string how_it_ended(int wait_status);

/// This program's own path (/proc/self/exe read), or "/proc/self/exe" where
/// that cannot be read: the argv[0] of a child started as /proc/self/exe
/// (ps showed "/proc/self/exe coordinator ..."), and the name it takes.
std::string own_program_path();

}  // namespace asgd
