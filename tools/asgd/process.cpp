// What every asgd program (asgd, asgd-bench) does with its process: its
// errors on stderr, its exit codes, Ctrl-C, the BLAS kernels it runs on, its
// allocator's thresholds, and where its sibling programs are.

#include <malloc.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <thread>

#include "base/process.hpp"
#include "compute/blas.hpp"
#include "runtime/cluster.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

// Written by the signal handler, read by Interrupts' watcher thread: a
// volatile sig_atomic_t is safe only within one thread, so a lock-free
// atomic (which a signal handler may also use).
std::atomic<bool> g_interrupted{false};
// When the first SIGINT came (CLOCK_MONOTONIC, ns); 0: none yet.
std::atomic<std::int64_t> g_first_sigint_ns{0};
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

// A second SIGINT this soon after the first is the same interrupt sent
// twice: GNU timeout sends its signal to the process and then to its
// group, and a clean stop that lost every checkpoint to the second copy
// (1 run in 4) was no clean stop. A person's second Ctrl-C comes later.
constexpr std::int64_t kSameInterruptNs = 500'000'000;

std::int64_t monotonic_ns() {  // clock_gettime may be called in a signal handler
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// A second Ctrl-C ends the process at once: the first asked for a clean
// stop, which a step that does not return (a data file on a hung network
// mount) may never reach. Only SIGINT twice: a stop that also brings a
// SIGTERM (asgd cluster's to its processes, on top of the terminal's
// SIGINT to the whole group) is still clean.
extern "C" void on_sigint(int sig) {
  if (sig == SIGINT) {
    const std::int64_t now = std::max<std::int64_t>(monotonic_ns(), 1);
    std::int64_t first = 0;
    if (!g_first_sigint_ns.compare_exchange_strong(first, now, std::memory_order_relaxed) &&
        now - first >= kSameInterruptNs) {
      static constexpr char kMessage[] = "asgd: interrupted again: stopped at once, without a clean stop\n";
      [[maybe_unused]] const auto written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
      ::_exit(1);
    }
  }
  g_interrupted.store(true, std::memory_order_relaxed);
}

}  // namespace

Interrupts::Interrupts() {
  // SIGUSR1 is what Slurm sends ahead of a time limit (--signal=USR1@120)
  // and SIGHUP what a closed terminal does: a stop with its final
  // checkpoints, like the other two, instead of the default end.
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGHUP}) std::signal(sig, on_sigint);
  watcher_ = std::jthread([this](std::stop_token done) {
    while (!done.stop_requested()) {
      if (g_interrupted.load(std::memory_order_relaxed)) {
        stop_.request_stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

void end_with_parent(pid_t parent) {
  if (parent <= 0) return;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::raise(SIGTERM);  // it ended before the line above
}

void refuse_mistyped_flags(CLI::App& scope) {
  for (CLI::Option* o : scope.get_options({})) {
    // A switch given twice is refused like any flag (--json --json was taken).
    if (o->get_expected_max() == 0 && o->get_name() != "--help" && o->get_name() != "--version")
      o->multi_option_policy(CLI::MultiOptionPolicy::Throw);
    const std::string t = o->get_type_name();
    if (t != "FILE" && t != "DIR" && t != "PATH" && t != "URL") continue;
    const std::string refusal = o->get_required()  ? "an empty path (give one)"
                                : t == "URL"         ? "an empty URL (leave the flag out for the default)"
                                                     : "an empty path (leave the flag out for none)";
    // A value like a flag is one that took the next flag's place: an unset
    // variable (--metrics-out $OUT --epochs 1) wrote a file named --epochs.
    o->check(CLI::Validator(
        [refusal](std::string& v) {
          if (v.empty()) return refusal;
          if (v.size() > 1 && v[0] == '-')
            return "'" + v + "' is a flag, not a path: was the value left out? (./" + v + " for a file of that name)";
          return std::string();
        },
        ""));
  }
  for (CLI::App* sub : scope.get_subcommands({})) refuse_mistyped_flags(*sub);
}

void print_error(const std::string& message) {
  std::string line = message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::fprintf(stderr, "asgd: error: %s\n", line.c_str());
}

int exit_code_for(const Status& s) { return is_usage_error(s) ? kExitUsage : kExitFailure; }

std::string error_text(const Status& s) {
  return is_usage_error(s) || s.code() == StatusCode::cancelled ? s.message() : s.to_string();
}

// ZeroMQ allocates every message it receives over tcp and the receiver
// frees it: a collective's 1 MiB pieces, a gradient. glibc's default
// thresholds adjust as it goes (mmap above 128 KiB at first, and the top of
// a heap given back to the kernel once 2x that is free), and on these
// messages they kept giving pages back and faulting them in again: a third
// of the page faults of a 2-rank all-reduce over tcp, in ZeroMQ's recv into
// a fresh buffer. Fixed at the values glibc's own adjustment grows to at
// most on 64-bit (mmap from 32 MiB, trim past 64 MiB), the memory stays for
// the next message: 1M-float all-reduces took 3.05 ms against 3.95 ms,
// 4M-float ones 14.7 against 18.2 (medians of four alternating runs,
// docs/benchmarks.md). A program embedding asgd keeps its own settings.
void keep_freed_memory_for_reuse() {
  (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
  (void)mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

void name_this_process() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  if (!std::getline(comm, name) || name != "exe") return;
  const std::string path = own_program_path();
  if (path == "/proc/self/exe") return;  // (its name would be "exe" again)
  const std::string self = std::filesystem::path(path).filename().string().substr(0, 15);
  // The main thread and those a library started before main() (OpenBLAS's),
  // each named "exe" in top -H and ps -L.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::string thread;
    if (std::ifstream in(task.path() / "comm"); !std::getline(in, thread) || thread != "exe") continue;
    std::ofstream(task.path() / "comm") << self;
  }
}

// OpenBLAS picks its kernels when it loads, before main(); where it picked
// its slow generic ones on a CPU it does not know, start again once with
// OPENBLAS_CORETYPE set. A value the user set is always left alone.
void reexec_with_better_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  const std::string core = blas::suggested_coretype();
  if (core.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // execv only returns on failure: carry on with the kernels we have.
}

std::optional<int> parse_arguments(
    CLI::App& app, std::vector<std::string> args,
    const std::function<std::string(const std::vector<std::string>& typed, const CLI::ParseError&)>& explain) {
  const std::vector<std::string> typed = args;
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first, and consumes them
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(explain(typed, e));
    return kExitUsage;
  }
  return std::nullopt;
}

std::string sibling_program(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return name;  // let the search path find it
  return (self.parent_path() / name).string();
}

}  // namespace asgd::cli
