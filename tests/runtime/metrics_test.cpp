// The metrics file's records read back (runtime/metrics.hpp): what to_json
// writes, *_from_json returns, for asgd compare --processes, which reads
// each run's file; a record with a field missing or of another type is an
// error that names it.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <sstream>

#include "runtime/metrics.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

WorkerPhases phases(double base) {
  return {base, base + 0.1, base + 0.2, base + 0.3, 0.0, 0.05, base + 0.4, base + 0.25, 0.01};
}

TEST(MetricsRecords, ASummaryWrittenAndReadBackIsTheSame) {
  JobSummary s;
  s.policy = "ssp";
  s.policy_options = {{"staleness", 3}};
  s.lr = 0.013;
  s.momentum = 0.9;
  s.optimizer = "momentum";
  s.lr_schedule = "step";
  s.weight_decay = 5e-4;
  s.seed = 12345678901ULL;
  s.compress = "fp16";
  s.threads = 3;
  s.staleness = 3;
  s.workers = 2;
  s.shards = 1;
  s.device = "cpu";
  s.model = "mlp";
  s.dataset = "mnist";
  s.epochs = 3;
  s.wall_s = 4.5;
  s.train_s = 3.25;
  s.samples_per_s = 50768.5;
  s.final_test_accuracy = 0.9777;
  s.time_to_target_s = 1.5;
  s.updates_applied = 2580;
  s.staleness_mean = 1.38;
  s.staleness_p99 = 3;
  s.staleness_max = 3;
  s.staleness_histogram = {10, 20, 30, 5};
  s.worker_batch = {64, 64};
  s.worker_wait_s = {0.1, 0.2};
  s.worker_phases = {phases(1.0), phases(2.0)};
  s.shard_optimizer_s = {0.7};
  s.evaluation_s = 0.3;
  s.energy.measured = true;
  s.energy.devices = {{"cpu package 0", 30.0}, {"dram 0", 2.5}};
  s.energy.joules = 32.5;
  s.energy.seconds = 4.0;
  s.workers_lost = 1;
  s.checkpoint_failures = 2;
  auto back = summary_from_json(to_json(s));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(to_json(*back), to_json(s));
  EXPECT_EQ(back->staleness, 3u);
  EXPECT_EQ(back->energy.edp_js(), s.energy.edp_js());
  EXPECT_EQ(back->seed, 12345678901ULL);
  EXPECT_EQ(back->lr_schedule, "step");

  JobSummary none;  // no staleness bound, no target reached, energy not measured
  none.energy.reason = "no RAPL here";
  auto empty = summary_from_json(to_json(none));
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_FALSE(empty->staleness);
  EXPECT_FALSE(empty->time_to_target_s);
  EXPECT_EQ(empty->energy.reason, "no RAPL here");
  nlohmann::json older = to_json(none);  // a file of an asgd from before the policy's settings were written
  for (const char* key : {"policy_options", "lr", "momentum", "optimizer", "lr_schedule", "weight_decay", "seed",
                          "compress", "threads"})
    older.erase(key);
  EXPECT_TRUE(summary_from_json(older).ok());
}

TEST(MetricsRecords, EpochsAndEvaluationsReadBackAndAMissingLossIsNaN) {
  EpochMetrics m{2, 3.5, 0.25, 0.97, 40000.0, 860, {phases(1.0)}};
  auto e = epoch_from_json(to_json(m));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(to_json(*e), to_json(m));
  EvalPoint p{1.25, 0.95, 400, 25600, std::nan("")};  // no batch reported since the last point
  auto q = eval_from_json(to_json(p));
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(std::isnan(q->train_loss));
  EXPECT_EQ(q->samples, 25600u);
}

TEST(MetricsRecords, ARecordWithAFieldMissingOrMistypedIsAnErrorNamingIt) {
  auto j = to_json(JobSummary{});
  j.erase("train_s");
  auto missing = summary_from_json(j);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("train_s"), std::string::npos) << missing.status().message();
  auto epoch = to_json(EpochMetrics{});
  epoch["updates"] = "many";
  EXPECT_EQ(epoch_from_json(epoch).status().code(), StatusCode::invalid_argument);
}

// An earlier file is emptied at the first line, not when the writer opens
// it: a job refused after opening it (a checkpoint folder it cannot
// write, a status port in use) emptied the file it promised to leave.
TEST(MetricsWriter, AnEarlierFileIsEmptiedAtTheFirstLineNotAtOpen) {
  const asgd_test::TempDir dir;
  const std::string file = (dir / "m.jsonl").string();
  std::ofstream(file) << "{\"event\":\"summary\"}\n";
  {
    auto refused = MetricsWriter::open(file);
    ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  }
  std::stringstream kept;
  kept << std::ifstream(file).rdbuf();
  EXPECT_EQ(kept.str(), "{\"event\":\"summary\"}\n");
  auto w = MetricsWriter::open(file);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->write({{"event", "epoch"}}).ok());
  std::stringstream now;
  now << std::ifstream(file).rdbuf();
  EXPECT_EQ(now.str(), "{\"event\":\"epoch\"}\n");
}

// Not a file: /dev/null takes the lines (emptying it failed at the first
// line, after the job had trained: exit 1); a named pipe with a reader gets
// them; one that no process reads is refused at open (the job hung there,
// deaf to Ctrl-C).
TEST(MetricsWriter, DevNullAndAReadPipeTakeTheLinesAndAnUnreadPipeIsRefusedAtOnce) {
  auto null = MetricsWriter::open("/dev/null");
  ASSERT_TRUE(null.ok()) << null.status().to_string();
  EXPECT_TRUE(null->write({{"event", "epoch"}}).ok());

  const asgd_test::TempDir dir;
  const std::string pipe = (dir / "pipe").string();
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  const auto asked = std::chrono::steady_clock::now();
  auto unread = MetricsWriter::open(pipe);
  ASSERT_FALSE(unread.ok());
  EXPECT_NE(unread.status().message().find("a named pipe that no process is reading"), std::string::npos)
      << unread.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(2));

  const int reader = ::open(pipe.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  auto read = MetricsWriter::open(pipe);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  ASSERT_TRUE(read->write({{"event", "epoch"}}).ok());
  char got[64] = {};
  EXPECT_EQ(::read(reader, got, sizeof got - 1), 18);
  EXPECT_STREQ(got, "{\"event\":\"epoch\"}\n");
  ::close(reader);
}

// A pipe whose reader has gone: the write fails (EPIPE) and the job goes
// on; SIGPIPE ended the whole process (exit 141, no summary, no model).
TEST(MetricsWriter, APipeWhoseReaderWentFailsTheWriteWithoutSigpipe) {
  const asgd_test::TempDir dir;
  const std::string pipe = (dir / "pipe").string();
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  const int reader = ::open(pipe.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  auto w = MetricsWriter::open(pipe);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ::close(reader);
  const Status failed = w->write({{"event", "epoch"}});
  EXPECT_EQ(failed.code(), StatusCode::io_error);
  EXPECT_NE(failed.message().find("Broken pipe"), std::string::npos) << failed.message();
  sigset_t pending;
  sigpending(&pending);
  EXPECT_NE(sigismember(&pending, SIGPIPE), 1) << "a SIGPIPE left pending";
}

// /dev/stdout when stdout goes to a file: the lines go after what the
// process printed, through its offset (the file was emptied at the first
// line, and a descriptor of its own then wrote over the printed lines).
TEST(MetricsWriter, TheFileStdoutGoesToGetsTheLinesAfterWhatWasPrinted) {
  const asgd_test::TempDir dir;
  const std::string out = (dir / "out.txt").string();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0) _exit(3);
    std::printf("heading\n");
    auto w = MetricsWriter::open("/dev/stdout");
    if (!w.ok() || !w->write({{"event", "epoch"}}).ok()) _exit(4);
    std::printf("done\n");
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  EXPECT_EQ(text.str(), "heading\n{\"event\":\"epoch\"}\ndone\n");
}

// A write that fails part-way (the file size limit here; a full disk
// alike) is cut back to the last whole line: the file stays JSON Lines.
TEST(MetricsWriter, AWriteThatFailsPartWayLeavesNoTornLine) {
  const asgd_test::TempDir dir;
  const std::string file = (dir / "m.jsonl").string();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the limit and the signal only for this process
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100, 100};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
    auto w = MetricsWriter::open(file);
    if (!w.ok()) _exit(4);
    for (int i = 0; i < 10; ++i)
      if (!w->write({{"event", "epoch"}, {"epoch", i}, {"padding", "0123456789"}}).ok()) _exit(0);
    _exit(5);  // the limit never bit
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(file);
  std::size_t lines = 0;
  std::string text, line;
  for (; std::getline(in, line); ++lines) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
    text += line + "\n";
  }
  EXPECT_GE(lines, 1u);
  EXPECT_LE(text.size(), 100u);
  std::stringstream all;
  all << std::ifstream(file).rdbuf();
  EXPECT_EQ(all.str(), text) << "ends with a whole line";
}

}  // namespace
}  // namespace asgd
