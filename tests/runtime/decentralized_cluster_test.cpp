// allreduce and gossip with a process per worker (`asgd cluster`): the
// workers' collective goes over ZeroMQ between their processes. They train
// MNIST as in one process, and when a worker process is killed mid-job the
// others drop it from their ring and finish, instead of waiting for it.

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;
using asgd_test::read_file;

// The summary line of a finished `asgd cluster` run of `policy`.
nlohmann::json run_cluster(const fs::path& data, const std::string& policy, const std::string& workers) {
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log", metrics = scratch / "run.jsonl";
  const pid_t cluster = asgd_test::start_asgd({"cluster", "--workers", workers, "--policy", policy, "--epochs", "3",
                                               "--data-dir", data.string(), "--metrics-out", metrics.string()},
                                              log);
  EXPECT_GT(cluster, 0);
  const auto code = asgd_test::wait_exit(cluster, std::chrono::seconds(300));
  EXPECT_TRUE(code && *code == 0) << read_file(log);
  const auto lines = asgd_test::read_jsonl(metrics);
  if (lines.empty() || lines.back().value("event", "") != "summary") {
    ADD_FAILURE() << policy << ": no summary\n" << read_file(log);
    return {};
  }
  return lines.back();
}

TEST(DecentralizedCluster, AllreduceAndGossipTrainMnistAsProcessesToAtLeast97PercentInThreeEpochs) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  for (const std::string policy : {"allreduce", "gossip:2"}) {
    const nlohmann::json s = run_cluster(dir, policy, "2");
    if (s.is_null()) continue;
    EXPECT_GE(s["final_test_accuracy"].get<double>(), 0.97) << policy << ": " << s.dump();
    EXPECT_LE(s["staleness_max"].get<double>(), policy == "allreduce" ? 0.0 : 2.0) << s.dump();
    EXPECT_GT(s["updates_applied"].get<std::uint64_t>(), 0u);
    std::printf("asgd cluster --policy %s: final_test_accuracy %.4f, train %.1f s\n", policy.c_str(),
                s["final_test_accuracy"].get<double>(), s["train_s"].get<double>());
  }
}

// A worker process killed mid-job: the coordinator declares it lost at once
// (asgd cluster saw it end), tells the others, whose ring goes on without
// it, and the job finishes; the process asgd cluster starts in its place is
// not taken (a ring cannot take a new member mid-job).
class WorkerKilledInTheRing : public ::testing::TestWithParam<const char*> {};

TEST_P(WorkerKilledInTheRing, TheOthersGoOnWithoutItAndTheJobFinishesAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const std::string policy = GetParam();
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log", metrics = scratch / "run.jsonl";
  const pid_t cluster = asgd_test::start_asgd({"cluster", "--workers", "3", "--policy", policy, "--epochs", "5",
                                               "--data-dir", dir.string(), "--heartbeat-timeout", "3",
                                               "--metrics-out", metrics.string()},
                                              log);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(asgd_test::wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster))
      << read_file(log);
  const auto victim = asgd_test::child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "no worker 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto noticed = asgd_test::wait_for_text(log, "worker 1 is lost", std::chrono::seconds(30), cluster);
  ASSERT_TRUE(noticed) << read_file(log);
  EXPECT_LT(*noticed, 3.0) << "not declared lost within --heartbeat-timeout";
  const auto code = asgd_test::wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << "the cluster hung after worker 1 died:\n" << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("a new process cannot join it mid-job"), std::string::npos) << text;
  const auto lines = asgd_test::read_jsonl(metrics);
  ASSERT_FALSE(lines.empty());
  const nlohmann::json& summary = lines.back();
  ASSERT_EQ(summary.value("event", ""), "summary") << text;
  EXPECT_EQ(summary["workers_lost"], 1);
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.97) << summary.dump();
  std::printf("%s: worker 1 killed after epoch 1, declared lost %.2f s later; the other two finished at %.4f\n",
              policy.c_str(), *noticed, summary["final_test_accuracy"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(DecentralizedPolicies, WorkerKilledInTheRing, ::testing::Values("allreduce", "gossip:2"),
                         asgd_test::policy_test_name);

}  // namespace
}  // namespace asgd
