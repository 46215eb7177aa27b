// asgd: the command-line front end. Parses the command, dispatches to one
// subcommand, and maps failures to exit codes (0 ok, 1 runtime, 2 usage).

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "compute/blas.hpp"

#include "tools/asgd/commands.hpp"

namespace {

// OpenBLAS picks its kernels when it loads, before main(); where it picked
// its slow generic ones on a CPU it does not know, start again once with
// OPENBLAS_CORETYPE set. A value the user set is always left alone.
void reexec_with_better_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  const std::string core = asgd::blas::suggested_coretype();
  if (core.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // execv only returns on failure: carry on with the kernels we have.
}

}  // namespace

int main(int argc, char** argv) {
  using namespace asgd::cli;
  reexec_with_better_blas_kernels(argv);
  CLI::App app{"asgd: a runtime for data-parallel stochastic gradient descent"};
  app.name("asgd");
  app.require_subcommand(1);
  app.set_version_flag("--version", "asgd 0.1.0");
  auto train = add_train_command(app);
  auto compare = add_compare_command(app);
  auto roles = add_cluster_commands(app);
  auto export_model = add_export_command(app);
  auto keys = add_keys_command(app);
  std::function<int()> bench;
#ifdef ASGD_WITH_BENCH
  bench = add_bench_command(app);
#endif
  // With no arguments at all, `asgd` behaves as `asgd train`: the embedded default.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) args.push_back("train");
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return kExitUsage;
  }
  spdlog::set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  for (auto* sub : app.get_subcommands()) {
    if (sub->get_name() == "train") return train();
    if (sub->get_name() == "compare") return compare();
    if (sub->get_name() == "cluster" || sub->get_name() == "coordinator" || sub->get_name() == "shard" ||
        sub->get_name() == "worker")
      return roles(sub->get_name());
    if (sub->get_name() == "bench" && bench) return bench();
    if (sub->get_name() == "export") return export_model();
    if (sub->get_name() == "keys") return keys();
  }
  print_error("no command given; try --help");
  return kExitUsage;
}
