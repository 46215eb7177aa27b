// asgd takes the hard limit on open files: a process of a job holds a
// descriptor per socket and per shared-memory slot of each peer on its host.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/cli_run.hpp"
#include "temp_dir.hpp"

namespace asgd_test {
namespace {

TEST(OpenFiles, AnAsgdProcessRaisesItsSoftLimitToTheHardOne) {
  const TempDir dir;
  const std::string limits = (dir / "limits").string();
  // A worker waiting (up to 3 s) for a coordinator nobody runs; its limits
  // are read while it waits, from its /proc entry, until they change.
  const std::string script =
      "ulimit -S -n 256\n" + std::string(asgd_cli_path()) +
      " worker --coordinator tcp://127.0.0.1:1 --join-timeout 3 >/dev/null 2>&1 &\npid=$!\n"
      "for i in $(seq 50); do\n"
      "  grep '^Max open files' /proc/$pid/limits > '" + limits + ".now' 2>/dev/null || break\n"
      "  mv '" + limits + ".now' '" + limits + "'\n"
      "  grep -qv ' 256 ' '" + limits + "' && break\n"
      "  sleep 0.1\n"
      "done\n"
      "wait\n";
  {
    std::ofstream(dir / "run.sh") << script;
  }
  (void)std::system(("sh '" + (dir / "run.sh").string() + "'").c_str());  // the worker's own exit: no coordinator
  const std::string line = slurp(limits);
  ASSERT_TRUE(line.starts_with("Max open files")) << "the worker's limits were not read while it ran: '" << line << "'";
  // "Max open files            SOFT                 HARD                 files"
  std::istringstream fields(line.substr(std::string("Max open files").size()));
  std::string soft, hard;
  fields >> soft >> hard;
  // The hard limit, or 2^20 (where the kernel's own cap usually is) above it.
  const bool capped = hard == "unlimited" || std::stoull(hard) > (1ull << 20);
  EXPECT_EQ(soft, capped ? std::to_string(1ull << 20) : hard) << line;
}

}  // namespace
}  // namespace asgd_test
