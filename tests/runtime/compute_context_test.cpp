// Each job computes with a thread budget of its own (JobConfig::threads),
// held by the compute context the job makes, not by a process-wide setting:
// two jobs at once with different budgets each use theirs.

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <stop_token>
#include <thread>

#include "asgd/asgd.hpp"
#include "base/cpus.hpp"
#include "captured_log.hpp"
#include "compute/context.hpp"
#include "runtime/job_internal.hpp"

namespace asgd {
namespace {

LabeledSamples images(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  LabeledSamples s;
  for (std::size_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::int32_t>(i % 2);
    for (std::size_t p = 0; p < 64; ++p) s.values.push_back((label ? 1.0f : -1.0f) + noise(rng));
    s.labels.push_back(label);
  }
  return s;
}

// A job whose layers split their batches (convolution, BatchNorm) on one
// worker with `threads` compute threads; `context` receives its context.
Result<JobSummary> run_with_threads(std::uint32_t threads, std::shared_ptr<const ComputeContext>& context) {
  auto data = std::make_shared<UserDataset>();
  data->name = "images";
  data->sample_shape = {1, 8, 8};
  data->classes = 2;
  data->train = images(128, 1);
  data->validation = images(32, 2);
  data->test = images(32, 3);
  JobConfig config;
  config.workers = 1;
  config.epochs = 2;
  config.batch = 16;  // 8 chunks of 2 samples: enough for 3 threads
  config.threads = threads;
  config.model_spec = std::make_shared<const ModelSpec>(
      ModelSpec("small-cnn").conv2d(4, 3, 1, 1).batch_norm().relu().flatten().dense(2));
  ClusterHooks hooks;
  hooks.on_compute_context = [&](std::shared_ptr<const ComputeContext> c) { context = std::move(c); };
  return run_job_with(config, {}, std::stop_token{}, hooks, data);
}

TEST(ComputeContext, TwoJobsAtOnceEachComputeOnTheirOwnThreadCount) {
  std::shared_ptr<const ComputeContext> one, three;
  Result<JobSummary> first = Status::Internal("not run"), second = Status::Internal("not run");
  {
    std::jthread a([&] { first = run_with_threads(1, one); });
    std::jthread b([&] { second = run_with_threads(3, three); });
  }
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_TRUE(one && three);
  EXPECT_EQ(one->threads(), 1u);
  EXPECT_EQ(three->threads(), 3u);
  // The worker's model and the coordinator's (evaluation) took theirs.
  EXPECT_EQ(one->pools(), 2u);
  EXPECT_EQ(three->pools(), 2u);
  // What the jobs' layers ran on: each its own budget, whichever job set
  // anything process-wide last.
  EXPECT_EQ(one->widest_loop(), 1u);
  EXPECT_EQ(three->widest_loop(), 3u);
}

// More compute threads than the CPUs (2 workers of --threads 2 on 2 cores
// made an epoch 11x as long) is said in the log; a budget that fits is not.
TEST(ComputeContext, MoreComputeThreadsThanCpusIsWarnedOf) {
  std::shared_ptr<const ComputeContext> context;
  for (const std::uint32_t threads : {1u, usable_cpus() + 1}) {
    const asgd_test::CapturedLog log;
    ASSERT_TRUE(run_with_threads(threads, context).ok());
    EXPECT_EQ(log.count("compute threads on " + std::to_string(usable_cpus()) + " usable CPUs"), threads == 1 ? 0u : 1u)
        << threads;
  }
}

}  // namespace
}  // namespace asgd
