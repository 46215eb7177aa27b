// allreduce and gossip with a process per worker (`asgd cluster`): the
// workers' collective goes between their processes (through shared memory
// for allreduce's all-reduce, these processes sharing a host). They train
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

// The metrics of a finished `asgd <command>` run of `policy` (cluster:
// processes; train: one process), its summary last.
std::vector<nlohmann::json> run_job(const std::string& command, const fs::path& data, const std::string& policy,
                                    const std::string& workers, const std::string& epochs) {
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "job.log", metrics = scratch / "run.jsonl";
  const pid_t job = asgd_test::start_asgd({command, "--workers", workers, "--policy", policy, "--epochs", epochs,
                                           "--data-dir", data.string(), "--metrics-out", metrics.string()},
                                          log);
  EXPECT_GT(job, 0);
  const auto code = asgd_test::wait_exit(job, std::chrono::seconds(300));
  EXPECT_TRUE(code && *code == 0) << read_file(log);
  auto lines = asgd_test::read_jsonl(metrics);
  if (lines.empty() || lines.back().value("event", "") != "summary") {
    ADD_FAILURE() << command << " " << policy << ": no summary\n" << read_file(log);
    return {};
  }
  return lines;
}

// The summary line of a finished `asgd cluster` run of `policy`.
nlohmann::json run_cluster(const fs::path& data, const std::string& policy, const std::string& workers) {
  auto lines = run_job("cluster", data, policy, workers, "3");
  return lines.empty() ? nlohmann::json() : lines.back();
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

// Worker processes on one host all-reduce through shared memory, which sums
// in worker order as the in-process collective does: the job learns the
// same bits as in one process (and so as bsp). Three workers: with two of
// equal batches the ring's sums come out the same too (each weight a power
// of two), with three they differ in the ninth digit.
TEST(DecentralizedCluster, AllreduceAsProcessesOnOneHostLearnsTheSameBitsAsInOneProcess) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const auto processes = run_job("cluster", dir, "allreduce", "3", "1");
  const auto one = run_job("train", dir, "allreduce", "3", "1");
  ASSERT_FALSE(processes.empty() || one.empty());
  auto epoch = [](const std::vector<nlohmann::json>& lines) {
    for (const auto& l : lines)
      if (l.value("event", "") == "epoch") return l;
    return nlohmann::json();
  };
  EXPECT_EQ(epoch(processes)["train_loss"].get<double>(), epoch(one)["train_loss"].get<double>());
  EXPECT_EQ(epoch(processes)["val_accuracy"].get<double>(), epoch(one)["val_accuracy"].get<double>());
  EXPECT_EQ(processes.back()["final_test_accuracy"].get<double>(), one.back()["final_test_accuracy"].get<double>());
}

// `asgd cluster` with three workers under `policy`; once worker 1 has
// finished its first epoch, its process gets `signal`. The cluster's pid, or
// 0 after a failure already reported.
pid_t signal_worker_1_after_epoch_1(const fs::path& data, const std::string& policy, const std::string& epochs,
                                    const std::string& heartbeat, const fs::path& log, const fs::path& metrics,
                                    int signal, pid_t* victim_out) {
  const pid_t cluster = asgd_test::start_asgd({"cluster", "--workers", "3", "--policy", policy, "--epochs", epochs,
                                               "--data-dir", data.string(), "--heartbeat-timeout", heartbeat,
                                               "--metrics-out", metrics.string()},
                                              log);
  EXPECT_GT(cluster, 0);
  if (cluster <= 0) return 0;
  if (!asgd_test::wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster)) {
    ADD_FAILURE() << read_file(log);
    return 0;
  }
  const auto victim = asgd_test::child_with_args(cluster, {"worker", "--index", "1"});
  if (!victim || kill(*victim, signal) != 0) {
    ADD_FAILURE() << "no worker 1 process under " << cluster;
    return 0;
  }
  *victim_out = *victim;
  return cluster;
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
  pid_t victim = 0;
  const pid_t cluster = signal_worker_1_after_epoch_1(dir, policy, "5", "3", log, metrics, SIGKILL, &victim);
  ASSERT_GT(cluster, 0);
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

// A worker process stopped (SIGSTOP) sends no heartbeat: the coordinator
// declares it lost and asgd cluster ends the stopped process (SIGKILL), so
// that it cannot wake up later and write into the all-reduce the others
// share (allreduce), nor hold asgd cluster after the job's end (bsp: told to
// stop, a stopped process cannot answer; the supervisor waited 15 s).
class StoppedWorker : public ::testing::TestWithParam<const char*> {};

TEST_P(StoppedWorker, IsEndedByTheSupervisorWhenDeclaredLostAndTheOthersFinish) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log", metrics = scratch / "run.jsonl";
  pid_t victim = 0;
  const pid_t cluster = signal_worker_1_after_epoch_1(dir, GetParam(), "3", "2", log, metrics, SIGSTOP, &victim);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(asgd_test::wait_for_text(log, "was declared lost but has not exited", std::chrono::seconds(30), cluster))
      << read_file(log);
  ASSERT_TRUE(asgd_test::wait_for_text(log, "done: test accuracy", std::chrono::seconds(180), cluster))
      << read_file(log);
  const auto code = asgd_test::wait_exit(cluster, std::chrono::seconds(180));
  if (!code) kill(victim, SIGKILL);
  ASSERT_TRUE(code) << "the cluster hung after worker 1 stopped:\n" << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("is silent but has not exited: ending it (SIGKILL)"), std::string::npos) << text;
  EXPECT_EQ(text.find("has not ended 5 s after it was told to stop"), std::string::npos) << text;
  EXPECT_NE(kill(victim, 0), 0) << "the stopped worker's process still exists";
  const auto lines = asgd_test::read_jsonl(metrics);
  ASSERT_FALSE(lines.empty());
  // Lost for good under allreduce (a ring takes no one mid-job); under bsp
  // the process started in its place rejoins.
  const nlohmann::json& summary = lines.back();
  EXPECT_EQ(summary["workers_lost"].get<int>() + summary["workers_rejoined"].get<int>(), 1) << summary.dump();
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.97) << summary.dump();
}

INSTANTIATE_TEST_SUITE_P(Policies, StoppedWorker, ::testing::Values("allreduce", "bsp"), asgd_test::policy_test_name);

INSTANTIATE_TEST_SUITE_P(DecentralizedPolicies, WorkerKilledInTheRing, ::testing::Values("allreduce", "gossip:2"),
                         asgd_test::policy_test_name);

}  // namespace
}  // namespace asgd
