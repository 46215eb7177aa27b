// Ranks under Slurm's variables (the real Slurm runs in
// tests/launchers/slurm_example_test.sh): two runs that meet on one port do
// not train as one job, and a derived port another job holds is named.

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>

#include "cli/cli_run.hpp"
#include "http_client.hpp"
#include "runtime/launcher.hpp"
#include "test_data.hpp"

namespace {

using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;

// Rank `rank` of 3 (a coordinator, a shard, a worker) of step `step` of
// Slurm job 77, all on this host.
std::string slurm_rank(int rank, int step) {
  return "env SLURM_PROCID=" + std::to_string(rank) + " SLURM_NTASKS=3 SLURM_LOCALID=" + std::to_string(rank) +
         " SLURM_JOB_NODELIST=127.0.0.1 SLURM_JOB_ID=77 SLURM_STEP_ID=" + std::to_string(step);
}

// Two steps given one port (by hand here; derived, they had the same one):
// the second's coordinator cannot listen, and its shard reached the first's,
// which took it into its job (an audit saw one step train on the other's
// processes). The coordinator refuses a process of another run now.
TEST(SlurmRanksCli, AProcessOfAnotherRunIsRefusedByTheCoordinator) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const std::string job = "cluster --shards 1 --workers 1 --epochs 1 --join-timeout 4 --data-dir " + mnist.string() +
                          " --port " + std::to_string(asgd_test::free_port());
  auto coordinator = std::async(std::launch::async, [&] { return asgd(job, {}, slurm_rank(0, 0)); });
  const CliRun other = asgd(job, {}, slurm_rank(1, 1));
  expect_one_line_error(other, 2,
                        "this coordinator serves the run SLURM_JOB_ID=77 SLURM_STEP_ID=0, not SLURM_JOB_ID=77 "
                        "SLURM_STEP_ID=1: two runs were given one port (give each its own --port)");
  const CliRun first = coordinator.get();
  EXPECT_EQ(first.exit_code, 1) << first.err;  // its own shard and worker never came
  EXPECT_NE(first.err.find("missing: shard 0"), std::string::npos) << first.err;
}

// The port rank 0 derives from the job and step, taken by another program:
// named with where it came from, and --port offered (it was "bind: Address
// already in use").
TEST(SlurmRanksCli, ADerivedPortThatIsTakenIsNamedWithWhereItCameFrom) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const std::uint16_t port = asgd::port_for_job("77.5");
  asgd_test::HeldPort held(port, INADDR_ANY, 1);
  if (held.port == 0) GTEST_SKIP() << "port " << port << " is in use here already";
  const CliRun r = asgd("cluster --shards 1 --workers 1 --epochs 1 --join-timeout 4 --data-dir " + mnist.string(), {},
                        slurm_rank(0, 5));
  held.release();
  expect_one_line_error(r, 2,
                        "rank 0 cannot listen on tcp://*:" + std::to_string(port) +
                            ": that port, derived from SLURM_JOB_ID=77 and SLURM_STEP_ID=5, is taken on this host");
}

// The same for a port given with --port, or in ASGD_COORDINATOR (both
// were a bare "bind: Address already in use", exit 1); and asgd train
// under a launcher of several ranks says it runs a whole job in each.
TEST(SlurmRanksCli, AGivenPortThatIsTakenIsNamedAndTrainUnderALauncherSaysWhatItRuns) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  asgd_test::HeldPort held(0, INADDR_ANY, 1);
  ASSERT_NE(held.port, 0);
  const std::string port = std::to_string(held.port);
  const std::string job = "cluster --shards 1 --workers 1 --epochs 1 --join-timeout 4 --data-dir " + mnist.string();
  expect_one_line_error(asgd(job + " --port " + port, {}, slurm_rank(0, 0)), 2,
                        ": that port, given with --port, is taken on this host (by another job?); give every rank "
                        "--port P (a free one)");
  expect_one_line_error(
      asgd(job, {}, "env ASGD_RANK=0 ASGD_WORLD_SIZE=3 ASGD_COORDINATOR=tcp://127.0.0.1:" + port), 2,
      ": that port, from ASGD_COORDINATOR, is taken on this host (by another job?); give every rank an "
      "ASGD_COORDINATOR with a free port");
  held.release();
  const CliRun train = asgd("train --epochs 1 --validation-size 50000 --data-dir " + mnist.string(), {},
                            slurm_rank(0, 0));
  EXPECT_NE(train.err.find("asgd train runs a whole job in each of the 3 ranks slurm started"), std::string::npos)
      << train.err;
}

// --print-layout checks a submission where the data may not be (a login
// node): it does not look for the data folder; the rank itself does.
TEST(SlurmRanksCli, PrintLayoutRunsWithoutTheDataFolderAndTheRankRefusesWithoutIt) {
  const std::string job = "cluster --shards 1 --workers 1 --data-dir /nonexistent/mnist";
  const CliRun layout = asgd(job + " --print-layout", {}, slurm_rank(2, 0));
  EXPECT_EQ(layout.exit_code, 0) << layout.err;
  EXPECT_NE(layout.out.find("role: worker 0"), std::string::npos) << layout.out;
  expect_one_line_error(asgd(job, {}, slurm_rank(2, 0)), 2, "data directory /nonexistent/mnist does not exist");
  // Without a launcher too (it refused for the data folder), saying which
  // launcher-only flags a run would ignore.
  const CliRun local = asgd(job + " --print-layout --port 5000 --launcher local");
  EXPECT_EQ(local.exit_code, 0) << local.err;
  EXPECT_NE(local.out.find("launcher local: asgd cluster starts 1 coordinator, 1 shard and 1 worker processes"),
            std::string::npos)
      << local.out;
  EXPECT_NE(local.err.find("--port is for ranks under a launcher"), std::string::npos) << local.err << local.out;
}

// A worker's device under --device LIST is its item of the list, checked
// as that item: --print-layout printed the whole list, and "cuda,cpu"
// said worker 1 (cpu) would refuse to start while "cpu,cuda" said nothing.
TEST(SlurmRanksCli, PrintLayoutShowsAWorkersItemOfADeviceList) {
  const std::string rank3 = "env SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_LOCALID=3 SLURM_JOB_NODELIST=127.0.0.1 "
                            "SLURM_JOB_ID=78 SLURM_STEP_ID=0";
  const CliRun layout =
      asgd("cluster --shards 1 --workers 2 --device cuda,cpu --data-dir /nonexistent/mnist --print-layout", {}, rank3);
  EXPECT_EQ(layout.exit_code, 0) << layout.err;
  EXPECT_NE(layout.out.find("role: worker 1\n"), std::string::npos) << layout.out;
  EXPECT_NE(layout.out.find("\ndevice: cpu\n"), std::string::npos) << layout.out;
}

}  // namespace
