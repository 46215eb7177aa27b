// Faults a user meets in a real cluster: a worker process killed with
// SIGKILL in the middle of an epoch. The job must finish without it, under
// every policy that runs across processes, and notice the death within the
// heartbeat timeout instead of hanging at a barrier. A shard process
// killed the same way is restarted by asgd cluster and reloads its
// checkpoint; without checkpoints the job stops at once, saying why.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "http_client.hpp"
#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using asgd_test::child_with_args;
using asgd_test::read_file;
using asgd_test::start_asgd;
using asgd_test::wait_exit;
using asgd_test::wait_for_text;

// `asgd cluster` with 3 worker and 2 shard processes on MNIST (mlp) under
// `policy` for `epochs`, --heartbeat-timeout 3, plus `extra` flags; its
// output goes to `log`, its metrics to `metrics`.
pid_t start_cluster(const fs::path& data, const std::string& policy, const std::string& epochs, const fs::path& log,
                    const fs::path& metrics, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"cluster",    "--workers",    "3",         "--shards",      "2",
                                   "--policy",   policy,         "--epochs",  epochs,          "--data-dir",
                                   data.string(), "--heartbeat-timeout", "3", "--metrics-out", metrics.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return start_asgd(args, log);
}

// bsp and averaging get an epoch more to pass 0.97: bsp's 3 workers' summed
// batches make fewer steps, and averaging's replaced copies move less than
// as many applied gradients. With a worker lost after epoch 1 both ended
// 5 epochs at 0.9706-0.9711 (three runs each), too close to the bar.
std::string epochs_for(const std::string& policy) { return policy == "bsp" || policy == "averaging" ? "6" : "5"; }

class WorkerKilledMidEpoch : public ::testing::TestWithParam<const char*> {};

TEST_P(WorkerKilledMidEpoch, TheJobFinishesWithoutItAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  constexpr double kHeartbeatTimeout = 3.0;
  // --max-restarts 0: no new process takes its place (WorkerRestarted below).
  const pid_t cluster = start_cluster(dir, GetParam(), epochs_for(GetParam()), log, metrics, {"--max-restarts", "0"});
  ASSERT_GT(cluster, 0);
  // Mid-epoch: worker 1 has just finished its first epoch. (Its own log
  // line, not the coordinator's epoch line, which waits for an evaluation.)
  ASSERT_TRUE(wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "no worker 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  // Declared dead at once: asgd cluster saw its process end and told the
  // coordinator, which does not wait out --heartbeat-timeout (3 s here).
  const auto noticed = wait_for_text(log, "worker 1 is lost", std::chrono::seconds(30), cluster);
  ASSERT_TRUE(noticed) << read_file(log);
  EXPECT_LT(*noticed, kHeartbeatTimeout - 0.5) << read_file(log);

  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << "the cluster did not finish within 180 s:\n" << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const auto lines = asgd_test::read_jsonl(metrics);
  ASSERT_FALSE(lines.empty());
  const nlohmann::json& summary = lines.back();
  ASSERT_EQ(summary.value("event", ""), "summary") << read_file(log);
  EXPECT_EQ(summary["workers_lost"], 1);
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.97) << summary.dump();
  // Every epoch's record is its own: written as it completed, with its own
  // end time and rate (they once came out in a burst with one wall_s and
  // rates of 1e10 when the lost worker held them back).
  std::vector<nlohmann::json> epochs;
  for (const auto& l : lines)
    if (l.value("event", "") == "epoch") epochs.push_back(l);
  ASSERT_EQ(epochs.size(), std::stoul(epochs_for(GetParam()))) << read_file(metrics);
  // The lost worker's pushes in its last epoch are in the shards: the
  // summary said fewer updates than the last epoch's record.
  EXPECT_GE(summary["updates_applied"].get<std::uint64_t>(), epochs.back()["updates"].get<std::uint64_t>())
      << summary.dump();
  std::vector<double> rates;
  for (const auto& e : epochs) rates.push_back(e["samples_per_s"].get<double>());
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  for (std::size_t i = 0; i < epochs.size(); ++i) {
    if (i > 0) {
      EXPECT_GT(epochs[i]["wall_s"].get<double>(), epochs[i - 1]["wall_s"].get<double>() + 0.05) << i;
    }
    // Within 10x of the median: the burst this guards against gave 1e10,
    // while a loaded 2-core machine gives an epoch a third of the others'.
    EXPECT_LT(rates[i], 10.0 * median) << "epoch " << i + 1 << ": " << epochs[i].dump();
    EXPECT_GT(rates[i], median / 10.0) << "epoch " << i + 1 << ": " << epochs[i].dump();
  }
  std::printf("policy %s: worker 1 killed after epoch 1, declared lost %.2f s later; final_test_accuracy %.4f, "
              "train %.1f s\n",
              GetParam(), *noticed, summary["final_test_accuracy"].get<double>(), summary["train_s"].get<double>());
}

// Waits for the cluster to finish and checks that it exited 0 and reached
// 0.97 test accuracy; its metrics lines, the summary last (empty, with the
// failure recorded, when there is none).
std::vector<nlohmann::json> finished_metrics(pid_t cluster, const fs::path& log, const fs::path& metrics) {
  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  if (!code) {
    ADD_FAILURE() << "the cluster did not finish within " << 180 * asgd_test::kSanitizerSlowdown << " s:\n"
                  << read_file(log);
    return {};
  }
  EXPECT_EQ(*code, 0) << read_file(log);
  auto lines = asgd_test::read_jsonl(metrics);
  if (lines.empty() || lines.back().value("event", "") != "summary") {
    ADD_FAILURE() << "no summary line in " << metrics << ":\n" << read_file(log);
    return {};
  }
  EXPECT_GE(lines.back()["final_test_accuracy"].get<double>(), 0.97) << lines.back().dump();
  return lines;
}

// The first line of `lines` whose event is `event`, or null.
const nlohmann::json* find_event(const std::vector<nlohmann::json>& lines, const std::string& event) {
  for (const auto& l : lines)
    if (l.value("event", "") == event) return &l;
  return nullptr;
}

// asgd cluster starts a killed worker process again; the new process takes
// the lost worker's place and trains its share from the next epoch on.
class WorkerRestarted : public ::testing::TestWithParam<const char*> {};

TEST_P(WorkerRestarted, ANewProcessRejoinsAtTheNextEpochAndTheJobFinishesAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  const pid_t cluster = start_cluster(dir, GetParam(), epochs_for(GetParam()), log, metrics);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "no worker 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto back = wait_for_text(log, "worker 1 rejoined", std::chrono::seconds(60), cluster);
  ASSERT_TRUE(back) << read_file(log);

  const auto lines = finished_metrics(cluster, log, metrics);
  ASSERT_FALSE(lines.empty());
  const auto& summary = lines.back();
  EXPECT_EQ(summary["workers_rejoined"], 1);
  EXPECT_EQ(summary["workers_lost"], 0);
  const nlohmann::json* rejoined = find_event(lines, "worker_rejoined");
  ASSERT_NE(rejoined, nullptr);
  EXPECT_EQ((*rejoined)["worker"], 1);
  EXPECT_GE((*rejoined)["epoch"].get<int>(), 2);
  std::printf("policy %s: worker 1 killed after epoch 1, a new process rejoined at epoch %d %.2f s later; "
              "final_test_accuracy %.4f, train %.1f s\n",
              GetParam(), (*rejoined)["epoch"].get<int>(), *back, summary["final_test_accuracy"].get<double>(),
              summary["train_s"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(ClusterPolicies, WorkerRestarted, ::testing::Values("async", "bsp"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// A worker killed when the others are in the last epoch: the new process
// asgd cluster starts has nothing left to train and is turned away with status 2, a usage
// error, which the supervisor does not restart (it exited 1 before and was
// started again until --max-restarts ran out, each turned away in turn).
TEST(WorkerRestartedInTheLastEpoch, IsTurnedAwayOnceAndNotStartedAgain) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  // Worker 1 is slowed 4x, so that it is still in its first epoch when the
  // others, in the last, have said so (progress comes every 0.25 s).
  const pid_t cluster = start_cluster(dir, "async", "2", log, metrics, {"--straggler", "1:4"});
  ASSERT_GT(cluster, 0);
  for (const char* w : {"worker 0: finished epoch 1:", "worker 2: finished epoch 1:"})
    ASSERT_TRUE(wait_for_text(log, w, std::chrono::seconds(120), cluster)) << read_file(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto victim = child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "worker 1 had finished already:\n" << read_file(log);
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const std::string all = read_file(log);
  EXPECT_NE(all.find("a new process for worker 1 is not taken: the others are in the last epoch"), std::string::npos)
      << all;
  EXPECT_NE(all.find("exited with status 2; that status is a usage error"), std::string::npos) << all;
  EXPECT_NE(all.find("starting it again (1 of at most 3)"), std::string::npos) << all;
  EXPECT_EQ(all.find("starting it again (2 of at most 3)"), std::string::npos) << all;
}

class ShardKilledMidRun : public ::testing::TestWithParam<const char*> {};

TEST_P(ShardKilledMidRun, TheSupervisorRestartsItFromItsCheckpointAndTheJobFinishesAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  const pid_t cluster = start_cluster(dir, GetParam(), epochs_for(GetParam()), log, metrics,
                                      {"--checkpoint-dir", (scratch / "ck").string(), "--checkpoint-every", "1"});
  ASSERT_GT(cluster, 0);
  // Mid-run, with a checkpoint at most a second old.
  ASSERT_TRUE(wait_for_text(log, "worker 0: finished epoch 2:", std::chrono::seconds(120), cluster)) << read_file(log);
  ASSERT_TRUE(fs::exists(scratch / "ck" / "shard-1.ckpt"));
  const auto victim = child_with_args(cluster, {"shard", "--index", "1"});
  ASSERT_TRUE(victim) << "no shard 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto back = wait_for_text(log, "shard 1 was restarted at", std::chrono::seconds(60), cluster);
  ASSERT_TRUE(back) << read_file(log);
  EXPECT_NE(read_file(log).find("shard 1: restarted; reloaded"), std::string::npos) << read_file(log);

  const auto lines = finished_metrics(cluster, log, metrics);
  ASSERT_FALSE(lines.empty());
  const auto& summary = lines.back();
  EXPECT_EQ(summary["shard_restarts"], 1);
  EXPECT_EQ(summary["workers_lost"], 0);
  // The metrics file says what was lost: the age of the checkpoint the new
  // process reloaded, at most an interval (1 s) before the kill.
  const nlohmann::json* restarted = find_event(lines, "shard_restarted");
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ((*restarted)["shard"], 1);
  EXPECT_GT((*restarted)["restored_updates"].get<std::uint64_t>(), 0u) << restarted->dump();
  EXPECT_LE((*restarted)["lost_at_most_s"].get<double>(), 1.0 + *back + 1.0) << restarted->dump();
  EXPECT_EQ((*restarted)["lost_at_most_s"], (*restarted)["checkpoint_age_s"]) << restarted->dump();
  std::printf("policy %s: shard 1 killed after epoch 2, serving again from its checkpoint %.2f s later; "
              "final_test_accuracy %.4f, train %.1f s\n",
              GetParam(), *back, summary["final_test_accuracy"].get<double>(), summary["train_s"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(ClusterPolicies, ShardKilledMidRun, ::testing::Values("async", "ssp:2", "bsp"),
                         asgd_test::policy_test_name);

TEST(ShardKilledWithoutCheckpoints, TheJobStopsWithinTheHeartbeatTimeoutNamingTheShard) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const pid_t cluster = start_asgd({"cluster", "--workers", "2", "--shards", "2", "--policy", "async", "--epochs",
                                    "20", "--data-dir", dir.string(), "--heartbeat-timeout", "3"},
                                   log);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 0: finished epoch 1:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"shard", "--index", "0"});
  ASSERT_TRUE(victim);
  const auto killed = Clock::now();
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  // Not the 60 s --rpc-timeout of the workers' requests, nor the heartbeat
  // timeout: asgd cluster saw the process end.
  const auto code = wait_exit(cluster, std::chrono::seconds(60));
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_TRUE(code) << read_file(log);
  EXPECT_EQ(*code, 1) << read_file(log);
  EXPECT_LE(took, 5.0) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("shard 0 (pid " + std::to_string(*victim) + ") was killed by signal 9"), std::string::npos)
      << text;
  EXPECT_NE(text.find("cannot be restarted"), std::string::npos) << text;
  // The others were told the job failed: they exit with a failure, saying
  // why, and are not started again (nor is the failure called a bug).
  for (const char* worker : {"worker 0", "worker 1"})
    EXPECT_NE(text.find(std::string(worker) + ": the coordinator stopped it: the job failed: shard 0"), std::string::npos)
        << text;
  EXPECT_EQ(text.find("starting it again"), std::string::npos) << text;
  EXPECT_EQ(text.find("internal error"), std::string::npos) << text;
  std::printf("shard 0 killed without checkpoints: the job stopped %.1f s later, exit %d\n", took, *code);
}

// With --max-restarts 0 a shard that dies, or stops and stays stopped, will
// not come back: the job ends within --heartbeat-timeout, naming the shard
// and why, not after the workers' --rpc-timeout with a word about a
// synchronous policy under async.
class ShardNotRestarted : public ::testing::TestWithParam<int> {};

TEST_P(ShardNotRestarted, TheJobStopsWithinTheHeartbeatTimeoutNamingTheShard) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const int signal = GetParam();
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const pid_t cluster = start_asgd({"cluster", "--workers", "2", "--shards", "2", "--policy", "async", "--epochs",
                                    "20", "--data-dir", dir.string(), "--heartbeat-timeout", "3", "--checkpoint-dir",
                                    (scratch / "ck").string(), "--checkpoint-every", "1", "--max-restarts", "0"},
                                   log);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 0: finished epoch 1:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"shard", "--index", "1"});
  ASSERT_TRUE(victim);
  const auto hit = Clock::now();
  ASSERT_EQ(kill(*victim, signal), 0);
  const auto code = wait_exit(cluster, std::chrono::seconds(60));
  const double took = std::chrono::duration<double>(Clock::now() - hit).count();
  ASSERT_TRUE(code) << read_file(log);
  EXPECT_EQ(*code, 1) << read_file(log);
  EXPECT_LE(took, 3.0 + 5.0) << read_file(log);
  const std::string text = read_file(log);
  const auto at = text.find("asgd: error: ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string error = text.substr(at, text.find('\n', at) - at);
  EXPECT_NE(error.find("shard 1 (pid " + std::to_string(*victim) + ")"), std::string::npos) << error;
  EXPECT_NE(error.find("--max-restarts is 0"), std::string::npos) << error;
  EXPECT_EQ(text.find("synchronous policy"), std::string::npos) << text;
  std::printf("shard 1 sent %s with --max-restarts 0: the job stopped %.1f s later, exit %d\n", sigabbrev_np(signal),
              took, *code);
}

INSTANTIATE_TEST_SUITE_P(KilledOrStopped, ShardNotRestarted, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& p) { return std::string(sigabbrev_np(p.param)); });

// A shard stopped for good (SIGSTOP) never exits by itself: asgd cluster
// ends it once the coordinator finds it silent, and restarts it.
TEST(ShardStopped, TheSupervisorEndsItAndRestartsItFromItsCheckpoint) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  const pid_t cluster = start_cluster(dir, "async", "5", log, metrics,
                                      {"--checkpoint-dir", (scratch / "ck").string(), "--checkpoint-every", "1"});
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 0: finished epoch 2:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"shard", "--index", "1"});
  ASSERT_TRUE(victim);
  ASSERT_EQ(kill(*victim, SIGSTOP), 0);
  const auto back = wait_for_text(log, "shard 1 was restarted at", std::chrono::seconds(60), cluster);
  ASSERT_TRUE(back) << read_file(log);
  EXPECT_LE(*back, 3.0 + 5.0) << read_file(log);
  EXPECT_NE(read_file(log).find("is silent but has not exited: ending it"), std::string::npos) << read_file(log);
  const auto lines = finished_metrics(cluster, log, metrics);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["shard_restarts"], 1);
  std::printf("shard 1 stopped (SIGSTOP): serving again %.1f s later; final_test_accuracy %.4f\n", *back,
              lines.back()["final_test_accuracy"].get<double>());
}

// Checkpoints that never get written: the restarted shard starts from the
// initial parameters, and the metrics file says it lost the whole run so
// far, not one interval.
TEST(ShardRestartedWithoutACheckpoint, ReportsThatItLostEverythingItHadApplied) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  fs::create_directories(scratch / "ck" / "shard-1.ckpt.claim");  // every write of shard 1 fails: no claim
  const pid_t cluster = start_cluster(dir, "async", "5", log, metrics,
                                      {"--checkpoint-dir", (scratch / "ck").string(), "--checkpoint-every", "0.5"});
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 0: finished epoch 2:", std::chrono::seconds(120), cluster)) << read_file(log);
  EXPECT_NE(read_file(log).find("a restart of this shard loses every update since the start of training"),
            std::string::npos)
      << read_file(log);
  const auto victim = child_with_args(cluster, {"shard", "--index", "1"});
  ASSERT_TRUE(victim);
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  ASSERT_TRUE(wait_for_text(log, "shard 1 was restarted at", std::chrono::seconds(60), cluster)) << read_file(log);
  // Not "none had been written": it cannot know that (on another host the
  // file may be where the new process does not look).
  EXPECT_NE(read_file(log).find("without a checkpoint to reload (it found no shard-1.ckpt in " + (scratch / "ck").string() +
                                " on its host"),
            std::string::npos)
      << read_file(log);

  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const auto lines = asgd_test::read_jsonl(metrics);
  const nlohmann::json* restarted = find_event(lines, "shard_restarted");
  ASSERT_NE(restarted, nullptr) << read_file(metrics);
  EXPECT_TRUE((*restarted)["checkpoint_age_s"].is_null()) << restarted->dump();
  EXPECT_EQ((*restarted)["restored_updates"], 0) << restarted->dump();
  EXPECT_EQ((*restarted)["lost_at_most_s"], (*restarted)["train_s"]) << restarted->dump();
  ASSERT_EQ(lines.back().value("event", ""), "summary");
  EXPECT_GT(lines.back()["checkpoint_failures"].get<std::uint64_t>(), 0u) << lines.back().dump();
}

// A worker alive but far too slow: ssp:1 holds the other worker's read,
// the shards say on whom after half the --rpc-timeout, and the job stops
// at the timeout instead of waiting on. (Once, the failed worker's normal
// exit reached the coordinator before its failure did, and the job hung.)
TEST(ReadHeldPastTheRpcTimeout, TheClusterStopsAtTheTimeoutAndTheShardsNameTheSlowestWorker) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const pid_t cluster = start_asgd({"cluster", "--workers", "2", "--shards", "2", "--policy", "ssp:1", "--epochs", "1",
                                    "--data-dir", dir.string(), "--straggler", "1:100000", "--rpc-timeout", "4",
                                    "--heartbeat-timeout", "2"},
                                   log);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 0: samples", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto started = Clock::now();
  const auto code = wait_exit(cluster, std::chrono::seconds(60));
  const double took = std::chrono::duration<double>(Clock::now() - started).count();
  ASSERT_TRUE(code) << "still running 60 s after the workers started\n" << read_file(log);
  EXPECT_EQ(*code, 1) << read_file(log);
  EXPECT_LE(took, 4.0 + 10.0) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("worker 0: no reply from shard(s) 0, 1 within 4 s (--rpc-timeout)"), std::string::npos) << text;
  EXPECT_NE(text.find("held by policy ssp:1 for over 2 s"), std::string::npos) << text;
  EXPECT_NE(text.find("waiting for the slowest live worker 1, at clock 0"), std::string::npos) << text;
  std::printf("a read held past --rpc-timeout 4: the cluster stopped %.1f s after its workers started, exit %d\n", took,
              *code);
}

INSTANTIATE_TEST_SUITE_P(EveryClusterPolicy, WorkerKilledMidEpoch,
                         ::testing::Values("bsp", "ssp:2", "async", "averaging"),
                         asgd_test::policy_test_name);


// A job of processes started by hand, as on several hosts (no supervisor
// ends a stopped one): a coordinator listening on a free loopback port for
// 2 workers over 40 epochs with --heartbeat-timeout 3 (and `extra`), then
// shard 0 and workers 0 and 1; each logs to SCRATCH/ROLE[INDEX].log. Its
// endpoint and their pids, the coordinator's first; no pids when one did
// not start.
struct ByHand {
  std::string at;
  std::vector<pid_t> pids;
};
ByHand start_by_hand(const fs::path& data, const fs::path& scratch, const std::vector<std::string>& extra = {},
                     const std::string& heartbeat_timeout = "3") {
  const int port = asgd_test::free_port();
  if (port <= 0) return {};
  const std::string at = "tcp://127.0.0.1:" + std::to_string(port);
  std::vector<std::string> args = {"coordinator", "--listen", at, "--workers", "2", "--epochs", "40",
                                   "--heartbeat-timeout", heartbeat_timeout, "--data-dir", data.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<pid_t> pids = {start_asgd(args, scratch / "coordinator.log")};
  for (const auto& [role, index] : {std::pair{"shard", "0"}, {"worker", "0"}, {"worker", "1"}})
    pids.push_back(start_asgd({role, "--coordinator", at, "--index", index}, scratch / (std::string(role) + index + ".log")));
  if (std::find(pids.begin(), pids.end(), -1) != pids.end()) return {at, {}};
  return {at, pids};
}

// Ends a job started by hand: its coordinator interrupted, and it and
// `others` gone within a minute.
void end_by_hand(pid_t coordinator, std::initializer_list<pid_t> others) {
  kill(coordinator, SIGINT);
  EXPECT_TRUE(wait_exit(coordinator, std::chrono::seconds(60)));
  for (pid_t p : others) EXPECT_TRUE(wait_exit(p, std::chrono::seconds(60)));
}

// Processes started by hand (no supervisor to end a stopped one): worker 1
// is stopped past --heartbeat-timeout and then goes on. The coordinator has
// given it up; it is told so and exits 1, where it trained on with every
// push refused and then said the coordinator had gone silent.
TEST(WorkerStoppedPastTheHeartbeatTimeout, IsToldItWasGivenUpWhenItWakes) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const auto [at, pids] = start_by_hand(dir, scratch.path());
  ASSERT_EQ(pids.size(), 4u);
  const pid_t coordinator = pids[0], victim = pids[3];
  const fs::path log = scratch / "worker1.log";
  ASSERT_TRUE(wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), victim)) << read_file(log);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  ASSERT_TRUE(wait_for_text(scratch / "coordinator.log", "worker 1 is lost", std::chrono::seconds(30), coordinator));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_EQ(kill(victim, SIGCONT), 0);
  const auto code = wait_exit(victim, std::chrono::seconds(20));
  ASSERT_TRUE(code) << read_file(log);
  EXPECT_EQ(*code, 1) << read_file(log);
  const std::string said = read_file(log);
  EXPECT_NE(said.find("worker 1: this process did not run for"), std::string::npos) << said;
  EXPECT_NE(said.find("this process was declared lost after 3 s without a heartbeat"), std::string::npos) << said;
  EXPECT_EQ(said.find("the coordinator sent nothing"), std::string::npos) << said;
  end_by_hand(coordinator, {pids[1], pids[2]});
}


// Processes started by hand: worker 1 is interrupted (Ctrl-C in its own
// terminal). It says so as it goes, and the coordinator drops it at once
// rather than after --heartbeat-timeout (30 s here), while the other
// worker's all-reduce waited for it.
TEST(WorkerInterruptedByHand, IsDroppedAtOnceNotAfterTheHeartbeatTimeout) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const auto [at, pids] = start_by_hand(dir, scratch.path(), {"--policy", "allreduce"}, "30");
  ASSERT_EQ(pids.size(), 4u);
  const pid_t coordinator = pids[0], victim = pids[3];
  ASSERT_TRUE(wait_for_text(scratch / "worker1.log", "worker 1: finished epoch 1:", std::chrono::seconds(120), victim))
      << read_file(scratch / "worker1.log");
  ASSERT_EQ(kill(victim, SIGINT), 0);
  const auto noticed = wait_for_text(scratch / "coordinator.log", "worker 1 is lost (its process was interrupted",
                                     std::chrono::seconds(30), coordinator);
  ASSERT_TRUE(noticed) << read_file(scratch / "coordinator.log");
  EXPECT_LT(*noticed, 20.0) << "dropped only by the heartbeat timeout";
  const auto code = wait_exit(victim, std::chrono::seconds(20));
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, 1);
  // The job goes on with worker 0.
  EXPECT_TRUE(wait_for_text(scratch / "worker0.log", "worker 0: finished epoch 3:", std::chrono::seconds(60), pids[2]))
      << read_file(scratch / "worker0.log");
  end_by_hand(coordinator, {pids[1], pids[2]});
}

// Processes started by hand: the coordinator dies and a new one starts on
// the same endpoint. The old processes reconnect to it, and it tells them
// it never took them in: they stop (they trained the whole job on with
// their heartbeats echoed by a coordinator that did not know them, and
// held the shard's port so that a new shard could not start).
TEST(CoordinatorRestartedByHand, TheOldProcessesAreToldToStop) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  // (A --heartbeat-timeout the new coordinator answers well within: the
  // old processes do not give up on their own first.)
  const auto [at, pids] = start_by_hand(dir, scratch.path(), {}, "20");
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_TRUE(wait_for_text(scratch / "worker1.log", "worker 1: finished epoch 1:", std::chrono::seconds(120), pids[3]))
      << read_file(scratch / "worker1.log");
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  ASSERT_TRUE(wait_exit(pids[0], std::chrono::seconds(10)));
  const pid_t second = start_asgd({"coordinator", "--listen", at, "--workers", "2", "--epochs", "40", "--heartbeat-timeout",
                                   "20", "--join-timeout", "60", "--data-dir", dir.string()},
                                  scratch / "second.log");
  ASSERT_GT(second, 0);
  for (std::size_t i = 1; i < pids.size(); ++i) {
    const auto code = wait_exit(pids[i], std::chrono::seconds(15));
    ASSERT_TRUE(code) << "an old process trained on under the new coordinator";
    EXPECT_NE(*code, 0);
  }
  EXPECT_NE(read_file(scratch / "shard0.log").find("this coordinator did not take it in"), std::string::npos)
      << read_file(scratch / "shard0.log");
  kill(second, SIGINT);
  EXPECT_TRUE(wait_exit(second, std::chrono::seconds(30)));
}

// A coordinator of a one-epoch job started by hand on a free loopback
// port (its endpoint into `at`), with `extra` flags (--workers N ...), in
// the working folder `cwd` (empty: ours); logs to SCRATCH/coordinator.log.
pid_t start_coordinator(const fs::path& data, const fs::path& scratch, std::string& at,
                        const std::vector<std::string>& extra, const fs::path& cwd = {}) {
  const int port = asgd_test::free_port();
  if (port <= 0) return -1;
  at = "tcp://127.0.0.1:" + std::to_string(port);
  std::vector<std::string> args = {"coordinator", "--listen", at, "--epochs", "1", "--validation-size", "1000",
                                   "--data-dir", data.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return start_asgd(args, scratch / "coordinator.log", cwd);
}

// Processes started by hand in any order: a worker whose own
// --join-timeout runs out before the others come says so as it goes, and
// its slot is free again. It was kept: a third worker was refused, and
// the job started without the gone one, trained on half the data, exit 0.
TEST(ProcessesByHand, AWorkerThatGivesUpBeforeTheJobFreesItsSlot) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  std::string at;
  const pid_t coordinator = start_coordinator(dir, scratch.path(), at, {"--workers", "2", "--join-timeout", "60"});
  ASSERT_GT(coordinator, 0);
  const pid_t early = start_asgd({"worker", "--coordinator", at, "--join-timeout", "2"}, scratch / "early.log");
  const auto gave_up = wait_exit(early, std::chrono::seconds(30));
  ASSERT_TRUE(gave_up);
  EXPECT_EQ(*gave_up, 1);
  ASSERT_TRUE(wait_for_text(scratch / "coordinator.log", "left before the job started", std::chrono::seconds(10),
                            coordinator))
      << read_file(scratch / "coordinator.log");
  std::vector<pid_t> others = {start_asgd({"shard", "--coordinator", at}, scratch / "shard.log")};
  for (const char* name : {"worker0.log", "worker1.log"})
    others.push_back(start_asgd({"worker", "--coordinator", at}, scratch / name));
  const auto code = wait_exit(coordinator, std::chrono::seconds(120));
  ASSERT_TRUE(code) << read_file(scratch / "coordinator.log");
  EXPECT_EQ(*code, 0) << read_file(scratch / "coordinator.log");
  for (pid_t p : others) {
    const auto c = wait_exit(p, std::chrono::seconds(30));
    ASSERT_TRUE(c);
    EXPECT_EQ(*c, 0);
  }
  EXPECT_EQ(read_file(scratch / "coordinator.log").find("is lost"), std::string::npos) << read_file(scratch / "coordinator.log");
}

// Processes started by hand: a worker whose data folder holds other files
// than the coordinator's (Fashion-MNIST under the name mnist) refuses to
// train, naming its host and folder; it trained on, test accuracy 0.08,
// exit 0.
TEST(ProcessesByHand, AWorkerWhoseDataIsNotTheCoordinatorsRefusesToTrain) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  ASGD_REQUIRE_DATASET(fashion, "fashion-mnist");
  const asgd_test::TempDir scratch;
  std::string at;
  const pid_t coordinator = start_coordinator(dir, scratch.path(), at, {"--workers", "1"});
  ASSERT_GT(coordinator, 0);
  const pid_t shard = start_asgd({"shard", "--coordinator", at}, scratch / "shard.log");
  const pid_t worker = start_asgd({"worker", "--coordinator", at, "--data-dir", fashion.string()}, scratch / "worker.log");
  const auto code = wait_exit(coordinator, std::chrono::seconds(120));
  ASSERT_TRUE(code) << read_file(scratch / "coordinator.log");
  EXPECT_NE(*code, 0);
  EXPECT_NE(read_file(scratch / "coordinator.log").find("its training data (59000 samples from " + fashion.string() +
                                                        ") is not the coordinator's"),
            std::string::npos)
      << read_file(scratch / "coordinator.log");
  for (pid_t p : {shard, worker}) {
    const auto c = wait_exit(p, std::chrono::seconds(30));
    ASSERT_TRUE(c);
    EXPECT_NE(*c, 0);
  }
}

// Processes started by hand from different working folders (as on hosts
// sharing a file system): a relative --checkpoint-dir is the coordinator's
// folder for every process. It was each shard's own, which split the job's
// checkpoints (job.toml in one place, shard-0.ckpt in another) and made a
// --resume fail.
TEST(ProcessesByHand, ARelativeCheckpointFolderIsTheCoordinatorsForEveryProcess) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  fs::create_directories(scratch / "here");
  fs::create_directories(scratch / "there");
  std::string at;
  const pid_t coordinator =
      start_coordinator(dir, scratch.path(), at, {"--workers", "1", "--checkpoint-dir", "ck"}, scratch / "here");
  ASSERT_GT(coordinator, 0);
  // (Listening on every interface, it announces 0.0.0.0, which the
  // coordinator says other hosts cannot dial.)
  const pid_t shard = start_asgd({"shard", "--coordinator", at, "--listen", "tcp://0.0.0.0:0"}, scratch / "shard.log",
                                 scratch / "there");
  const pid_t worker = start_asgd({"worker", "--coordinator", at}, scratch / "worker.log", scratch / "there");
  const auto code = wait_exit(coordinator, std::chrono::seconds(120));
  ASSERT_TRUE(code) << read_file(scratch / "coordinator.log");
  EXPECT_EQ(*code, 0) << read_file(scratch / "coordinator.log") << read_file(scratch / "shard.log");
  for (pid_t p : {shard, worker}) EXPECT_TRUE(wait_exit(p, std::chrono::seconds(30)));
  for (const char* file : {"job.toml", "model.ckpt", "shard-0.ckpt"})
    EXPECT_TRUE(fs::exists(scratch / "here" / "ck" / file)) << file;
  EXPECT_FALSE(fs::exists(scratch / "there" / "ck")) << "a shard checkpointed into its own working folder";
  EXPECT_NE(read_file(scratch / "coordinator.log").find("which processes on other hosts cannot dial"), std::string::npos)
      << read_file(scratch / "coordinator.log");
}

// Processes started by hand: shard 0 is stopped, a new process takes its
// place and reloads its checkpoint, then the old one wakes. Its periodic
// checkpoint and its last one no longer overwrite the new process's file
// (checkpoint_claim.hpp), and it is told its place was taken.
TEST(ShardStoppedAndReplacedByHand, WakesWithoutWritingOverItsReplacementsCheckpoint) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  const auto [at, all] = start_by_hand(dir, scratch.path(), {"--checkpoint-dir", ck.string(), "--checkpoint-every", "0.3"});
  ASSERT_EQ(all.size(), 4u);
  const pid_t coordinator = all[0];
  const std::vector<pid_t> pids(all.begin() + 1, all.end());  // shard 0, worker 0, worker 1
  const fs::path old_log = scratch / "shard0.log";
  ASSERT_TRUE(wait_for_text(scratch / "worker1.log", "worker 1: finished epoch 1:", std::chrono::seconds(120), pids[2]));
  ASSERT_EQ(kill(pids[0], SIGSTOP), 0);
  ASSERT_TRUE(wait_for_text(scratch / "coordinator.log", "sent no heartbeat for 3 s", std::chrono::seconds(30), coordinator));
  const pid_t fresh = start_asgd({"shard", "--coordinator", at, "--index", "0"}, scratch / "fresh.log");
  ASSERT_TRUE(wait_for_text(scratch / "coordinator.log", "shard 0 was restarted", std::chrono::seconds(30), coordinator));
  ASSERT_TRUE(wait_for_text(scratch / "worker1.log", "worker 1: finished epoch", std::chrono::seconds(60), pids[2]));
  ASSERT_EQ(kill(pids[0], SIGCONT), 0);
  const auto code = wait_exit(pids[0], std::chrono::seconds(20));
  ASSERT_TRUE(code) << read_file(old_log);
  EXPECT_NE(*code, 0);
  const std::string said = read_file(old_log);
  EXPECT_NE(said.find("was claimed by another process after this one (its claim 2, this one's 1)"), std::string::npos)
      << said;
  EXPECT_NE(said.find("took the place of this shard 0, which had gone silent"), std::string::npos) << said;
  // The file is the new process's: it goes on writing it, and nothing else does.
  EXPECT_EQ(read_file(ck / "shard-0.ckpt.claim"), "2\n");
  kill(coordinator, SIGINT);
  EXPECT_TRUE(wait_exit(coordinator, std::chrono::seconds(60)));
  for (pid_t p : {pids[1], pids[2], fresh}) EXPECT_TRUE(wait_exit(p, std::chrono::seconds(60)));
  EXPECT_EQ(read_file(scratch / "fresh.log").find("not written"), std::string::npos) << read_file(scratch / "fresh.log");
}

}  // namespace
}  // namespace asgd
