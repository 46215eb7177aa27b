// asgd-bench: the benchmarks, a program of their own so that building asgd
// (the README's first command) does not wait for them. `asgd bench ARGS`
// runs it with ARGS; run alone it behaves the same.

#include <algorithm>
#include <string>
#include <vector>

#include "tools/asgd/commands.hpp"

int main(int argc, char** argv) {
  using namespace asgd::cli;
  reexec_with_better_blas_kernels(argv);
  CLI::App app{"asgd bench: what the runtime, the wire, the kernels and the shards under load cost"};
  app.name("asgd bench");
  auto run = add_bench_commands(app);
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string first = args.empty() ? "" : args.front();
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first; parse() consumes them
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({}))
      if (!sub->get_group().empty()) names += (names.empty() ? "" : ", ") + sub->get_name();
    const bool unknown = !first.empty() && !first.starts_with("-") && app.get_subcommands().empty();
    print_error((unknown ? "unknown benchmark " + first + "; the benchmarks: " + names
                         : std::string(e.what())) +
                " (asgd bench --help says what each measures)");
    return kExitUsage;
  }
  return run();
}
