#pragma once
// Subcommands of the asgd CLI. Each registers its options on a CLI11 app and
// returns the process exit status: 0 done, 1 runtime failure, 2 usage or
// configuration error.

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "asgd/job.hpp"
#include "experiments/compare.hpp"
#include "messaging/transport.hpp"
#include "runtime/config_file.hpp"
#include "runtime/launcher.hpp"

namespace asgd::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

/// `v` without its description, which CLI11 would otherwise append to the
/// option's placeholder in --help ("N:POSITIVE", "N:INT in [1 - 16]"):
/// the help text says the allowed values in words.
inline CLI::Validator quietly(CLI::Validator v) {
  v.description("");
  return v;
}

/// A finite number above 0 (`strictly`) or at least 0, and at most `most`
/// when given (inf and nan are no numbers here), refused in plain words (CLI11's own say "not in range 0.000000 to
/// 1.797e308").
inline CLI::Validator positive(bool strictly = true, std::optional<double> most = std::nullopt) {
  return CLI::Validator(
      [strictly, most](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool number = end != text.c_str() && *end == '\0' && std::isfinite(v);
        if (number && (strictly ? v > 0 : v >= 0) && (!most || v <= *most)) return {};
        return std::string("expected a number ") + (strictly ? "above 0" : "of 0 or more") +
               (most ? fmt::format(" and at most {:g}", *most) : std::string()) + ", got " + text;
      },
      "");
}

/// Adds `train` to `app`; the returned function runs it after parsing.
std::function<int()> add_train_command(CLI::App& app);

/// Adds `compare` (the same job under several policies, repeated; CSV files
/// and an HTML report) to `app`.
std::function<int()> add_compare_command(CLI::App& app);

/// Adds `export` (a checkpoint as safetensors) to `app`.
std::function<int()> add_export_command(CLI::App& app);

/// Adds `data fetch` (a dataset downloaded and checked) to `app`.
std::function<int()> add_data_command(CLI::App& app);

/// Adds `devices` (the CPUs and GPUs a job can use here, or why not) to `app`.
std::function<int()> add_devices_command(CLI::App& app);

/// Adds `keys generate` (a CurveZMQ keypair for --auth-keys) to `app`.
std::function<int()> add_keys_command(CLI::App& app);

/// Adds the benchmarks `runtime`, `comm`, `compute` and `load` to asgd-bench's
/// `app` (bench/main.cpp); the returned function runs the one chosen.
std::function<int()> add_bench_commands(CLI::App& app);

/// `bench comm` (and its hidden server): whether it was chosen, and its run.
struct CommBench {
  std::function<bool()> parsed;
  std::function<int()> run;
};
CommBench add_comm_bench(CLI::App* bench);

/// `bench compute` (bench/compute_bench.cpp): the same pair.
using ComputeBench = CommBench;
ComputeBench add_compute_bench(CLI::App* bench);

/// `bench load` (bench/load_bench.cpp): the same pair.
using LoadBench = CommBench;
LoadBench add_load_bench(CLI::App* bench);

/// `bench allreduce` (bench/allreduce_bench.cpp): the same pair.
using AllreduceBench = CommBench;
AllreduceBench add_allreduce_bench(CLI::App* bench);

/// In `scope` and its subcommands: every flag that names a file, folder or
/// URL (type name FILE, DIR, PATH or URL) refuses an empty value (`--metrics-out
/// "$OUT"` with OUT unset used to mean no metrics file, silently) and one
/// that looks like a flag (the next flag, taken when the value was left
/// out); every switch refuses to be given twice, as other flags do. Call it
/// once every option is added.
void refuse_mistyped_flags(CLI::App& scope);


/// A comma-separated list flag (type name LIST): given twice it is refused
/// as every flag is, and so is an empty item ("1M,,64K", a comma at an
/// end), which CLI11's own splitting dropped without a word.
CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<std::string>& items,
                             const std::string& description);
/// The same for whole numbers from `lo` to `hi`.
CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<std::uint32_t>& items,
                             const std::string& description, std::uint32_t lo, std::uint32_t hi);

/// A count of floats as the benchmarks take it: "4M", "512K", "1000".
/// Errors: invalid_argument naming the text, for 0 or more than 256M.
Result<std::uint64_t> parse_float_count(const std::string& text);
/// The count as parse_float_count reads it back: "4M", "1536K", "1000".
std::string float_count_text(std::uint64_t floats);
/// The middle value, or the mean of the two middle ones for an even count
/// (0 for none): the benchmarks' medians.
double median(std::vector<double> values);

/// Adds `cluster`, `coordinator`, `shard` and `worker` to `app`; the
/// returned function runs whichever was chosen.
std::function<int(const std::string& name)> add_cluster_commands(CLI::App& app);

/// "asgd: error: <message>" on stderr, one line.
void print_error(const std::string& message);

/// Starts the program again with OPENBLAS_CORETYPE set where OpenBLAS picked
/// its slow generic kernels for a CPU it does not know (see blas.hpp).
void reexec_with_better_blas_kernels(char** argv);
/// A process started as /proc/self/exe (asgd cluster's, a re-exec for
/// OpenBLAS's kernels) is named "exe" in ps, top and pgrep: it takes its
/// program's name ("asgd") instead.
void name_this_process();

/// Makes malloc keep the memory freed by large messages for the next ones
/// (glibc's thresholds fixed at the largest its own adjustment reaches).
void keep_freed_memory_for_reuse();

/// Parses `args` (as typed) into `app`. nullopt when the chosen command is
/// to run; otherwise the exit status: 0 after --help or --version (printed),
/// kExitUsage after a parse error, printed as one line of what `explain`
/// makes of it and the typed arguments.
std::optional<int> parse_arguments(
    CLI::App& app, std::vector<std::string> args,
    const std::function<std::string(const std::vector<std::string>& typed, const CLI::ParseError&)>& explain);

/// The parser's complaint in words that say what to do, naming the deepest
/// command given ("asgd data fetch", "asgd bench comm"): an unknown flag
/// with the nearest one that command has and where the list is, a value
/// it cannot convert with what the flag takes, a missing or unknown
/// command with the list of commands. For parse_arguments' `explain`.
std::string explain_parse_error(CLI::App& app, const std::vector<std::string>& typed, const CLI::ParseError& e);

/// The path of the program `name` in the folder this program runs from
/// (asgd and asgd-bench are built and installed side by side).
std::string sibling_program(const std::string& name);

struct LogOptions {
  std::string log_file;
  std::string log_level = "info";
};

/// The job flags of train, cluster and coordinator: every JobConfig field,
/// a config file, and logging.
struct JobOptions {
  std::string config_file;
  std::map<std::string, std::string> flags;  // key -> text, as given
  std::map<std::string, CLI::Option*> options;
  LogOptions log;
  /// The config file's settings when the caller read them already and set
  /// some apart (compare: each policy's own settings), as it erases those
  /// options above; unset: load_job reads `config_file` itself.
  std::optional<ConfigSettings> config_settings;
};
/// The job's flags (and --config, the log flags). `one_process`: the
/// flags that matter only across processes go in a group of their own.
void add_job_flags(CLI::App* cmd, JobOptions& opts, bool one_process);
void add_log_flags(CLI::App* cmd, LogOptions& log);
/// The flags as given, to hand to another asgd process.
std::vector<std::string> given_job_flags(const JobOptions& o);

/// Sets up logging and builds the job's configuration from defaults, the
/// config file and the flags; an exit code when that fails (the error is
/// printed). The device is checked on this machine only when
/// `devices_here` (not for a coordinator whose workers run elsewhere), and
/// its data folder when `data_here` (refuse_missing_data).
std::optional<int> load_job(const JobOptions& o, JobConfig& config, bool devices_here = true, bool data_here = true);
/// An exit code, the error printed, when the job's data folder
/// (resolve_data_dir) is not a folder on this host; else nothing.
std::optional<int> refuse_missing_data(const JobConfig& config);
Status setup_logging(const LogOptions& o);
int exit_code_for(const Status& s);
/// What print_error says of a failed status: the message alone for what the
/// user must fix (exit 2) and for a stop (cancelled), else with its code
/// ("timeout: ...", "internal: ...").
std::string error_text(const Status& s);
std::string logs_at(const LogOptions& o);

/// "asgd COMMAND: mlp on mnist, policy async, 2 workers, ..., lr 0.02
/// (data: DIR)" on stdout, then the line naming the optimizer defaults
/// adjusted for the job's policy and worker count (none when none is).
void print_job_heading(const char* command, const JobConfig& config, Placement placement);

/// Per-epoch progress lines on stdout; on a terminal a bar redrawn in
/// place too, unless `plain` (a rank under a launcher: mpirun gives each
/// rank a pseudo-terminal whose output goes to a log file).
JobCallbacks progress_callbacks(const JobConfig& config, bool plain = false);
/// Prints the summary or the error; the exit code.
int report_outcome(const Result<JobSummary>& result, const JobConfig& config, const LogOptions& log);

/// `asgd cluster`'s flags for running under a launcher (runtime/launcher.hpp).
struct LaunchFlags {
  std::string launcher = "auto";   ///< auto | local | env | slurm | mpi | kubernetes | torchrun
  std::uint16_t port = 0;          ///< the coordinator's port when the launcher gives none (0: Slurm's job id's)
  std::string rendezvous;          ///< a shared file where rank 0 writes its endpoint (MPI)
  std::string address;             ///< this rank's address to listen on and announce (default: towards the coordinator)
  std::string interface;           ///< or that of this network interface
  double join_timeout_s = 60.0;
  bool print_layout = false;
  bool shared_memory = true;       ///< --shared-memory: large tensors to processes on this host through it
  std::uint32_t busy_poll_us = 0;  ///< --busy-poll-us: ProcessOptions::busy_poll
  std::string collective = "own";  ///< --collective own | mpi: the workers' all-reduce (mpi: MPI_Allreduce)
};

/// asgd compare --processes: one run as `asgd cluster` in a child process
/// (tools/asgd/compare_processes.cpp), `config` written to RUNS/ID.toml, its
/// output to RUNS/ID.log; `rec` with the run's curve and summary read back
/// from config.metrics_out. Errors: cancelled (`stop`), internal (the job
/// failed: its exit status and last lines), and the metrics file's.
Result<experiments::RunRecord> run_as_processes(const JobConfig& config, experiments::RunRecord rec,
                                                const std::filesystem::path& runs, const std::string& id,
                                                std::stop_token stop);

/// One rank of a launched job: the coordinator, a shard or a worker by its
/// rank, with `curve` (--auth-keys) authenticated and encrypted; the
/// process's exit status.
int run_launched_rank(const JobOptions& jo, const LaunchFlags& lf, const Launch& launch,
                      std::optional<messaging::CurveOptions> curve);

/// For a helper process a benchmark starts (its comm server, its ranks):
/// SIGTERM when `parent` ends, however it ends (Ctrl-C, SIGKILL), and at
/// once when it has ended already; none for `parent` 0.
void end_with_parent(pid_t parent);

/// Turns SIGINT, SIGTERM, SIGUSR1 and SIGHUP into a stop request while it
/// lives.
class Interrupts {
 public:
  Interrupts();
  std::stop_token token() const { return stop_.get_token(); }
  /// Stops what runs on token() as a Ctrl-C would, for a reason of the caller's.
  void stop() { stop_.request_stop(); }

 private:
  std::stop_source stop_;
  std::jthread watcher_;
};

}  // namespace asgd::cli
