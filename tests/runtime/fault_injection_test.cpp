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

#include "temp_dir.hpp"
#include "test_data.hpp"

extern char** environ;

namespace asgd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `asgd ARGS` as a child of ours, stdout and stderr into `log`.
pid_t start_asgd(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> all = {ASGD_CLI_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, ASGD_CLI_PATH, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// The pid of the child of `parent` whose command line has every one of
// `words` as an argument; nullopt when there is none.
std::optional<pid_t> child_with_args(pid_t parent, const std::vector<std::string>& words) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    const std::string cmdline = read_file(entry.path() / "cmdline");
    std::vector<std::string> args;
    for (std::size_t at = 0; at < cmdline.size();) {
      const auto end = cmdline.find('\0', at);
      args.push_back(cmdline.substr(at, end - at));
      at = end == std::string::npos ? cmdline.size() : end + 1;
    }
    bool all = true;
    for (std::size_t i = 0; all && i < words.size(); ++i) {
      // "--index" "1" must be adjacent
      auto it = std::find(args.begin(), args.end(), words[i]);
      all = it != args.end() && (i + 1 >= words.size() || words[i].rfind("--", 0) != 0 ||
                                 (it + 1 != args.end() && *(it + 1) == words[i + 1]));
    }
    if (all) return static_cast<pid_t>(std::stoi(name));
  }
  return std::nullopt;
}

// Polls `log` until it holds `needle`; the time it took, or nullopt.
std::optional<double> wait_for_text(const fs::path& log, const std::string& needle, std::chrono::seconds limit,
                                    pid_t alive) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    if (read_file(log).find(needle) != std::string::npos)
      return std::chrono::duration<double>(Clock::now() - start).count();
    if (waitpid(alive, nullptr, WNOHANG) == alive) return std::nullopt;  // it ended first
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

std::optional<int> wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return std::nullopt;
}

class WorkerKilledMidEpoch : public ::testing::TestWithParam<const char*> {};

TEST_P(WorkerKilledMidEpoch, TheJobFinishesWithoutItAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  constexpr double kHeartbeatTimeout = 3.0;
  // --max-restarts 0: no new process takes its place (WorkerRestarted below).
  const pid_t cluster = start_asgd({"cluster", "--workers", "3", "--shards", "2", "--policy", GetParam(), "--epochs",
                                    "5", "--data-dir", dir.string(), "--heartbeat-timeout", "3", "--max-restarts", "0",
                                    "--metrics-out", metrics.string()},
                                   log);
  ASSERT_GT(cluster, 0);
  // Mid-epoch: worker 1 has just finished its first epoch. (Its own log
  // line, not the coordinator's epoch line, which waits for an evaluation.)
  ASSERT_TRUE(wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "no worker 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  // Declared dead within its timeout (heartbeats come and are checked every
  // second; the rest is slack for a loaded test machine), not after the
  // 60 s --rpc-timeout or never.
  const auto noticed = wait_for_text(log, "worker 1 is lost", std::chrono::seconds(30), cluster);
  ASSERT_TRUE(noticed) << read_file(log);
  EXPECT_LE(*noticed, kHeartbeatTimeout + 5.0) << read_file(log);

  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << "the cluster did not finish within 180 s:\n" << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  nlohmann::json summary;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) summary = nlohmann::json::parse(line);
  ASSERT_EQ(summary.value("event", ""), "summary") << read_file(log);
  EXPECT_EQ(summary["workers_lost"], 1);
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.97) << summary.dump();
  std::printf("policy %s: worker 1 killed after epoch 1, declared lost %.2f s later; final_test_accuracy %.4f, "
              "train %.1f s\n",
              GetParam(), *noticed, summary["final_test_accuracy"].get<double>(), summary["train_s"].get<double>());
}

std::vector<nlohmann::json> read_lines(const fs::path& p) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// asgd cluster starts a killed worker process again; the new process takes
// the lost worker's place and trains its share from the next epoch on.
class WorkerRestarted : public ::testing::TestWithParam<const char*> {};

TEST_P(WorkerRestarted, ANewProcessRejoinsAtTheNextEpochAndTheJobFinishesAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  // bsp gets an epoch more: its 3 workers' summed batches make fewer steps.
  const std::string epochs = std::string(GetParam()) == "bsp" ? "6" : "5";
  const pid_t cluster = start_asgd({"cluster", "--workers", "3", "--shards", "2", "--policy", GetParam(), "--epochs",
                                    epochs, "--data-dir", dir.string(), "--heartbeat-timeout", "3", "--metrics-out",
                                    metrics.string()},
                                   log);
  ASSERT_GT(cluster, 0);
  ASSERT_TRUE(wait_for_text(log, "worker 1: finished epoch 1:", std::chrono::seconds(120), cluster)) << read_file(log);
  const auto victim = child_with_args(cluster, {"worker", "--index", "1"});
  ASSERT_TRUE(victim) << "no worker 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto back = wait_for_text(log, "worker 1 rejoined", std::chrono::seconds(60), cluster);
  ASSERT_TRUE(back) << read_file(log);

  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << "the cluster did not finish within 180 s:\n" << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const auto lines = read_lines(metrics);
  ASSERT_FALSE(lines.empty());
  const auto& summary = lines.back();
  ASSERT_EQ(summary.value("event", ""), "summary") << read_file(log);
  EXPECT_EQ(summary["workers_rejoined"], 1);
  EXPECT_EQ(summary["workers_lost"], 0);
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.97) << summary.dump();
  const auto rejoined = std::find_if(lines.begin(), lines.end(), [](const auto& l) {
    return l.value("event", "") == "worker_rejoined";
  });
  ASSERT_NE(rejoined, lines.end());
  EXPECT_EQ((*rejoined)["worker"], 1);
  EXPECT_GE((*rejoined)["epoch"].get<int>(), 2);
  std::printf("policy %s: worker 1 killed after epoch 1, a new process rejoined at epoch %d %.2f s later; "
              "final_test_accuracy %.4f, train %.1f s\n",
              GetParam(), (*rejoined)["epoch"].get<int>(), *back, summary["final_test_accuracy"].get<double>(),
              summary["train_s"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(ClusterPolicies, WorkerRestarted, ::testing::Values("async", "bsp"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

class ShardKilledMidRun : public ::testing::TestWithParam<const char*> {};

TEST_P(ShardKilledMidRun, TheSupervisorRestartsItFromItsCheckpointAndTheJobFinishesAbove97Percent) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path log = scratch / "cluster.log";
  const fs::path metrics = scratch / "run.jsonl";
  // bsp gets an epoch more: its 3 workers' summed batches make fewer steps.
  const std::string epochs = std::string(GetParam()) == "bsp" ? "6" : "5";
  const pid_t cluster = start_asgd({"cluster", "--workers", "3", "--shards", "2", "--policy", GetParam(), "--epochs",
                                    epochs, "--data-dir", dir.string(), "--heartbeat-timeout", "3", "--checkpoint-dir",
                                    (scratch / "ck").string(), "--checkpoint-every", "1", "--metrics-out",
                                    metrics.string()},
                                   log);
  ASSERT_GT(cluster, 0);
  // Mid-run, with a checkpoint at most a second old.
  ASSERT_TRUE(wait_for_text(log, "worker 0: finished epoch 2:", std::chrono::seconds(120), cluster)) << read_file(log);
  ASSERT_TRUE(fs::exists(scratch / "ck" / "shard-1.ckpt"));
  const auto victim = child_with_args(cluster, {"shard", "--index", "1"});
  ASSERT_TRUE(victim) << "no shard 1 process under " << cluster;
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto back = wait_for_text(log, "shard 1 was restarted from its checkpoint", std::chrono::seconds(60), cluster);
  ASSERT_TRUE(back) << read_file(log);
  EXPECT_NE(read_file(log).find("shard 1: restarted; reloaded"), std::string::npos) << read_file(log);

  const auto code = wait_exit(cluster, std::chrono::seconds(180));
  ASSERT_TRUE(code) << "the cluster did not finish within 180 s:\n" << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  const auto lines = read_lines(metrics);
  ASSERT_FALSE(lines.empty());
  const auto& summary = lines.back();
  ASSERT_EQ(summary.value("event", ""), "summary") << read_file(log);
  EXPECT_EQ(summary["shard_restarts"], 1);
  EXPECT_EQ(summary["workers_lost"], 0);
  EXPECT_GE(summary["final_test_accuracy"].get<double>(), 0.97) << summary.dump();
  // The metrics file says what was lost: at most one checkpoint interval.
  const auto restarted = std::find_if(lines.begin(), lines.end(), [](const auto& l) {
    return l.value("event", "") == "shard_restarted";
  });
  ASSERT_NE(restarted, lines.end());
  EXPECT_EQ((*restarted)["shard"], 1);
  EXPECT_EQ((*restarted)["lost_at_most_s"], 1.0);
  std::printf("policy %s: shard 1 killed after epoch 2, serving again from its checkpoint %.2f s later; "
              "final_test_accuracy %.4f, train %.1f s\n",
              GetParam(), *back, summary["final_test_accuracy"].get<double>(), summary["train_s"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(ClusterPolicies, ShardKilledMidRun, ::testing::Values("async", "ssp:2", "bsp"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string n = p.param;
                           for (char& c : n)
                             if (c == ':') c = '_';
                           return n;
                         });

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
  // Not the 60 s --rpc-timeout of the workers' requests: the heartbeat timeout.
  const auto code = wait_exit(cluster, std::chrono::seconds(60));
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_TRUE(code) << read_file(log);
  EXPECT_EQ(*code, 1) << read_file(log);
  EXPECT_LE(took, 3.0 + 15.0) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("shard 0's process"), std::string::npos) << text;
  EXPECT_NE(text.find("cannot be restarted"), std::string::npos) << text;
  std::printf("shard 0 killed without checkpoints: the job stopped %.1f s later, exit %d\n", took, *code);
}

INSTANTIATE_TEST_SUITE_P(EveryClusterPolicy, WorkerKilledMidEpoch,
                         ::testing::Values("bsp", "ssp:2", "async", "averaging"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string n = p.param;
                           for (char& c : n)
                             if (c == ':') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace asgd
