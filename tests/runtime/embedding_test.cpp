// What a service that embeds asgd relies on (issue 27): a runtime never takes
// its host down, never leaves a job it cannot stop, and gives back what it
// took. Only the public headers are used. The tests that limit the address
// space or measure resident memory run in a child process of their own
// (a gtest death test), so the limit and the measurement are theirs alone.

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asgd/log.hpp"
#include "asgd/model_spec.hpp"
#include "asgd/predictor.hpp"
#include "asgd/runtime.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

JobConfig small_job(const std::string& dir, std::uint32_t epochs, std::uint64_t seed) {
  JobConfig c;
  c.data_dir = dir;
  c.workers = 2;
  c.epochs = epochs;
  c.seed = seed;
  return c;
}

// Resident memory of this process in MiB.
double rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

using asgd_test::kSanitized;
using asgd_test::limit_address_space;

TEST(Embedding, ASecondStopCalledWhileTheFirstIsWaitingAlsoWaitsForTheJob) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  Runtime rt;
  std::atomic<bool> running = false;
  JobCallbacks slow;
  // Each progress report holds the job up: it takes a while to notice it
  // was cancelled, long enough to see which stop() waited for it.
  slow.on_progress = [&](const Progress&) {
    running = true;
    std::this_thread::sleep_for(150ms);
  };
  auto job = rt.submit(small_job(dir.string(), 200, 1), slow);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  const auto deadline = Clock::now() + 60s;
  while (!running && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(running) << "the job never reported progress";
  std::thread first([&] { rt.stop(); });
  std::this_thread::sleep_for(20ms);  // the first stop() has taken the job list
  rt.stop();
  EXPECT_TRUE(job->done()) << "the second stop() returned while the job was still running";
  first.join();
  EXPECT_EQ(job->wait().status().code(), StatusCode::cancelled);
}

TEST(Embedding, WorkersAndShardsPastTheirBoundsAreRefusedBeforeAnythingStarts) {
  JobConfig c;
  c.workers = kMaxWorkers + 1;
  Status s = validate(c);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("--workers 1025: must be 1 to 1024"), std::string::npos) << s.message();
  c.workers = 2;
  c.shards = kMaxShards + 1;
  s = validate(c);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("--shards 1025: must be 1 to 1024"), std::string::npos) << s.message();
}

// A model too big to hold, whichever door it comes through: refused as
// invalid_argument, never a throw (bad_alloc, length_error) at the host.
TEST(Embedding, ModelsTooBigToHoldAreRefusedNotThrown) {
  const std::vector<std::size_t> mnist = {1, 28, 28};
  for (const std::size_t width : {std::size_t{1} << 40, std::size_t{1} << 62, (std::size_t{1} << 63) + 5}) {
    ModelSpec wide("wide");
    wide.flatten().dense(width).relu().dense(10);
    Result<std::size_t> counted(0);
    ASSERT_NO_THROW(counted = validate(wide, mnist, 10));
    EXPECT_EQ(counted.status().code(), StatusCode::invalid_argument) << width;
    EXPECT_NE(counted.status().message().find("too many"), std::string::npos) << counted.status().message();
    JobConfig c;
    c.model_spec = std::make_shared<ModelSpec>(wide);
    Runtime rt;
    Result<JobHandle> job = Status::Internal("not run");
    ASSERT_NO_THROW(job = rt.submit(c));
    if (job.ok()) {  // refused once the data's shape is known: the job ends with it
      EXPECT_EQ(job->wait().status().code(), StatusCode::invalid_argument) << job->wait().status().to_string();
    } else {
      EXPECT_EQ(job.status().code(), StatusCode::invalid_argument) << job.status().to_string();
    }
    const std::vector<float> params(10);
    Result<Predictor> predictor = Status::Internal("not built");
    ASSERT_NO_THROW(predictor = Predictor::from_params(wide, mnist, 10, params));
    EXPECT_EQ(predictor.status().code(), StatusCode::invalid_argument);
  }
  ModelSpec deep("deep");
  deep.conv2d(std::size_t{1} << 40, 3).flatten().dense(10);
  EXPECT_EQ(validate(deep, mnist, 10).status().code(), StatusCode::invalid_argument);
  ModelSpec huge_output("huge-output");  // few parameters, an output of 2^40 values a sample
  huge_output.conv2d(std::size_t{1} << 32, 1).flatten().dense(10);
  EXPECT_EQ(validate(huge_output, mnist, 10).status().code(), StatusCode::invalid_argument);
}

TEST(Embedding, ASpecFromJsonWithNegativeOrMissingSizesIsRefused) {
  EXPECT_EQ(ModelSpec::from_json(R"({"name": "x", "layers": [{"kind": "dense", "units": -1}]})").status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(ModelSpec::from_json(R"({"name": "x", "layers": {}})").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(ModelSpec::from_json(R"({"name": "x", "layers": [{"kind": "dense", "units": 2.5}]})").status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(ModelSpec::from_json(R"({"name": "x", "layers": [{"kind": "conv2d", "units": 4, "kernel": "3"}]})")
                .status()
                .code(),
            StatusCode::invalid_argument);
  EXPECT_TRUE(ModelSpec::from_json(R"({"name": "x", "layers": [{"kind": "dense", "units": 10}]})").ok());
  ModelSpec odd(std::string("na\xffme"));
  std::string text;
  ASSERT_NO_THROW(text = odd.to_json());
  EXPECT_TRUE(ModelSpec::from_json(text).ok()) << text;
}

// A job of 20000 workers under a 4 GiB address-space limit: refused, or
// ended with an error, within 10 s, and its runtime destroyed. The child's
// exit status says which step failed.
int twenty_thousand_workers_in_4_gib(const std::string& dir) {
  limit_address_space(4ull << 30);
  const auto t0 = Clock::now();
  auto* rt = new Runtime;
  JobConfig c = small_job(dir, 1, 1);
  c.workers = 20000;
  c.batch = 2;
  auto job = rt->submit(c);
  if (job.ok()) {
    if (!job->wait_for(10s)) return 3;  // never ended
    if (job->wait().ok()) return 4;     // ended "well" with 20000 workers in 4 GiB?
  } else if (job.status().code() != StatusCode::invalid_argument) {
    return 5;
  }
  std::fprintf(stderr, "%s\n", (job.ok() ? job->wait().status() : job.status()).to_string().c_str());
  delete rt;
  return Clock::now() - t0 < 10s ? 0 : 6;
}

// 1000 workers are allowed, but their threads and buffers do not fit in
// 2 GiB of address space (3 GiB could hold them once CUDA's libraries were
// no longer mapped into every process): a thread that cannot start, or
// memory that is not there, must end the job with an error, not leave it
// unstoppable.
int too_big_for_its_address_space(const std::string& dir) {
  limit_address_space(2ull << 30);
  const auto t0 = Clock::now();
  auto* rt = new Runtime;
  JobConfig c = small_job(dir, 1, 1);
  c.workers = 1000;
  c.batch = 16;
  auto job = rt->submit(c);
  if (!job.ok()) return 2;
  if (!job->wait_for(20s)) return 3;
  const Status s = job->wait().status();
  std::fprintf(stderr, "%s\n", s.to_string().c_str());
  if (s.ok()) return 4;
  delete rt;
  return Clock::now() - t0 < 30s ? 0 : 6;
}

// 24 jobs on two runtimes, some cancelled; then both runtimes destroyed.
// Measured from after a first job on each of two runtimes at once, as the
// rounds run them: what the process keeps once for good (CAF's and the
// allocator's own state) is not what a job fails to give back.
//
// What a job leaks is read from the heap in use (all of malloc's arenas,
// mmapped blocks included) and the process's threads, which do not drift:
// resident memory does, by more than a small leak. OpenBLAS maps a buffer
// for each thread that calls it at once and keeps what it touched, so RSS
// rises by a few MiB whenever the rounds' threads first overlap more than
// before (CI saw it cross 1.2x + 4 MiB on an AVX-512 machine, whose kernels
// touch more of each buffer); RSS is still bounded, loosely, for a leak
// that bypasses malloc.
struct Held {
  double heap_mib;
  long threads;
  double rss_mib;
};

long threads_now() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Threads:", 0) == 0) return std::stol(line.substr(8));
  return -1;
}

Held held() {
  malloc_trim(0);
  const struct mallinfo2 m = mallinfo2();
  return {static_cast<double>(m.uordblks + m.hblkhd) / (1 << 20), threads_now(), rss_mib()};
}

int twenty_four_jobs(const std::string& dir) {
  {
    Runtime warm_a;
    Runtime warm_b;
    auto ja = warm_a.submit(small_job(dir, 1, 1));
    auto jb = warm_b.submit(small_job(dir, 1, 1));
    if (!ja.ok() || !jb.ok()) return 2;
    ja->wait();
    jb->wait();
  }
  const Held before = held();
  {
    Runtime a;
    Runtime b;
    for (int round = 0; round < 12; ++round) {
      const JobConfig c = small_job(dir, 1, round + 1);
      auto ja = a.submit(c);
      auto jb = b.submit(c);
      if (!ja.ok() || !jb.ok()) return 2;
      if (round % 3 == 2) jb->cancel();  // some end cancelled
      ja->wait();
      jb->wait();
    }
  }
  const Held after = held();
  std::fprintf(stderr, "heap in use before %.2f MiB, after 24 jobs %.2f MiB; threads %ld, %ld; RSS %.1f, %.1f MiB\n",
               before.heap_mib, after.heap_mib, before.threads, after.threads, before.rss_mib, after.rss_mib);
  // Measured so, 1.55 and 1.56 MiB (2026-11-28): a job that kept 24 KiB of
  // heap would cross the first bound.
  if (after.heap_mib > before.heap_mib + 0.5) return 1;
  if (after.threads > before.threads) return 7;
  return after.rss_mib <= before.rss_mib * 1.5 + 16.0 ? 0 : 8;
}

// Bytes in the file behind `fd` so far.
long written_to(int fd) { return ::lseek(fd, 0, SEEK_END); }

// Where a job's log lines go: stderr by default, never stdout; the host's
// sink once it gives one; nowhere at LogLevel::off.
int log_lines_go_where_the_host_says(const std::string& dir) {
  char out_name[] = "/tmp/asgd_stdout_XXXXXX";
  char err_name[] = "/tmp/asgd_stderr_XXXXXX";
  const int out = mkstemp(out_name);
  const int err = mkstemp(err_name);
  if (out < 0 || err < 0) return 90;
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(out, STDOUT_FILENO);
  dup2(err, STDERR_FILENO);
  unlink(out_name);
  unlink(err_name);
  Runtime rt;
  if (!rt.run(small_job(dir, 1, 1)).ok()) return 2;
  std::fflush(stdout);
  if (written_to(out) != 0) return 3;  // the library wrote to the host's stdout
  if (written_to(err) == 0) return 4;  // ... and nothing to stderr?
  std::vector<std::pair<LogLevel, std::string>> lines;
  set_log_sink([&](LogLevel level, std::string_view text) { lines.emplace_back(level, std::string(text)); });
  const long err_before = written_to(err);
  if (!rt.run(small_job(dir, 1, 1)).ok()) return 5;
  if (written_to(err) != err_before) return 6;  // the sink was passed by
  bool loaded = false;
  for (const auto& [level, text] : lines) loaded |= level == LogLevel::info && text.find("loaded mnist") == 0;
  if (!loaded) return 7;
  const std::size_t seen = lines.size();
  set_log_sink(nullptr, LogLevel::off);
  if (!rt.run(small_job(dir, 1, 1)).ok()) return 8;
  if (written_to(err) != err_before || lines.size() != seen) return 9;  // off is off
  set_log_sink(nullptr);
  return written_to(out) == 0 ? 0 : 10;
}

// From the embedding audit (2026-11-29): exit() while a job's callback
// destroyed a Runtime (or made one) hung for ever: the exit handler held
// the list of Runtimes while it waited for the job, and the callback
// waited for that list. `destroy` picks which; alarm() turns a hang into a
// failure.
int exit_while_a_callback_destroys_or_makes_a_runtime(const std::string& dir, bool destroy) {
  alarm(60);
  auto* rt = new Runtime;
  std::atomic<bool> in_callback = false;
  JobCallbacks cb;
  cb.on_progress = [&, dir](const Progress&) {
    if (in_callback.exchange(true)) return;
    std::this_thread::sleep_for(300ms);  // exit() begins meanwhile
    if (destroy) {
      delete rt;
      return;
    }
    Runtime late;  // made during exit(): it refuses jobs
    if (late.submit(small_job(dir, 1, 3)).status().code() != StatusCode::cancelled) _exit(5);
  };
  if (!rt->submit(small_job(dir, 200, 1), cb).ok()) return 2;
  while (!in_callback) std::this_thread::sleep_for(5ms);
  std::exit(0);
}

int exit_while_a_callback_destroys_a_runtime(const std::string& dir) {
  return exit_while_a_callback_destroys_or_makes_a_runtime(dir, true);
}
int exit_while_a_callback_makes_a_runtime(const std::string& dir) {
  return exit_while_a_callback_destroys_or_makes_a_runtime(dir, false);
}

// From a review (2026-11-29): a host's shared_ptr to its Runtime held in a
// callback, the last one once the host let go of its own: the Runtime was
// destroyed on its job's thread, which it then joined (std::terminate).
int a_callback_holds_the_last_reference_to_its_runtime(const std::string& dir) {
  alarm(60);
  auto rt = std::make_shared<Runtime>();
  JobCallbacks cb;
  cb.on_epoch = [rt](const EpochMetrics&) {};
  auto job = rt->submit(small_job(dir, 1, 1), cb);
  if (!job.ok()) return 2;
  rt.reset();  // the callback's copy is the last
  if (!job->wait().ok()) return 3;
  return job->wait()->epochs == 1 ? 0 : 4;
}

// ... and a Runtime destroyed from its job's callback, then exit() while
// that job still ran: the job was left to itself, and exit() did not wait.
int exit_after_a_callback_destroyed_its_runtime(const std::string& dir) {
  alarm(60);
  auto* rt = new Runtime;
  std::atomic<bool> deleted = false;
  JobCallbacks cb;
  cb.on_progress = [&](const Progress&) {
    if (deleted.exchange(true)) return;
    delete rt;
  };
  if (!rt->submit(small_job(dir, 200, 1), cb).ok()) return 2;
  while (!deleted) std::this_thread::sleep_for(1ms);
  std::exit(0);
}

// A thread that cannot start (the address space full) made
// Runtime::submit throw std::system_error at the host.
int submit_without_room_for_a_thread(const std::string& dir) {
  Runtime rt;
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  statm >> pages;
  asgd_test::limit_address_space(pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)) + (4u << 20));
  const auto job = rt.submit(small_job(dir, 1, 1));
  if (job.ok()) return 2;
  if (job.status().code() != StatusCode::unavailable) return 3;
  return job.status().message().find("a thread could not start") != std::string::npos ? 0 : 4;
}

// Runs `body` on the MNIST folder in a child process of its own; its exit
// status must be 0.
void expect_child_succeeds(int (*body)(const std::string&), const std::string& dir) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(body(dir)), ::testing::ExitedWithCode(0), "");
}

TEST(EmbeddingDeathTest, LogLinesGoToStderrOrTheHostsSinkAndNeverToStdout) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(log_lines_go_where_the_host_says, dir.string());
}

TEST(EmbeddingDeathTest, UnderA4GiBAddressSpaceAJobOf20000WorkersEndsWithAnErrorWithin10s) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit in 4 GiB";
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(twenty_thousand_workers_in_4_gib, dir.string());
}

TEST(EmbeddingDeathTest, AJobTooBigForItsAddressSpaceFailsAndItsRuntimeCloses) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit in the limit";
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(too_big_for_its_address_space, dir.string());
}

TEST(EmbeddingDeathTest, TwentyFourJobsOnTwoRuntimesGiveTheirMemoryBack) {
  if (kSanitized) GTEST_SKIP() << "resident memory says nothing under a sanitizer";
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(twenty_four_jobs, dir.string());
}

TEST(EmbeddingDeathTest, ExitEndsWhileAJobsCallbackDestroysItsRuntime) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(exit_while_a_callback_destroys_a_runtime, dir.string());
}

TEST(EmbeddingDeathTest, ExitEndsWhileAJobsCallbackMakesARuntime) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(exit_while_a_callback_makes_a_runtime, dir.string());
}

TEST(EmbeddingDeathTest, SubmitWithoutRoomForAThreadSaysUnavailableAndThrowsNothing) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit in the limit";
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(submit_without_room_for_a_thread, dir.string());
}

TEST(EmbeddingDeathTest, ACallbackHoldingTheLastReferenceToItsRuntimeEndsCleanly) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(a_callback_holds_the_last_reference_to_its_runtime, dir.string());
}

TEST(EmbeddingDeathTest, ExitAfterACallbackDestroyedItsRuntimeWaitsForThatJob) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  expect_child_succeeds(exit_after_a_callback_destroyed_its_runtime, dir.string());
}

}  // namespace
}  // namespace asgd
