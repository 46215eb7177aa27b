// Ctrl-C twice: the first asks asgd for a clean stop, a second ends the
// process at once (for a step that never returns, such as a read from a
// hung network mount, where the clean stop would never come); the same
// SIGINT sent twice at once (GNU timeout's, to the process and its group)
// is one.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace {

// Whether a SIGINT waits for process `pid` (its /proc status's pending
// masks, thread or process wide).
bool sigint_pending(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  const unsigned long long bit = 1ull << (SIGINT - 1);
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("SigPnd:") || line.starts_with("ShdPnd:"))
      if (std::stoull(line.substr(7), nullptr, 16) & bit) return true;
  return false;
}

TEST(InterruptCli, ASecondCtrlCEndsTheProcessAtOnce) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  const asgd_test::TempDir scratch;
  const auto log = scratch / "train.log";
  const pid_t pid = asgd_test::start_asgd({"train", "--data-dir", data.string(), "--epochs", "100"}, log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(asgd_test::eventually([&] { return asgd_test::read_file(log).find("epoch 1/100") != std::string::npos; },
                                    std::chrono::seconds(60)))
      << asgd_test::read_file(log);
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  // A second SIGINT sent while the first is still pending merges into it:
  // wait until the first was taken (a slow process, under a sanitizer).
  ASSERT_TRUE(asgd_test::eventually([&] { return !sigint_pending(pid); }));
  // A person's second press comes well after the first (one within half a
  // second is taken for a copy of it), and the clean stop of this small job
  // would be over by then: the process is held stopped meanwhile, the
  // second SIGINT pending until it goes on.
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  const auto code = asgd_test::wait_exit(pid, std::chrono::seconds(30));
  ASSERT_TRUE(code) << asgd_test::read_file(log);
  EXPECT_EQ(*code, 1);
  const std::string printed = asgd_test::read_file(log);
  EXPECT_NE(printed.find("asgd: interrupted again: stopped at once, without a clean stop"), std::string::npos)
      << printed;
  EXPECT_EQ(printed.find("the job was stopped before its end"), std::string::npos) << "no clean stop: " << printed;
}

// `timeout -s INT` sends SIGINT to asgd and then to its process group:
// the second copy, taken after the first, ended the process at once 1 run
// in 4 and every shard checkpoint was lost (a claim file alone was left).
TEST(InterruptCli, TheSameSigintTwiceAtOnceIsOneCleanStop) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  const asgd_test::TempDir scratch;
  const auto log = scratch / "train.log";
  const std::string ck = (scratch / "ck").string();
  const pid_t pid = asgd_test::start_asgd(
      {"train", "--data-dir", data.string(), "--epochs", "100", "--checkpoint-dir", ck, "--checkpoint-every", "30"},
      log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(asgd_test::eventually([&] { return asgd_test::read_file(log).find("epoch 1/100") != std::string::npos; },
                                    std::chrono::seconds(60)))
      << asgd_test::read_file(log);
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  ASSERT_TRUE(asgd_test::eventually([&] { return !sigint_pending(pid); }));  // taken: not merged into the next
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const auto code = asgd_test::wait_exit(pid, std::chrono::seconds(60));
  ASSERT_TRUE(code) << asgd_test::read_file(log);
  EXPECT_EQ(*code, 1);
  const std::string printed = asgd_test::read_file(log);
  EXPECT_EQ(printed.find("interrupted again"), std::string::npos) << printed;
  EXPECT_NE(printed.find("the job was stopped before its end"), std::string::npos) << printed;
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(ck) / "shard-0.ckpt")) << printed;
}

}  // namespace
