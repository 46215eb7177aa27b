// allreduce and gossip with a process per worker (`asgd cluster`): the
// workers' collective goes over ZeroMQ between their processes. They train
// MNIST as in one process, and a worker process killed mid-job stops the job
// at once, naming it, instead of leaving its peers waiting in the ring.

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

TEST(DecentralizedCluster, AWorkerProcessKilledUnderAllreduceStopsTheJobAtOnceNamingIt) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const pid_t cluster = asgd_test::start_asgd({"cluster", "--workers", "3", "--policy", "allreduce", "--epochs", "5",
                                               "--data-dir", dir.string(), "--heartbeat-timeout", "3",
                                               "--max-restarts", "0"},
                                              log);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(asgd_test::wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster))
      << read_file(log);
  const auto victim = asgd_test::child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "no worker 1 process under " << cluster;
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  // asgd cluster sees its process end and tells the coordinator, which
  // stops the job without waiting out --heartbeat-timeout (3 s here).
  const auto stopped = asgd_test::wait_for_text(log, "job failed: worker 1 is lost", std::chrono::seconds(30), cluster);
  ASSERT_TRUE(stopped) << read_file(log);
  EXPECT_LT(*stopped, 3.0) << read_file(log);
  const auto code = asgd_test::wait_exit(cluster, std::chrono::seconds(60));
  ASSERT_TRUE(code) << "the cluster hung after worker 1 died:\n" << read_file(log);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(*code, 0) << read_file(log);
  EXPECT_LT(took, 3.0 + 10.0) << "the processes took too long to stop";
  const std::string text = read_file(log);
  EXPECT_NE(text.find("worker 1 is lost"), std::string::npos) << text;
  EXPECT_NE(text.find("under policy allreduce the workers exchange with each other and cannot go on without it"),
            std::string::npos)
      << text;
  std::printf("worker 1 killed under allreduce: the job failed %.2f s later, the cluster exited %.1f s later (%d)\n",
              *stopped, took, *code);
}

}  // namespace
}  // namespace asgd
