// `asgd cluster` and its coordinator watch each other: a coordinator that
// is stopped or hung is ended within --heartbeat-timeout, naming it, and a
// coordinator whose `asgd cluster` died stops the job, so that no process
// of it trains on unsupervised. When the job fails, the shard and worker
// processes say so in their exit status, and none is started again.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/process.hpp"
#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using asgd_test::child_with_args;
using asgd_test::read_file;
using asgd_test::start_asgd;
using asgd_test::wait_exit;
using asgd_test::wait_for_text;

// A long default job as processes (2 workers, 1 shard), --heartbeat-timeout
// 3, once its first epoch is done: the pid of its `asgd cluster`.
pid_t start_long_cluster(const fs::path& data, const fs::path& log) {
  const pid_t cluster =
      start_asgd({"cluster", "--epochs", "40", "--data-dir", data.string(), "--heartbeat-timeout", "3"}, log);
  EXPECT_GT(cluster, 0);
  EXPECT_TRUE(cluster > 0 && wait_for_text(log, "worker 0: finished epoch 1:", std::chrono::seconds(120), cluster))
      << read_file(log);
  return cluster;
}

// Whether process `pid` has ended: gone, or a zombie nobody reaped yet
// (an orphan's new parent may be slow to).
bool ended(pid_t pid) { return !process_can_act(pid); }

// A long cluster whose coordinator was sent `signal`: the coordinator's pid
// (-1 when it never got that far), asgd cluster's exit code, the seconds
// from the signal to its end, and what it wrote.
struct Signalled {
  pid_t coordinator = -1;
  std::optional<int> code;
  double took_s = 0;
  std::string text;
};
Signalled signal_the_coordinator(const fs::path& data, const fs::path& log, int signal) {
  Signalled out;
  const pid_t cluster = start_long_cluster(data, log);
  if (::testing::Test::HasFailure()) return out;
  const auto coordinator = child_with_args(cluster, {"coordinator", "--supervised"});
  EXPECT_TRUE(coordinator);
  if (!coordinator) return out;
  out.coordinator = *coordinator;
  const auto sent = Clock::now();
  EXPECT_EQ(kill(*coordinator, signal), 0);
  out.code = wait_exit(cluster, std::chrono::seconds(60));
  out.took_s = std::chrono::duration<double>(Clock::now() - sent).count();
  out.text = read_file(log);
  return out;
}

TEST(CoordinatorSupervision, AStoppedCoordinatorIsEndedWithinTheHeartbeatTimeoutAndNamed) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const Signalled s = signal_the_coordinator(dir, scratch / "cluster.log", SIGSTOP);
  ASSERT_GT(s.coordinator, 0);
  const std::string& text = s.text;
  ASSERT_TRUE(s.code) << "asgd cluster waited on a stopped coordinator: " << text;
  EXPECT_EQ(*s.code, 1) << text;
  EXPECT_LE(s.took_s, 10.0) << text;  // 3 s of silence, then at most the others' 5 s to stop
  EXPECT_NE(text.find("the coordinator (pid " + std::to_string(s.coordinator) + ") has said nothing for 3 s"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("starting it again"), std::string::npos) << "restarted a process while the coordinator was stopped: "
                                                              << text;
  EXPECT_EQ(text.find("asgd supervision:"), std::string::npos) << "the supervisor's own lines were shown: " << text;
  std::printf("a stopped coordinator: asgd cluster ended %.1f s later, exit %d\n", s.took_s, *s.code);
}

// A coordinator killed: its death is said first, then the others' lines
// (each says it was interrupted: the cause came last, after all of them).
TEST(CoordinatorSupervision, AKilledCoordinatorIsNamedBeforeTheOthersSayTheyWereStopped) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const Signalled s = signal_the_coordinator(dir, scratch / "cluster.log", SIGKILL);
  ASSERT_GT(s.coordinator, 0);
  const std::string& text = s.text;
  ASSERT_TRUE(s.code) << text;
  EXPECT_EQ(*s.code, 1) << text;
  const auto named = text.find("the coordinator (pid " + std::to_string(s.coordinator) + ") was killed by signal 9");
  ASSERT_NE(named, std::string::npos) << text;
  const auto interrupted = text.find("interrupted");
  EXPECT_TRUE(interrupted == std::string::npos || named < interrupted) << text;
}

TEST(CoordinatorSupervision, WhenAsgdClusterDiesItsProcessesStopTheJobAndEnd) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const pid_t cluster = start_long_cluster(dir, log);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<pid_t> processes;
  for (const std::vector<std::string>& words : std::vector<std::vector<std::string>>{
           {"coordinator", "--supervised"}, {"shard", "--index", "0"}, {"worker", "--index", "0"}, {"worker", "--index", "1"}}) {
    const auto pid = child_with_args(cluster, words);
    ASSERT_TRUE(pid) << words[0];
    processes.push_back(*pid);
  }
  ASSERT_EQ(kill(cluster, SIGKILL), 0);
  ASSERT_TRUE(wait_exit(cluster, std::chrono::seconds(10)));
  const auto killed = Clock::now();
  const auto all_ended = [&] {
    for (pid_t p : processes)
      if (!ended(p)) return false;
    return true;
  };
  while (!all_ended() && Clock::now() - killed < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  for (pid_t p : processes) {
    EXPECT_TRUE(ended(p)) << "process " << p << " trains on without asgd cluster";
    if (!ended(p)) kill(p, SIGKILL);
  }
  std::printf("asgd cluster killed: its 4 processes ended %.1f s later\n", took);
}

}  // namespace
}  // namespace asgd
