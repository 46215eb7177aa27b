#pragma once
// Runs the asgd binary as a user would and captures what it printed.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "temp_dir.hpp"
#include "test_helpers.hpp"

namespace asgd_test {

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// `asgd ARGS` with stdin closed; stdout and stderr go to a scratch folder
/// of the call's own (so calls from several threads do not mix). With
/// `cwd`, it runs in that folder (relative paths in ARGS are its); with
/// `launcher`, under it (`taskset -c 1`).
inline CliRun asgd(const std::string& args, const std::filesystem::path& cwd = {}, const std::string& launcher = "") {
  static std::atomic<int> calls{0};
  const TempDir dir_holder("_stdio" + std::to_string(calls++));
  const std::filesystem::path& dir = dir_holder.path();
  const std::string cd = cwd.empty() ? "" : "cd '" + cwd.string() + "' && ";
  const std::string cmd = cd + (launcher.empty() ? "" : launcher + " ") + std::string(asgd_cli_path()) + " " + args + " >" + (dir / "out").string() + " 2>" +
                          (dir / "err").string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  return r;
}

/// Exit `code` with exactly one line on stderr, "asgd: error: ...", holding `needle`.
inline void expect_one_line_error(const CliRun& r, int code, const std::string& needle) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("asgd: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  // What the user must fix reads as the message alone, in every command.
  if (code == 2) {
    EXPECT_EQ(r.err.rfind("asgd: error: invalid argument", 0), std::string::npos) << r.err;
  }
}

}  // namespace asgd_test
