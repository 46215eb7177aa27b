// How many threads a worker process computes on without --threads: the
// CPUs it may use, divided among the job's worker processes that compute on
// any of the same ones, not among all of the job's workers (which on a
// cluster run on other hosts). The coordinator process's evaluations
// likewise. Real processes: a coordinator, a shard and two workers, bound to
// CPUs with taskset.

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

// A 2-worker, 1-shard, 1-epoch MNIST job as four processes; the workers
// run under `first_launcher` and `second_launcher`.
Job run_job(const std::string& first_launcher, const std::string& second_launcher) {
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
  auto first = std::async(std::launch::async, [&] {
    return asgd("worker --coordinator " + at + " --data-dir " + mnist, {}, first_launcher);
  });
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

TEST(WorkerThreadsCli, WorkersAloneOnTheirCpusComputeOnThemAndWorkersWhoseCpusOverlapSplitThem) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const unsigned cpus = asgd::usable_cpus();
  if (asgd::affinity_cpus() < 2 || cpus < 2) GTEST_SKIP() << "one CPU: no worker can have CPUs of its own";
  if (std::system("taskset -c 1 true >/dev/null 2>&1") != 0) GTEST_SKIP() << "taskset cannot bind to CPU 1 here";
  const unsigned half = std::max(1u, cpus / 2);

  // Each worker bound to a CPU of its own: alone on it. The coordinator's
  // evaluations share its CPUs with both.
  Job apart = run_job("taskset -c 0", "taskset -c 1");
  ASSERT_EQ(apart.coordinator.exit_code, 0) << apart.coordinator.err;
  EXPECT_NE(apart.first.err.find(threads_line(1, 1, 1)), std::string::npos) << apart.first.err;
  EXPECT_NE(apart.second.err.find(threads_line(1, 1, 1)), std::string::npos) << apart.second.err;
  EXPECT_NE(apart.coordinator.err.find(evaluation_line(half, cpus, 2)), std::string::npos) << apart.coordinator.err;

  // The second on CPU 1, the first on every CPU: CPU 1 is both's. (Before,
  // only the same CPUs counted, and the first took them all.)
  Job overlapping = run_job("", "taskset -c 1");
  ASSERT_EQ(overlapping.coordinator.exit_code, 0) << overlapping.coordinator.err;
  EXPECT_NE(overlapping.first.err.find(threads_line(half, cpus, 2)), std::string::npos) << overlapping.first.err;
  EXPECT_NE(overlapping.second.err.find(threads_line(1, 1, 2)), std::string::npos) << overlapping.second.err;

  // Both on every CPU: they split them.
  Job together = run_job("", "");
  ASSERT_EQ(together.coordinator.exit_code, 0) << together.coordinator.err;
  const std::string shared = threads_line(half, cpus, 2);
  EXPECT_NE(together.first.err.find(shared), std::string::npos) << together.first.err;
  EXPECT_NE(together.second.err.find(shared), std::string::npos) << together.second.err;
  EXPECT_NE(together.coordinator.err.find(evaluation_line(half, cpus, 2)), std::string::npos)
      << together.coordinator.err;
}

// How many worker processes said they run under SCHED_BATCH.
std::size_t batch_lines(const std::string& out) {
  std::size_t n = 0;
  for (std::size_t at = 0; (at = out.find("worker: every thread under SCHED_BATCH", at)) != std::string::npos; ++at) ++n;
  return n;
}

// asgd cluster binds each worker process to CPUs of its own when there are
// no more workers than CPUs (each then computes on its share alone), unless
// --threads asks for more than a share, and with --bind-workers off leaves
// them to share every CPU; either way under SCHED_BATCH, unless
// --worker-scheduling normal.
TEST(WorkerThreadsCli, AsgdClusterGivesEachWorkerCpusOfItsOwnUnlessToldNotTo) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const unsigned cpus = asgd::usable_cpus();
  if (asgd::affinity_cpus() < 2 || cpus != asgd::affinity_cpus())
    GTEST_SKIP() << "fewer than 2 CPUs, or a CPU limit that time-shares them: no binding";
  const std::string job = "cluster --workers 2 --epochs 1 --validation-size 1000 --data-dir " +
                          asgd_test::dataset_dir("mnist").string();
  CliRun bound = asgd(job);
  ASSERT_EQ(bound.exit_code, 0) << bound.out << bound.err;
  const unsigned first = cpus - cpus / 2, second = cpus / 2;  // the first gets the odd one
  EXPECT_NE(bound.out.find("each worker process on CPUs of its own (worker 0 "), std::string::npos) << bound.out;
  EXPECT_NE(bound.out.find("), under SCHED_BATCH; --bind-workers off"), std::string::npos) << bound.out;
  // What each worker process found its scheduling policy to be.
  EXPECT_EQ(batch_lines(bound.out), 2u) << bound.out;
  // What each worker process found its affinity mask to allow.
  EXPECT_NE(bound.out.find("worker 0: " + threads_line(first, first, 1)), std::string::npos) << bound.out;
  EXPECT_NE(bound.out.find("worker 1: " + threads_line(second, second, 1)), std::string::npos) << bound.out;

  CliRun shared = asgd(job + " --bind-workers off");
  ASSERT_EQ(shared.exit_code, 0) << shared.out << shared.err;
  EXPECT_EQ(shared.out.find("CPUs of its own"), std::string::npos) << shared.out;
  EXPECT_NE(shared.out.find("the worker processes under SCHED_BATCH, on every CPU"), std::string::npos) << shared.out;
  EXPECT_EQ(batch_lines(shared.out), 2u) << shared.out;
  EXPECT_NE(shared.out.find("worker 1: " + threads_line(std::max(1u, cpus / 2), cpus, 2)), std::string::npos)
      << shared.out;

  // More threads than a worker's share of the CPUs: left unbound; and
  // scheduled as started when asked.
  CliRun threads = asgd(job + " --threads " + std::to_string(first + 1) + " --worker-scheduling normal");
  ASSERT_EQ(threads.exit_code, 0) << threads.out << threads.err;
  EXPECT_EQ(threads.out.find("CPUs of its own"), std::string::npos) << threads.out;
  EXPECT_EQ(threads.out.find("SCHED_BATCH"), std::string::npos) << threads.out;
  // Two workers of that many threads each oversubscribe the CPUs: said, as
  // asgd train says it (the cluster ran 7.6x slower without a word).
  EXPECT_NE(threads.out.find("2 worker process(es) x " + std::to_string(first + 1) + " compute threads on " +
                             std::to_string(cpus) + " usable CPU(s)"),
            std::string::npos)
      << threads.out;

  CliRun wrong = asgd(job + " --bind-workers some");
  EXPECT_EQ(wrong.exit_code, 2) << wrong.out << wrong.err;
  EXPECT_NE(wrong.err.find("--bind-workers"), std::string::npos) << wrong.err;
}

// --cpus "" (a script's unset variable) ran the process unbound.
TEST(WorkerThreadsCli, AnEmptyCpuListIsRefused) {
  const CliRun r = asgd("worker --coordinator tcp://127.0.0.1:1 --join-timeout 1 --cpus ''");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--cpus: an empty CPU list (write it as 0-3,8)"), std::string::npos) << r.err;
}

}  // namespace
