// asgd-bench: the benchmarks, a program of their own so that building asgd
// (the README's first command) does not wait for them. `asgd bench ARGS`
// runs it with ARGS; run alone it behaves the same.

#include <string>
#include <vector>

#include "tools/asgd/commands.hpp"

int main(int argc, char** argv) {
  using namespace asgd::cli;
  reexec_with_better_blas_kernels(argv);
  name_this_process();
  keep_freed_memory_for_reuse();
  CLI::App app{"asgd bench: what the runtime, the wire, the kernels and the shards under load cost"};
  app.name("asgd bench");
  auto run = add_bench_commands(app);
  refuse_mistyped_flags(app);
  const auto explain = [&app](const std::vector<std::string>& typed, const CLI::ParseError& e) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({}))
      if (!sub->get_group().empty()) names += (names.empty() ? "" : ", ") + sub->get_name();
    const std::string first = typed.empty() ? "" : typed.front();
    const bool unknown = !first.empty() && !first.starts_with("-") && app.get_subcommands().empty();
    if (unknown) return "unknown benchmark " + first + "; the benchmarks: " + names + " (asgd bench --help says what each measures)";
    return explain_parse_error(app, typed, e);  // an unknown flag of a benchmark: the nearest one
  };
  if (const auto code = parse_arguments(app, std::vector<std::string>(argv + 1, argv + argc), explain)) return *code;
  return run();
}
