#pragma once
// Subcommands of the asgd CLI. Each registers its options on a CLI11 app and
// returns the process exit status: 0 done, 1 runtime failure, 2 usage or
// configuration error.

#include <CLI/CLI.hpp>

#include <functional>

namespace asgd::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

/// Adds `train` to `app`; the returned function runs it after parsing.
std::function<int()> add_train_command(CLI::App& app);

/// Adds `bench` (with `runtime`) to `app`.
std::function<int()> add_bench_command(CLI::App& app);

/// "asgd: error: <message>" on stderr, one line.
void print_error(const std::string& message);

}  // namespace asgd::cli
