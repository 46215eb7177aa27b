// The start of a job across processes: the coordinator's clock, and every
// worker, start once every worker process is ready (worker_ready), but the
// start waits for them no longer than --join-timeout. Here the roles run
// on threads of the test, each with its own bridge, as in
// cluster_test.cpp; worker 1's collective takes longer to connect than the
// coordinator's --join-timeout, so it is ready late.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "captured_log.hpp"
#include "coordinator_thread.hpp"
#include "messaging/collective.hpp"
#include "runtime/cluster.hpp"
#include "runtime/local_cluster.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

using namespace messaging;

// A ZeroMQ collective that sleeps before it connects: the worker process
// that holds it makes its actors, and says it is ready, that much later.
class SlowToConnect final : public NetworkCollective {
 public:
  SlowToConnect(std::shared_ptr<NetworkCollective> real, std::chrono::milliseconds delay)
      : real_(std::move(real)), delay_(delay) {}
  const std::string& endpoint() const override { return real_->endpoint(); }
  Status connect(Rank rank, const std::vector<std::string>& endpoints) override {
    std::this_thread::sleep_for(delay_);
    return real_->connect(rank, endpoints);
  }
  std::uint64_t rejected() const override { return real_->rejected(); }
  std::uint64_t unsent() const override { return real_->unsent(); }
  void set_half_precision(bool on) override { real_->set_half_precision(on); }
  void set_shared_memory(bool on, std::chrono::milliseconds settle) override { real_->set_shared_memory(on, settle); }
  Rank size() const override { return real_->size(); }
  Status allreduce_mean(Rank rank, Round round, std::span<const float> data, double weight, Ready ready) override {
    return real_->allreduce_mean(rank, round, data, weight, std::move(ready));
  }
  std::span<const float> mean(Rank rank) const override { return real_->mean(rank); }
  double total_weight(Rank rank) const override { return real_->total_weight(rank); }
  Status gossip(Rank rank, Round clock, std::span<const float> params, const std::vector<Rank>& audience,
                const std::vector<Rank>& peers, Round min_clock, Ready ready) override {
    return real_->gossip(rank, clock, params, audience, peers, min_clock, std::move(ready));
  }
  std::vector<PeerCopy> peer_copies(Rank rank) const override { return real_->peer_copies(rank); }
  void leave(Rank rank) override { real_->leave(rank); }
  std::string waiting_for(Rank rank) const override { return real_->waiting_for(rank); }

 private:
  std::shared_ptr<NetworkCollective> real_;
  std::chrono::milliseconds delay_;
};

TEST(ClusterStart, AWorkerNotReadyByTheJoinTimeoutIsStartedWhenItIsWhileTheOthersTrain) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  asgd_test::CapturedLog log;  // before anything whose threads log
  JobConfig c;
  c.data_dir = dir.string();
  c.policy = "allreduce";
  c.workers = 2;
  c.shards = 1;
  c.epochs = 1;
  // Under a sanitizer every setup is slower, the punctual worker's too.
  const int join_s = 3 * asgd_test::kSanitizerSlowdown;
  c.heartbeat_timeout_s = 20 * asgd_test::kSanitizerSlowdown;  // the late worker is not declared dead while it sets up
  c.rpc_timeout_s = 30 * asgd_test::kSanitizerSlowdown;        // worker 0's first all-reduce waits for it
  CoordinatorThread coordinator(c, coordinator_options(c, join_s));
  const std::string at = coordinator.endpoint();
  ASSERT_FALSE(at.empty()) << "the coordinator did not listen within 10 s";
  auto slow = make_zmq_collective("tcp://127.0.0.1:*");
  ASSERT_TRUE(slow.ok()) << slow.status().to_string();
  std::vector<Status> role_status(3);
  std::vector<std::thread> roles;
  roles.emplace_back([&] {
    ProcessOptions o;
    o.coordinator = at;
    o.listen = "tcp://127.0.0.1:*";
    role_status[0] = run_shard_process(o, {});
  });
  for (std::uint32_t w = 0; w < 2; ++w) {
    roles.emplace_back([&, w] {
      ProcessOptions o;
      o.coordinator = at;
      o.index = w;
      if (w == 1) o.collective = std::make_shared<SlowToConnect>(*slow, std::chrono::seconds(2 * join_s));
      role_status[1 + w] = run_worker_process(o, {});
    });
  }
  coordinator.join();
  for (auto& t : roles) t.join();
  const auto& outcome = coordinator.outcome;
  ASSERT_TRUE(outcome.has_value());
  ASSERT_TRUE(outcome->ok()) << outcome->status().to_string() << "\n" << log.all();
  EXPECT_EQ((*outcome)->workers_lost, 0u) << log.all();
  EXPECT_GE((*outcome)->final_test_accuracy, 0.9);
  EXPECT_EQ(log.count("worker 1 not ready " + std::to_string(join_s) + " s after the assignments (--join-timeout)"), 1u)
      << log.all();
  for (const auto& s : role_status) EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(ClusterStart, AProcessItsSupervisorGivesUpOnBeforeItRegistersStopsTheStartAtOnceNamingIt) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c;
  c.data_dir = dir.string();
  c.workers = 2;
  c.shards = 1;
  c.epochs = 1;
  ProcessOptions o = coordinator_options(c, 30);
  o.supervision = std::make_shared<Supervision>();
  const auto start = std::chrono::steady_clock::now();
  CoordinatorThread coordinator(c, o);
  ASSERT_FALSE(coordinator.endpoint().empty()) << "the coordinator did not listen within 10 s";
  // Nobody registers. A process being started again is waited for ...
  o.supervision->exited({false, 1, 4242, true, "worker 1 (pid 4242) exited with status 2; starting it again"});
  std::this_thread::sleep_for(std::chrono::seconds(1));
  // ... one given up on is not: its slot would never fill.
  o.supervision->exited({false, 1, 4243, false,
                         "worker 1 (pid 4243) exited with status 2; it was restarted 3 time(s) already and "
                         "--max-restarts is 3"});
  coordinator.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& outcome = coordinator.outcome;
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(outcome->ok());
  EXPECT_EQ(outcome->status().code(), StatusCode::unavailable) << outcome->status().to_string();
  const std::string& what = outcome->status().message();
  EXPECT_NE(what.find("worker 1 (pid 4243) exited with status 2"), std::string::npos) << what;
  EXPECT_NE(what.find("never registered, so the job cannot start"), std::string::npos) << what;
  EXPECT_EQ(what.find("4242"), std::string::npos) << what;
  EXPECT_LT(took, 10.0) << "waited for --join-timeout (30 s) instead";
}

// asgd cluster's supervisor does not start again a process that exited
// with a usage error (status 2: a flag it refused, a device its host
// lacks): it would refuse the same way, --max-restarts times, before the
// job could stop. Real processes: asgd's coordinator, and for the shard and
// the workers a script that refuses as asgd does.
TEST(ClusterStart, ARoleThatRefusedItsArgumentsIsNotStartedAgain) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  asgd_test::CapturedLog log;
  const asgd_test::TempDir scratch;
  const std::filesystem::path program = scratch.path() / "asgd-refusing-roles";
  {
    std::ofstream f(program);
    f << "#!/bin/sh\n"
      << "if [ \"$1\" = coordinator ]; then exec '" << asgd_test::asgd_cli_path() << "' \"$@\"; fi\n"
      << "echo \"asgd: error: --made-up: not a flag of asgd $1\" >&2\n"
      << "exit 2\n";
  }
  std::filesystem::permissions(program, std::filesystem::perms::owner_all);
  LocalClusterOptions o;
  o.program = program.string();
  o.coordinator_args = {"--listen", "tcp://127.0.0.1:0", "--join-timeout", "30", "--data-dir", dir.string(),
                        "--workers", "2", "--shards", "1", "--epochs", "1"};
  o.workers = 2;
  o.shards = 1;
  o.join_timeout_s = 30;
  o.max_restarts = 3;
  o.shards_restartable = true;  // as with --checkpoint-dir: the shard too would be started again
  const auto start = std::chrono::steady_clock::now();
  std::stop_source never;
  const Result<int> code = LocalCluster(o).run(never.get_token());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(code.ok()) << code.status().to_string();
  EXPECT_NE(*code, 0) << log.all();
  EXPECT_EQ(log.count("starting it again"), 0u) << log.all();
  EXPECT_EQ(log.count("exited with status 2; that status is a usage error"), 3u) << log.all();
  EXPECT_LT(took, 20.0) << "waited for --join-timeout (30 s) instead";
}

}  // namespace
}  // namespace asgd
