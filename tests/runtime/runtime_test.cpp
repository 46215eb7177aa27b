#include "asgd/runtime.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

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

// From the embedding API audit (2026-11-28): stop() from a job's callback
// waited for that job, which waited for the callback, for ever; wait()
// there the same. Now the job is cancelled and ends once the callback
// returns, and wait() says why it cannot wait.
TEST(Runtime, StopAndWaitFromAJobsOwnCallbackDoNotWaitForThatJob) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  std::optional<JobHandle> self;
  std::mutex mu;
  std::atomic<bool> stopped = false;
  std::string waited;
  JobCallbacks cb;
  cb.on_progress = [&](const Progress&) {
    if (stopped.exchange(true)) return;
    std::lock_guard lock(mu);
    waited = self->wait().status().to_string();
    EXPECT_FALSE(self->wait_for(10ms));
    rt.stop();
  };
  {
    std::lock_guard lock(mu);
    auto job = rt.submit(mnist_job(dir.string(), 200, 1), cb);
    ASSERT_TRUE(job.ok());
    self = *job;
  }
  ASSERT_TRUE(self->wait_for(60s)) << "the job stopped from its own callback did not end";
  EXPECT_TRUE(stopped);
  EXPECT_EQ(self->wait().status().code(), StatusCode::cancelled);
  EXPECT_NE(waited.find("JobHandle::wait() from the job's own callback would never return"), std::string::npos)
      << waited;
  EXPECT_EQ(rt.submit(mnist_job(dir.string(), 1, 1)).status().code(), StatusCode::cancelled);
}

// From the embedding audit (2026-11-29): a stop() from a job's callback
// took the job out of the Runtime's list and detached it, so the host's
// own stop() returned (and running() said 0) while that job still ran.
TEST(Runtime, AStopAfterOneFromAJobsOwnCallbackWaitsForThatJob) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  std::atomic<bool> stopped_inside = false;
  JobCallbacks cb;
  cb.on_progress = [&](const Progress&) {
    if (stopped_inside.load()) return;
    rt.stop();
    stopped_inside = true;
    std::this_thread::sleep_for(500ms);  // the job cannot end before this returns
  };
  auto job = rt.submit(mnist_job(dir.string(), 200, 1), cb);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(asgd_test::eventually([&] { return stopped_inside.load(); }, 60s));
  EXPECT_EQ(rt.running(), 1u) << "the job is still in its callback";
  rt.stop();
  EXPECT_TRUE(job->done()) << "stop() returned while the job still ran";
  EXPECT_EQ(rt.running(), 0u);
  EXPECT_EQ(job->wait().status().code(), StatusCode::cancelled);
}

// Two jobs of one Runtime, each stopping it from its own callback at the
// same time: neither waits for the other (each waiting to join the
// other's thread would never end).
TEST(Runtime, TwoJobsStoppingTheirRuntimeFromTheirCallbacksAtOnceBothEnd) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  std::atomic<int> inside = 0;
  std::atomic<bool> a_done = false, b_done = false;
  const auto stopping = [&](std::atomic<bool>& done) {
    JobCallbacks cb;
    cb.on_progress = [&](const Progress&) {
      if (done.exchange(true)) return;
      ++inside;
      const auto until = std::chrono::steady_clock::now() + 10s;  // both inside at once
      while (inside.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
      rt.stop();
    };
    return cb;
  };
  auto a = rt.submit(mnist_job(dir.string(), 200, 1), stopping(a_done));
  auto b = rt.submit(mnist_job(dir.string(), 200, 2), stopping(b_done));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->wait_for(60s)) << "job a did not end";
  EXPECT_TRUE(b->wait_for(60s)) << "job b did not end";
  EXPECT_EQ(inside.load(), 2) << "both callbacks stopped the runtime";
  rt.stop();
  EXPECT_EQ(rt.running(), 0u);
}

// A JobHandle moved from crashed at its next call (its state was gone);
// wait()'s result outlived the job's bookkeeping only while a handle did.
TEST(Runtime, AHandleMovedFromStillRefersToItsJobAndWaitsResultIsTheCallers) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  auto job = rt.submit(mnist_job(dir.string(), 200, 1));
  ASSERT_TRUE(job.ok());
  JobHandle moved = std::move(*job);
  EXPECT_FALSE(job->done());  // NOLINT(bugprone-use-after-move): what the test is about
  job->cancel();
  const auto& result = moved.wait();
  EXPECT_TRUE(job->done());
  const auto& first = rt.submit(mnist_job(dir.string(), 1, 2))->wait();  // its handle is gone at the ';'
  ASSERT_TRUE(rt.submit(mnist_job(dir.string(), 1, 3)).ok());            // reaps the job above
  EXPECT_EQ(result.status().code(), StatusCode::cancelled);
  EXPECT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->epochs, 1u);
}

// A callback that throws stops the job as the host's doing (cancelled,
// naming the callback), not as asgd's ("internal error: the coordinator
// failed: ...").
TEST(Runtime, ACallbackThatThrowsStopsItsJobSayingWhichAndWhat) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobCallbacks cb;
  cb.on_epoch = [](const EpochMetrics&) { throw std::runtime_error("the host's database is down"); };
  const auto r = run_job(mnist_job(dir.string(), 3, 1), cb);
  EXPECT_EQ(r.status().code(), StatusCode::cancelled);
  EXPECT_EQ(r.status().message(),
            "the job's on_epoch callback threw (the host's database is down); the job stopped");
}

// A job still training when the program exits (exit(), or main returning
// with a static Runtime): exit() cancels it before the libraries it uses
// are torn down; the job used to crash the exit (SIGSEGV in OpenBLAS's
// sgemm, or in the log once its statics were gone).
TEST(RuntimeDeathTest, ExitWhileAJobTrainsEndsTheProgramCleanly) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int repeat = 0; repeat < 3; ++repeat) {
    EXPECT_EXIT(
        {
          Runtime rt;
          static Runtime kept;  // destroyed by exit(), its job still training
          (void)rt.submit(mnist_job(dir.string(), 200, 1));
          (void)kept.submit(mnist_job(dir.string(), 200, 2));
          std::this_thread::sleep_for(1500ms);
          std::exit(0);
        },
        testing::ExitedWithCode(0), "");
  }
}

TEST(Runtime, AJobsSummaryCarriesTheNormalisationAPredictorNeeds) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  std::vector<float> params;
  JobCallbacks cb;
  cb.on_final_params = [&](std::span<const float> p) { params.assign(p.begin(), p.end()); };
  const auto r = run_job(mnist_job(dir.string(), 1, 1), cb);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->input_mean.size(), 1u);
  ASSERT_EQ(r->input_stddev.size(), 1u);
  EXPECT_NEAR(r->input_mean[0], 0.1307, 0.002);  // MNIST's training split
  EXPECT_NEAR(r->input_stddev[0], 0.3081, 0.002);
}

// A short job run while a long one with the same `shared` setting trains
// (in a Runtime of this process): its result then, and once the long one
// was cancelled and has ended (`between` called before that second run).
struct Contended {
  Result<JobSummary> during = Status::Internal("not run");
  Result<JobSummary> after = Status::Internal("not run");
};
Contended while_another_job_trains(const std::string& data, const std::function<void(JobConfig&)>& shared,
                                   const std::function<void()>& between = [] {}) {
  Contended out;
  Runtime rt;
  std::atomic<bool> training = false;
  JobCallbacks cb;
  cb.on_progress = [&](const Progress&) { training = true; };
  JobConfig first = mnist_job(data, 200, 1);
  shared(first);
  auto job = rt.submit(first, cb);
  EXPECT_TRUE(job.ok());
  if (!job.ok()) return out;
  EXPECT_TRUE(asgd_test::eventually([&] { return training.load(); }, 60s));
  JobConfig second = mnist_job(data, 1, 2);
  shared(second);
  out.during = run_job(second);
  job->cancel();
  EXPECT_TRUE(job->wait_for(60s));
  between();
  out.after = run_job(second);
  return out;
}

// Two jobs writing one checkpoint folder at once overwrote each other's
// shard checkpoints (one's write failed, renamed from under it), and the
// folder held whichever finished last: the second is refused now, in this
// process as in another; once the first has ended the folder is free.
TEST(Runtime, OneJobAtATimeWritesACheckpointFolder) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const std::string folder = (scratch / "ckpt").string();
  const auto r = while_another_job_trains(dir.string(), [&](JobConfig& c) { c.checkpoint_dir = folder; });
  EXPECT_EQ(r.during.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(r.during.status().message(), "--checkpoint-dir " + folder +
                                             ": another job is writing its checkpoints there (in this process or "
                                             "another); give each job a folder of its own");
  EXPECT_TRUE(r.after.ok()) << r.after.status().to_string();
}

// From the second embedding audit (2026-11-29): two jobs given one metrics
// file wrote over each other's lines (a broken first line, the rest of
// whichever wrote last) and both ended ok. The second is refused before it
// empties the file, as for a checkpoint folder.
TEST(Runtime, OneJobAtATimeWritesAMetricsFile) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const std::string file = (scratch / "m.jsonl").string();
  std::size_t lines = 0;
  const auto r = while_another_job_trains(dir.string(), [&](JobConfig& c) { c.metrics_out = file; }, [&] {
    std::ifstream in(file);  // the long job's, whole: the refused one wrote nothing, nor emptied it
    for (std::string line; std::getline(in, line); ++lines)
      EXPECT_TRUE(nlohmann::json::accept(line)) << "line " << lines << ": " << line;
  });
  EXPECT_GE(lines, 1u) << "the long job's lines, its stop line last";
  EXPECT_EQ(r.during.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.during.status().message().find("another job is writing it"), std::string::npos)
      << r.during.status().message();
  EXPECT_TRUE(r.after.ok()) << r.after.status().to_string();
}

// wait_for(milliseconds::max()), a host's "for ever", overflowed inside the
// standard library's wait_for and returned false at once on a running job.
TEST(Runtime, WaitForWithTheLargestTimeoutWaitsForTheEnd) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  auto job = rt.submit(mnist_job(dir.string(), 1, 1));
  ASSERT_TRUE(job.ok());
  EXPECT_TRUE(job->wait_for(std::chrono::milliseconds::max()));
  EXPECT_TRUE(job->done());
  EXPECT_TRUE(job->wait().ok()) << job->wait().status().to_string();
}

// stop() of Runtime B from a callback of a job of Runtime A, while another
// thread's B.stop() was under way, took itself for a call from B's own job
// and returned at once, B's job still running.
TEST(Runtime, StopFromAnotherRuntimesJobCallbackWaitsForItsJobs) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime a, b;
  std::atomic<bool> slow_callback = false;
  JobCallbacks slow;
  slow.on_progress = [&](const Progress&) {  // holds B's job (and the first stop) up for a while
    if (!slow_callback.exchange(true)) std::this_thread::sleep_for(2s);
  };
  auto long_job = b.submit(mnist_job(dir.string(), 200, 1), slow);
  ASSERT_TRUE(long_job.ok());
  ASSERT_TRUE(asgd_test::eventually([&] { return slow_callback.load(); }, 60s));
  std::thread first_stop([&] { b.stop(); });
  std::this_thread::sleep_for(200ms);
  std::atomic<bool> asked = false, b_done_after = false;
  JobCallbacks cb;
  cb.on_progress = [&](const Progress&) {
    if (asked.exchange(true)) return;
    b.stop();
    b_done_after = long_job->done();
  };
  auto caller = a.submit(mnist_job(dir.string(), 1, 2), cb);
  ASSERT_TRUE(caller.ok());
  caller->wait();
  first_stop.join();
  ASSERT_TRUE(asked.load()) << "the job made no progress report";
  EXPECT_TRUE(b_done_after.load()) << "B.stop() returned with B's job still running";
  EXPECT_EQ(long_job->wait().status().code(), StatusCode::cancelled);
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
