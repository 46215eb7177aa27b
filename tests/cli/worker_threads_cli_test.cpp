// How many threads a worker process computes on without --threads: the
// CPUs it may use, divided among the job's worker processes that compute on
// the same ones, not among all of the job's workers (which on a cluster run
// on other hosts). The coordinator process's evaluations likewise. Real processes: a coordinator, a shard and two workers,
// one of them bound to a CPU of its own with taskset.

#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "base/cpus.hpp"
#include "cli/cli_run.hpp"
#include "http_client.hpp"
#include "test_data.hpp"

namespace {

using asgd_test::asgd;
using asgd_test::CliRun;

struct Job {
  CliRun coordinator, shard, first, second;
};

// A 2-worker, 1-shard, 1-epoch MNIST job as four processes; the second
// worker runs under `second_launcher`.
Job run_job(const std::string& second_launcher) {
  const std::string mnist = asgd_test::dataset_dir("mnist").string();
  const int port = asgd_test::free_port();
  EXPECT_GT(port, 0);
  const std::string at = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator = std::async(std::launch::async, [&] {
    return asgd("coordinator --workers 2 --shards 1 --epochs 1 --join-timeout 60 --listen " + at + " --data-dir " +
                mnist);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto shard = std::async(std::launch::async, [&] { return asgd("shard --coordinator " + at); });
  auto first =
      std::async(std::launch::async, [&] { return asgd("worker --coordinator " + at + " --data-dir " + mnist); });
  CliRun second = asgd("worker --coordinator " + at + " --data-dir " + mnist, {}, second_launcher);
  return {coordinator.get(), shard.get(), first.get(), std::move(second)};
}

std::string threads_line(unsigned threads, unsigned cpus, unsigned sharers) {
  return fmt::format("{} compute thread(s): {} usable CPU(s), shared by {} worker process(es) of this job", threads,
                     cpus, sharers);
}

std::string evaluation_line(unsigned threads, unsigned cpus, unsigned workers) {
  return fmt::format("coordinator: evaluates on {} thread(s): {} usable CPU(s), shared with {} worker process(es) of "
                     "this job",
                     threads, cpus, workers);
}

TEST(WorkerThreadsCli, AWorkerAloneOnItsCpusComputesOnAllOfThemAndWorkersOnTheSameCpusSplitThem) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const unsigned cpus = asgd::usable_cpus();
  if (asgd::affinity_cpus() < 2 || cpus < 2) GTEST_SKIP() << "one CPU: no worker can have CPUs of its own";
  if (std::system("taskset -c 1 true >/dev/null 2>&1") != 0) GTEST_SKIP() << "taskset cannot bind to CPU 1 here";

  // The second worker bound to CPU 1: each is alone on its CPUs. (Before,
  // both divided this host's CPUs by the job's 2 workers.)
  Job apart = run_job("taskset -c 1");
  ASSERT_EQ(apart.coordinator.exit_code, 0) << apart.coordinator.err;
  EXPECT_NE(apart.first.err.find(threads_line(cpus, cpus, 1)), std::string::npos) << apart.first.err;
  EXPECT_NE(apart.second.err.find(threads_line(1, 1, 1)), std::string::npos) << apart.second.err;
  // The coordinator's evaluations share its CPUs with the first worker only.
  EXPECT_NE(apart.coordinator.err.find(evaluation_line(cpus, cpus, 1)), std::string::npos) << apart.coordinator.err;

  // Both on every CPU: they split them.
  Job together = run_job("");
  ASSERT_EQ(together.coordinator.exit_code, 0) << together.coordinator.err;
  const std::string shared = threads_line(std::max(1u, cpus / 2), cpus, 2);
  EXPECT_NE(together.first.err.find(shared), std::string::npos) << together.first.err;
  EXPECT_NE(together.second.err.find(shared), std::string::npos) << together.second.err;
  EXPECT_NE(together.coordinator.err.find(evaluation_line(std::max(1u, cpus / 2), cpus, 2)), std::string::npos)
      << together.coordinator.err;
}

}  // namespace
