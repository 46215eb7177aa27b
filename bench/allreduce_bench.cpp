// asgd bench allreduce: the workers' all-reduce across processes (the
// collective of allreduce, messaging/zmq_collective.cpp) against Open MPI's
// MPI_Allreduce, in the same run, on this machine.
//
// N processes of our own (hidden subcommand allreduce-rank) find each other
// through endpoint files in a scratch folder, then all-reduce each size
// `--iterations` times after two warm-up rounds, and check the mean; rank
// 0's median time per all-reduce gives the bus bandwidth, 2 (N - 1) / N x
// bytes / time (the convention of NCCL's tests). They run twice: over tcp
// (the ring; shared memory off) and through shared memory (on, as a job's
// workers on one host are). After each, `mpirun -np N` runs this program's
// allreduce-mpi (built where Open MPI's headers are found), timed the same
// way, over tcp (btl self,tcp), then over shared memory (btl self,vader).
// Our ranks are bound to cores as mpirun binds its ranks by default (each
// to a core of its own when the cores suffice).
// Ours computes the samples-weighted mean the policy needs, MPI a plain sum.

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <spdlog/fmt/fmt.h>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "base/cpus.hpp"
#include "messaging/collective.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct AllreduceOptions {
  std::uint32_t processes = 2;
  std::vector<std::string> sizes = {"1M", "4M", "16M"};
  int iterations = 20;
  int rounds = 1;  // of the four sides (ours and MPI, tcp and shared memory), medians over them
  std::string compress = "none";  // fp16: ours sends its chunks as float16 (MPI stays float32)
  bool json = false;
  // A rank's: its index, the scratch folder, and whether its all-reduce may
  // go through shared memory (on: the default of a job's workers).
  std::uint32_t rank = 0;
  std::string dir;
  std::string shared_memory = "off";
  std::string out;  // allreduce-mpi: where rank 0 writes its times
  pid_t parent = 0;  // a rank's: the bench allreduce that started it, which it ends with
};

Result<std::vector<std::uint64_t>> float_counts(const std::vector<std::string>& sizes) {
  std::vector<std::uint64_t> out;
  for (const auto& s : sizes) {
    auto n = parse_float_count(s);
    if (!n) return Status::InvalidArgument("--sizes: " + n.status().message());
    out.push_back(*n);
  }
  return out;
}

// Rank o.rank's endpoint written where the others look, and theirs read.
Result<std::vector<std::string>> rendezvous(const AllreduceOptions& o, const std::string& mine) {
  const fs::path dir = o.dir;
  {
    std::ofstream(dir / ("ep." + std::to_string(o.rank) + ".tmp")) << mine;
  }
  fs::rename(dir / ("ep." + std::to_string(o.rank) + ".tmp"), dir / ("ep." + std::to_string(o.rank)));
  std::vector<std::string> endpoints(o.processes);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (std::uint32_t r = 0; r < o.processes; ++r) {
    while (!fs::exists(dir / ("ep." + std::to_string(r)))) {
      if (Clock::now() > deadline)
        return Status::Timeout("bench allreduce: rank " + std::to_string(r) + " did not start within 30 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream(dir / ("ep." + std::to_string(r))) >> endpoints[r];
  }
  return endpoints;
}

// One all-reduce, waited for (at most a minute).
Status allreduce_once(messaging::Collective& c, std::uint32_t rank, messaging::Round round, std::span<const float> data) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status called = c.allreduce_mean(rank, round, data, 1.0, [&] {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  });
  if (!called.ok()) return called;
  std::unique_lock lock(mu);
  if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }))
    return Status::Timeout("bench allreduce: rank " + std::to_string(rank) + " waited a minute for " + c.waiting_for(rank));
  return {};
}

// Our ranks are bound as mpirun binds its own by default: each to a CPU of
// its own when the bench may use at least as many CPUs as there are ranks
// (rank r to the r-th of the CPUs its affinity mask allows, so that a
// `taskset` around the bench holds), unbound otherwise. Before any thread
// starts, so that all inherit it.
void bind_like_mpirun(const AllreduceOptions& o) {
  const std::vector<unsigned> allowed = asgd::allowed_cpus();
  if (o.processes > allowed.size() || o.rank >= allowed.size()) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(allowed[o.rank], &one);
  (void)sched_setaffinity(0, sizeof one, &one);  // best effort: unbound, it only runs slower
}

int run_rank(const AllreduceOptions& o) {
  bind_like_mpirun(o);
  auto counts = float_counts(o.sizes);
  auto made = messaging::make_zmq_collective("tcp://127.0.0.1:*");
  if (!counts || !made) {
    print_error((counts ? made.status() : counts.status()).message());
    return kExitFailure;
  }
  auto& c = **made;
  auto endpoints = rendezvous(o, c.endpoint());
  c.set_half_precision(o.compress == "fp16");
  c.set_shared_memory(o.shared_memory == "on");
  if (!endpoints || !c.connect(o.rank, *endpoints).ok()) {
    print_error(endpoints ? "bench allreduce: cannot connect the ranks" : endpoints.status().message());
    return kExitFailure;
  }
  messaging::Round round = 0;
  std::ostringstream times;
  for (std::uint64_t n : *counts) {
    std::vector<float> data(n, static_cast<float>(o.rank + 1));
    Status s;
    for (int warm = 0; warm < 2 && s.ok(); ++warm) s = allreduce_once(c, o.rank, round++, data);
    std::vector<double> took;
    for (int i = 0; i < o.iterations && s.ok(); ++i) {
      const auto t0 = Clock::now();
      s = allreduce_once(c, o.rank, round++, data);
      took.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (!s.ok()) {
      print_error(s.message());
      return kExitFailure;
    }
    times << n << ' ' << median(took) << '\n';
    // Rank r contributes r + 1 everywhere, with weight 1: the mean is (N + 1) / 2.
    const float want = static_cast<float>(o.processes + 1) / 2.0f;
    const auto mean = c.mean(o.rank);
    if (mean.size() != n || std::any_of(mean.begin(), mean.end(), [&](float v) { return std::abs(v - want) > 1e-5f * want; })) {
      print_error("bench allreduce: rank " + std::to_string(o.rank) + " got a wrong mean of " + std::to_string(n) +
                  " floats");
      return kExitFailure;
    }
  }
  // Nobody leaves before every rank is done with the last round.
  const std::vector<float> one(1, 1.0f);
  if (Status s = allreduce_once(c, o.rank, round++, one); !s.ok()) {
    print_error(s.message());
    return kExitFailure;
  }
  if (o.rank == 0) std::ofstream(fs::path(o.dir) / "ours.txt") << times.str();
  return kExitOk;
}

// "n seconds" lines into n -> seconds.
std::map<std::uint64_t, double> read_times(const fs::path& p) {
  std::map<std::uint64_t, double> out;
  std::ifstream in(p);
  std::uint64_t n = 0;
  double t = 0;
  while (in >> n >> t) out[n] = t;
  return out;
}

// Runs argv (argv[0] a path) and waits at most `limit`; its exit status, or
// nullopt when it could not start, or was killed at the limit or on `stop`
// (SIGTERM first: mpirun passes it on to its ranks).
std::optional<int> run_and_wait(std::vector<std::string> args, std::chrono::seconds limit, bool quiet,
                                std::stop_token stop) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return std::nullopt;
  auto deadline = Clock::now() + limit;
  bool terminated = false;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (stop.stop_requested() && !terminated) {
      kill(pid, SIGTERM);
      terminated = true;
      deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    }
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (terminated) return std::nullopt;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// What a rank's exit code from run_and_wait says.
std::string ended(const std::optional<int>& code) {
  if (!code) return "did not start, or ran past its time";
  if (*code > 128) return std::string("was killed by signal ") + std::to_string(*code - 128) + " (" +
                          sigabbrev_np(*code - 128) + ")";
  return "exited with status " + std::to_string(*code) + " (its error is above)";
}

std::vector<std::string> rank_flags(const AllreduceOptions& o) {
  std::string sizes;
  for (const auto& s : o.sizes) sizes += (sizes.empty() ? "" : ",") + s;
  return {"--sizes", sizes, "--iterations", std::to_string(o.iterations), "--compress", o.compress};
}

// Our N ranks, over tcp or (shared memory on) through shared memory; rank
// 0's times by size.
Result<std::map<std::uint64_t, double>> measure_ours(const AllreduceOptions& o, const fs::path& parent,
                                                     const std::string& shared_memory, std::stop_token stop) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const fs::path dir = parent / ("ours-" + shared_memory);
  fs::remove_all(dir);  // a round before left its ranks' endpoints here
  fs::create_directories(dir);
  std::vector<std::thread> ranks;
  std::vector<std::optional<int>> codes(o.processes);
  // A rank that ends badly stops the others at once: they would wait a
  // minute for its part of the round, and then blame each other.
  std::stop_source ranks_stop;
  std::stop_callback interrupted(stop, [&] { ranks_stop.request_stop(); });
  std::mutex mu;
  std::optional<std::uint32_t> first_failed;
  for (std::uint32_t r = 0; r < o.processes; ++r) {
    ranks.emplace_back([&, r] {
      std::vector<std::string> args = {self, "allreduce-rank", "--rank", std::to_string(r), "--processes",
                                       std::to_string(o.processes), "--dir", dir.string(), "--shared-memory",
                                       shared_memory, "--parent", std::to_string(getpid())};
      for (auto& f : rank_flags(o)) args.push_back(f);
      codes[r] = run_and_wait(args, std::chrono::seconds(600), false, ranks_stop.get_token());
      if (codes[r] == 0 || ranks_stop.stop_requested()) return;
      std::lock_guard lock(mu);
      first_failed = first_failed.value_or(r);
      ranks_stop.request_stop();
    });
  }
  for (auto& t : ranks) t.join();
  if (stop.stop_requested()) return Status::Cancelled("bench allreduce: interrupted");
  if (first_failed)
    return Status::Internal("bench allreduce: our rank " + std::to_string(*first_failed) + " " +
                            ended(codes[*first_failed]) + "; the other ranks were stopped");
  return read_times(dir / "ours.txt");
}

// Whether an executable `name` is in a folder of $PATH.
[[maybe_unused]] bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "";
  while (!rest.empty()) {
    const auto colon = rest.find(':');
    const std::string folder(rest.substr(0, colon));
    if (!folder.empty() && ::access((fs::path(folder) / name).c_str(), X_OK) == 0) return true;
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
  }
  return false;
}

// MPI_Allreduce under mpirun over `btl`; empty when it is not built in or
// mpirun fails (said on stderr).
std::map<std::uint64_t, double> measure_mpi(const AllreduceOptions& o, const fs::path& dir, const std::string& btl,
                                            std::stop_token stop) {
#ifdef ASGD_BENCH_MPI
  const fs::path out = dir / ("mpi." + btl + ".txt");
  std::vector<std::string> args = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                                   std::to_string(o.processes), "--mca", "pml", "ob1", "--mca", "btl", btl,
                                   fs::read_symlink("/proc/self/exe").string(), "allreduce-mpi", "--out", out.string()};
  for (auto& f : rank_flags(o)) args.push_back(f);
  // Open MPI leaves allocations behind at MPI_Finalize (it unloads its
  // components): under AddressSanitizer its ranks do not look for leaks.
  if (const char* asan = std::getenv("ASAN_OPTIONS"))
    args.insert(args.begin() + 1, {"-x", std::string("ASAN_OPTIONS=") + asan + ":detect_leaks=0"});
  const auto code = run_and_wait(args, std::chrono::seconds(600), true, stop);
  if (stop.stop_requested()) return {};
  if (!code || *code != 0) {
    if (!on_path("mpirun"))
      std::fprintf(stderr, "bench allreduce: mpirun is not on PATH (Open MPI's openmpi-bin): no MPI side\n");
    else
      std::fprintf(stderr, "bench allreduce: mpirun over btl %s failed (%s)\n", btl.c_str(),
                   code ? ("exit " + std::to_string(*code)).c_str() : "it did not start or was stopped");
    return {};
  }
  return read_times(out);
#else
  (void)o, (void)dir, (void)btl, (void)stop;
  return {};
#endif
}

double bus_gbps(std::uint64_t floats, std::uint32_t n, double seconds) {
  return seconds > 0 ? 2.0 * (n - 1) / n * static_cast<double>(floats) * 4.0 / seconds / 1e9 : 0.0;
}

int run_allreduce(const AllreduceOptions& o) {
  auto counts = float_counts(o.sizes);
  if (!counts || (o.compress != "none" && o.compress != "fp16")) {
    print_error(counts ? "--compress " + o.compress + ": none or fp16" : counts.status().message());
    return kExitUsage;
  }
  const fs::path dir = fs::temp_directory_path() / ("asgd-bench-allreduce-" + std::to_string(getpid()));
  fs::create_directories(dir);
  // Ctrl-C or SIGTERM: the ranks and mpirun are ended, the folder removed.
  const Interrupts interrupts;
  const std::stop_token stop = interrupts.token();
  // Each round runs the four sides one after another; over rounds, each
  // side's median per size (the machine's speed drifts between them).
  std::vector<std::map<std::uint64_t, double>> runs[4];
  for (int round = 0; round < o.rounds; ++round) {
    for (const char* shm : {"off", "on"}) {
      auto ours = measure_ours(o, dir, shm, stop);
      const bool tcp = std::string(shm) == "off";
      if (ours) runs[tcp ? 1 : 3].push_back(measure_mpi(o, dir, tcp ? "self,tcp" : "self,vader", stop));
      if (!ours || stop.stop_requested()) {
        fs::remove_all(dir);
        print_error(ours ? "bench allreduce: interrupted" : ours.status().message());
        return kExitFailure;
      }
      runs[tcp ? 0 : 2].push_back(*ours);
    }
  }
  fs::remove_all(dir);
  auto medians = [&](int side) {
    std::map<std::uint64_t, double> out;
    for (std::uint64_t n : *counts) {
      std::vector<double> t;
      for (const auto& run : runs[side])
        if (auto it = run.find(n); it != run.end()) t.push_back(it->second);
      if (!t.empty()) out[n] = median(t);
    }
    return out;
  };
  const auto ours_tcp = medians(0), mpi_tcp = medians(1), ours_shm = medians(2), mpi_shm = medians(3);
  nlohmann::json sizes = nlohmann::json::array();
  if (!o.json)
    std::printf("%u processes, bus bandwidth 2(N-1)/N x float32 bytes / time, GB/s (median of %d all-reduces%s%s)\n"
                "%10s  %9s  %9s  %9s  %6s  %9s\n",
                o.processes, o.iterations, o.rounds > 1 ? (", then of " + std::to_string(o.rounds) + " rounds").c_str() : "",
                o.compress == "fp16" ? "; ours sends float16" : "", "floats", "transport",
                "ours", "mpi", "ratio", "ours ms");
  auto value = [](const std::map<std::uint64_t, double>& m, std::uint64_t n) {
    const auto it = m.find(n);
    return it == m.end() ? 0.0 : it->second;
  };
  bool mpi_missing = false;
  for (std::uint64_t n : *counts) {
    for (const char* transport : {"tcp", "shm"}) {
      const bool tcp = std::string(transport) == "tcp";
      const double t = value(tcp ? ours_tcp : ours_shm, n);
      const double ours_gbps = bus_gbps(n, o.processes, t);
      const double mpi_t = value(tcp ? mpi_tcp : mpi_shm, n);
      const double mpi_gbps = bus_gbps(n, o.processes, mpi_t);
      nlohmann::json row = {{"floats", n}, {"transport", transport}};
      row["ours_gbps"] = ours_gbps > 0 ? nlohmann::json(ours_gbps) : nlohmann::json(nullptr);
      row["mpi_gbps"] = mpi_gbps > 0 ? nlohmann::json(mpi_gbps) : nlohmann::json(nullptr);
      row["ratio"] = ours_gbps > 0 && mpi_gbps > 0 ? nlohmann::json(ours_gbps / mpi_gbps) : nlohmann::json(nullptr);
      row["ours_ms"] = t > 0 ? nlohmann::json(t * 1e3) : nlohmann::json(nullptr);
      row["mpi_ms"] = mpi_t > 0 ? nlohmann::json(mpi_t * 1e3) : nlohmann::json(nullptr);
      sizes.push_back(row);
      mpi_missing = mpi_missing || mpi_gbps <= 0;
      // Rounded, not cut: a ratio of 0.8996 beside a 0.9 target said 0.89.
      const auto shown = [](double v, int decimals) { return v > 0 ? fmt::format("{:.{}f}", v, decimals) : "-"; };
      if (!o.json)
        std::printf("%10llu  %9s  %9s  %9s  %6s  %9s\n", static_cast<unsigned long long>(n), transport,
                    shown(ours_gbps, 3).c_str(), shown(mpi_gbps, 3).c_str(),
                    shown(row["ratio"].is_null() ? 0.0 : ours_gbps / mpi_gbps, 2).c_str(), shown(t * 1e3, 4).c_str());
    }
  }
  if (o.json)
    std::printf("%s\n", nlohmann::json{{"processes", o.processes}, {"rounds", o.rounds}, {"iterations", o.iterations},
                                       {"compress", o.compress}, {"sizes", sizes}}.dump().c_str());
#ifdef ASGD_BENCH_MPI
  // The comparison is what this measures: without Open MPI's side it failed.
  if (mpi_missing) {
    print_error("bench allreduce: Open MPI's side did not run (above); ours alone is printed");
    return kExitFailure;
  }
#else
  if (mpi_missing && !o.json)
    std::printf("this asgd-bench was built without Open MPI (libopenmpi-dev): no MPI side\n");
#endif
  return kExitOk;
}

}  // namespace

int run_allreduce_mpi_rank(const std::string& out, const std::vector<std::uint64_t>& counts, int iterations);

AllreduceBench add_allreduce_bench(CLI::App* bench) {
  auto o = std::make_shared<AllreduceOptions>();
  auto* cmd = bench->add_subcommand(
      "allreduce",
      "the workers' all-reduce across processes (ZeroMQ ring over tcp; shared memory on one host) vs Open MPI's "
      "MPI_Allreduce over tcp and shared memory, bus bandwidth");
  cmd->add_option("--processes", o->processes, "ranks, 2 to 64 (default 2)")
      ->type_name("N")
      ->check(quietly(CLI::Range(2, 64)));
  add_list_option(cmd, "--sizes", o->sizes, "floats per all-reduce, comma-separated (default 1M,4M,16M)");
  cmd->add_option("--iterations", o->iterations, "timed all-reduces per size, at least 1 (default 20)")
      ->type_name("N")
      ->check(positive());
  cmd->add_option("--rounds", o->rounds,
                  "times the four sides run, one after another, each then its median (default 1; the machine's speed "
                  "drifts)")
      ->type_name("R")
      ->check(positive());
  cmd->add_option("--compress", o->compress, "none | fp16: ours sends its chunks as float16 (default none)")
      ->type_name("NAME");
  cmd->add_flag("--json", o->json, "print one JSON object instead of a table");
  auto* rank = bench->add_subcommand("allreduce-rank", "")->group("");  // hidden: one of ours
  rank->add_option("--rank", o->rank)->required();
  rank->add_option("--processes", o->processes)->required();
  rank->add_option("--dir", o->dir)->required();
  rank->add_option("--sizes", o->sizes)->delimiter(',');
  rank->add_option("--iterations", o->iterations);
  rank->add_option("--compress", o->compress);
  rank->add_option("--shared-memory", o->shared_memory);
  rank->add_option("--parent", o->parent);
  auto* mpi = bench->add_subcommand("allreduce-mpi", "")->group("");  // hidden: one of mpirun's
  mpi->add_option("--out", o->out)->required();
  mpi->add_option("--sizes", o->sizes)->delimiter(',');
  mpi->add_option("--iterations", o->iterations);
  mpi->add_option("--compress", o->compress);  // passed to every rank; MPI's sum stays float32
  return {[cmd, rank, mpi] { return cmd->parsed() || rank->parsed() || mpi->parsed(); },
          [o, cmd, rank]() -> int {
            if (cmd->parsed()) return run_allreduce(*o);
            if (rank->parsed()) {
              end_with_parent(o->parent);
              return run_rank(*o);
            }
            auto counts = float_counts(o->sizes);
            if (!counts) return kExitUsage;
            return run_allreduce_mpi_rank(o->out, *counts, o->iterations);
          }};
}

}  // namespace asgd::cli
