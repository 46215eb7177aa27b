// asgd: the command-line front end. Parses the command, dispatches to one
// subcommand, and maps failures to exit codes (0 ok, 1 runtime, 2 usage).

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "tools/asgd/commands.hpp"

namespace {

// `asgd bench ...` runs the benchmarks, a program of their own (asgd-bench,
// built beside asgd) so that building asgd does not wait for them: every
// argument after `bench` is passed on unread, --help included.
std::function<int()> add_bench_passthrough(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks: runtime, comm, compute, load, allreduce (the program asgd-bench)");
  bench->prefix_command();
  bench->set_help_flag();
  bench->allow_extras();
  return [bench]() -> int {
    const std::string program = asgd::cli::sibling_program("asgd-bench");
    std::vector<std::string> args = bench->remaining();
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    asgd::cli::print_error("asgd bench runs " + program + ", which " +
                           (errno == ENOENT ? std::string("is not built") : "could not start: " + std::string(std::strerror(errno))) +
                           "; build it with scripts/build asgd-bench");
    return asgd::cli::kExitFailure;
  };
}

// A process of a job holds descriptors for ZeroMQ's sockets and, for every
// peer on its host, for the shared-memory slots both sides write (8 per
// pair): a coordinator of a few hundred worker processes would pass the
// usual soft limit of 1024 open files. Like most servers, take the hard
// limit (capped where the kernel caps it); where that fails, slots that
// cannot be opened leave their tensors on the socket.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, rlim_t{1} << 20);
  (void)setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace asgd::cli;
  reexec_with_better_blas_kernels(argv);
  name_this_process();
  keep_freed_memory_for_reuse();
  raise_open_file_limit();
  CLI::App app{"asgd: a runtime for data-parallel stochastic gradient descent"};
  app.name("asgd");
  app.require_subcommand(1);
  app.set_version_flag("--version", "asgd 0.1.0");
  auto train = add_train_command(app);
  auto compare = add_compare_command(app);
  auto roles = add_cluster_commands(app);
  auto export_model = add_export_command(app);
  auto keys = add_keys_command(app);
  auto data = add_data_command(app);
  auto devices = add_devices_command(app);
  auto bench = add_bench_passthrough(app);
  asgd::cli::refuse_mistyped_flags(app);
  // With no arguments at all, `asgd` says what it can do (`asgd train` runs
  // the embedded default job).
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cout << app.help() << "\nTrain the embedded default job: asgd train\n";
    return kExitOk;
  }
  const auto explain = [&app](const std::vector<std::string>& typed, const CLI::ParseError& e) {
    return explain_parse_error(app, typed, e);
  };
  if (const auto code = parse_arguments(app, std::move(args), explain)) return *code;
  asgd::logger().set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  for (auto* sub : app.get_subcommands()) {
    if (sub->get_name() == "train") return train();
    if (sub->get_name() == "compare") return compare();
    if (sub->get_name() == "cluster" || sub->get_name() == "coordinator" || sub->get_name() == "shard" ||
        sub->get_name() == "worker")
      return roles(sub->get_name());
    if (sub->get_name() == "bench") return bench();
    if (sub->get_name() == "export") return export_model();
    if (sub->get_name() == "keys") return keys();
    if (sub->get_name() == "data") return data();
    if (sub->get_name() == "devices") return devices();
  }
  print_error("no command given; try --help");
  return kExitUsage;
}
