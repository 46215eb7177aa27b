#include "asgd/runtime.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "test_data.hpp"

namespace asgd {
namespace {

using namespace std::chrono_literals;

JobConfig mnist_job(const std::string& dir, std::uint32_t epochs, std::uint64_t seed) {
  JobConfig c;
  c.data_dir = dir;
  c.workers = 2;
  c.epochs = epochs;
  c.seed = seed;
  return c;
}

TEST(Runtime, TwoRuntimesInOneProcessEachTrainTheirOwnJobAtTheSameTime) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime a, b;
  std::atomic<int> epochs_a = 0, epochs_b = 0;
  JobCallbacks ca, cb;
  ca.on_epoch = [&](const EpochMetrics&) { ++epochs_a; };
  cb.on_epoch = [&](const EpochMetrics&) { ++epochs_b; };
  auto ja = a.submit(mnist_job(dir.string(), 2, 1), ca);
  auto jb = b.submit(mnist_job(dir.string(), 1, 2), cb);
  ASSERT_TRUE(ja.ok() && jb.ok());
  EXPECT_EQ(a.running() + b.running(), 2u);  // both under way before either is waited for
  const auto& ra = ja->wait();
  const auto& rb = jb->wait();
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(ra->epochs, 2u);
  EXPECT_EQ(rb->epochs, 1u);
  EXPECT_EQ(epochs_a, 2);
  EXPECT_EQ(epochs_b, 1);
  EXPECT_GE(ra->final_test_accuracy, 0.9);
  EXPECT_GE(rb->final_test_accuracy, 0.9);
  EXPECT_TRUE(ja->done());
  EXPECT_EQ(a.running(), 0u);
}

TEST(Runtime, ACancelledJobEndsPromptlyAsCancelled) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  std::atomic<bool> started = false;
  JobCallbacks cb;
  cb.on_epoch = [&](const EpochMetrics&) { started = true; };
  auto job = rt.submit(mnist_job(dir.string(), 200, 1), cb);
  ASSERT_TRUE(job.ok());
  EXPECT_FALSE(job->wait_for(50ms));
  job->cancel();
  ASSERT_TRUE(job->wait_for(30s)) << "a cancelled job did not end";
  EXPECT_EQ(job->wait().status().code(), StatusCode::cancelled);
}

TEST(Runtime, StoppingCancelsRunningJobsAndRefusesNewOnes) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  auto job = rt.submit(mnist_job(dir.string(), 200, 1));
  ASSERT_TRUE(job.ok());
  const auto t0 = std::chrono::steady_clock::now();
  rt.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  ASSERT_TRUE(job->done());
  EXPECT_EQ(job->wait().status().code(), StatusCode::cancelled);
  auto late = rt.submit(mnist_job(dir.string(), 1, 1));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::cancelled);
  rt.stop();  // idempotent
}

TEST(Runtime, ABadConfigurationStartsNothing) {
  Runtime rt;
  JobConfig c;
  c.workers = 0;
  auto job = rt.submit(c);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(rt.running(), 0u);
}

}  // namespace
}  // namespace asgd
