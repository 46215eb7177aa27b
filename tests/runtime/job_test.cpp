#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "asgd/job.hpp"
#include "runtime/config_file.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

using asgd_test::read_jsonl;

TEST(RunJob, TrainsMnistAcrossTwoWorkersAndTwoShardsAndWritesTheMetricsFile) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c;
  c.data_dir = dir.string();
  c.workers = 2;
  c.shards = 2;
  c.epochs = 2;
  c.target_accuracy = 0.5;
  const asgd_test::TempDir scratch;
  c.metrics_out = (scratch / "run.jsonl").string();
  std::vector<EpochMetrics> seen;
  JobCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& m) { seen.push_back(m); };
  auto result = run_job(c, callbacks);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->final_test_accuracy, 0.95);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].epoch, 1u);
  EXPECT_LT(seen[1].train_loss, seen[0].train_loss);
  EXPECT_GT(seen[1].updates, seen[0].updates);
  ASSERT_TRUE(result->time_to_target_s.has_value());
  // Each worker pushes once per batch; every push is applied under async.
  const std::uint64_t batches_per_worker = (27500 + 63) / 64;
  EXPECT_EQ(result->updates_applied, 2 * 2 * batches_per_worker);

  const auto lines = read_jsonl(c.metrics_out);
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(lines[i]["event"], "epoch");
    for (const char* k : {"epoch", "wall_s", "train_loss", "val_accuracy", "samples_per_s", "updates", "worker_phases"})
      EXPECT_TRUE(lines[i].contains(k)) << k;
  }
  const auto& s = lines.back();
  EXPECT_EQ(s["event"], "summary");
  const std::set<std::string> expected = {"event", "policy", "policy_options", "lr", "momentum", "optimizer",
                                          "lr_schedule", "weight_decay", "seed", "compress", "threads", "staleness", "workers", "shards", "device", "model",
                                          "dataset", "epochs", "wall_s", "train_s", "samples_per_s",
                                          "final_test_accuracy", "time_to_target_s", "updates_applied",
                                          "staleness_mean", "staleness_p99", "staleness_max",
                                          // beyond DESIGN.md's list: the histogram and per-worker figures
                                          "staleness_histogram", "worker_batch", "worker_wait_s",
                                          "malformed_frames", "nonfinite_rejected", "workers_lost",
                                          "shard_restarts", "workers_rejoined", "checkpoint_failures",
                                          // where the time and the energy went (issue 20)
                                          "worker_phases", "shard_optimizer_s", "evaluation_s", "energy",
                                          // --stop-at-target
                                          "stopped_at_target",
                                          // what a Predictor from the final parameters needs
                                          "input_mean", "input_stddev"};
  std::set<std::string> keys;
  for (const auto& [k, v] : s.items()) keys.insert(k);
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(s["policy"], "async");
  EXPECT_TRUE(s["staleness"].is_null());
  EXPECT_EQ(s["workers"], 2);
  EXPECT_EQ(s["shards"], 2);
  EXPECT_EQ(s["final_test_accuracy"], result->final_test_accuracy);
  EXPECT_GE(s["wall_s"].get<double>(), s["train_s"].get<double>());
}

TEST(RunJob, TwoJobsRunAtTheSameTimeInOneProcessWithoutSharingState) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  ASGD_REQUIRE_DATASET(fashion, "fashion-mnist");
  JobConfig a;
  a.data_dir = mnist.string();
  a.epochs = 1;
  JobConfig b = a;
  b.dataset = "fashion-mnist";
  b.data_dir = fashion.string();
  b.shards = 2;
  Result<JobSummary> ra = Status::Internal("not run"), rb = Status::Internal("not run");
  {
    std::jthread ta([&] { ra = run_job(a); });
    std::jthread tb([&] { rb = run_job(b); });
  }
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(ra->dataset, "mnist");
  EXPECT_EQ(rb->dataset, "fashion-mnist");
  EXPECT_GE(ra->final_test_accuracy, 0.93) << "MNIST";  // one epoch: about 0.96
  EXPECT_GE(rb->final_test_accuracy, 0.80) << "Fashion-MNIST";  // one epoch: about 0.85
  EXPECT_EQ(ra->updates_applied, rb->updates_applied);  // same split sizes, batch and workers
}

TEST(RunJob, StopsPromptlyAndSaysSoWhenCancelled) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c;
  c.data_dir = dir.string();
  c.epochs = 50;
  std::stop_source stop;
  stop.request_stop();
  const auto t0 = std::chrono::steady_clock::now();
  auto result = run_job(c, {}, stop.get_token());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::cancelled);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

TEST(RunJob, ReportsAMissingDataDirectoryAsNotFound) {
  JobConfig c;
  c.data_dir = "/nonexistent/asgd/mnist";
  auto result = run_job(c);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::not_found);
  EXPECT_NE(result.status().message().find("/nonexistent/asgd/mnist"), std::string::npos);
}

TEST(Validate, NamesTheFlagAndTheBadValue) {
  JobConfig c;
  c.workers = 0;
  Status s = validate(c);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("--workers 0"), std::string::npos) << s.message();
  c = {};
  c.policy = "petuum";
  s = validate(c);
  EXPECT_NE(s.message().find("--policy petuum"), std::string::npos) << s.message();
  c = {};
  c.seed = std::uint64_t{1} << 63;  // job.toml could not carry it back
  s = validate(c);
  EXPECT_NE(s.message().find("--seed 9223372036854775808: must be at most 9223372036854775806"), std::string::npos)
      << s.message();
  c = {};
  c.lr = -1;
  EXPECT_FALSE(validate(c).ok());
  c = {};
  c.target_accuracy = 1.5;
  EXPECT_FALSE(validate(c).ok());
  EXPECT_TRUE(validate(JobConfig{}).ok());
}

TEST(ConfigFile, SetsTheSameKeysAsTheFlags) {
  const asgd_test::TempDir scratch;
  const auto path = scratch / "job.toml";
  std::ofstream(path) << "dataset = \"fashion-mnist\"\nworkers = 3\nshards = 2\nlr = 0.02\n"
                         "target-accuracy = 0.9\nmetrics_out = \"m.jsonl\"\n";
  JobConfig c;
  ASSERT_TRUE(apply_toml_file(path.string(), c).ok());
  EXPECT_EQ(c.dataset, "fashion-mnist");
  EXPECT_EQ(c.workers, 3u);
  EXPECT_EQ(c.shards, 2u);
  ASSERT_TRUE(c.lr);
  EXPECT_DOUBLE_EQ(*c.lr, 0.02);
  EXPECT_DOUBLE_EQ(*c.target_accuracy, 0.9);
  EXPECT_EQ(c.metrics_out, "m.jsonl");
}

TEST(ConfigFile, RejectsUnknownKeysAndWrongTypesNamingThem) {
  const asgd_test::TempDir scratch;
  const auto path = scratch / "bad.toml";
  std::ofstream(path) << "wrokers = 3\n";
  JobConfig c;
  Status s = apply_toml_file(path.string(), c);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("wrokers"), std::string::npos) << s.message();
  std::ofstream(path) << "join-timeout = 5\n";  // a number: still not a setting (it was told to quote it)
  s = apply_toml_file(path.string(), c);
  EXPECT_NE(s.message().find("unknown setting 'join-timeout'"), std::string::npos) << s.message();
  // Values of the wrong TOML type, each naming the key (they were taken as
  // text: epochs = "1" trained, metrics-out = 5 wrote a file named 5).
  for (const auto& [line, says] :
       {std::pair{"workers = \"many\"", "key 'workers' must be a number, not \"many\""},
        std::pair{"epochs = \"1\"", "key 'epochs' must be a number, not \"1\""},
        std::pair{"stop-at-target = \"true\"", "key 'stop-at-target' must be true or false"},
        std::pair{"metrics-out = 5", "key 'metrics-out' must be a string (in quotes), not 5"},
        std::pair{"policy = 3", "key 'policy' must be a string (in quotes)"},
        std::pair{"[policy]\nname = \"bsp\"", "[policy] is a table"}}) {
    std::ofstream(path) << line << "\n";
    s = apply_toml_file(path.string(), c);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << line;
    EXPECT_NE(s.message().find("config file " + path.string() + ": " + says), std::string::npos) << s.message();
  }
  // asgd's own job.toml, from before it wrote numbers as numbers, still reads.
  std::ofstream(path) << "epochs = \"4\"\nstop-at-target = \"true\"\n";
  ASSERT_TRUE(apply_toml_file(path.string(), c, /*written_by_asgd=*/true).ok());
  EXPECT_EQ(c.epochs, 4u);
  std::ofstream(path) << "workers = -2\n";
  EXPECT_FALSE(apply_toml_file(path.string(), c).ok());
  EXPECT_EQ(apply_toml_file("/nonexistent.toml", c).code(), StatusCode::not_found);
  // One key spelled both ways (which one won depended on hash order), and
  // an integer past 64 bits (toml11 reads it as the largest one).
  std::ofstream(path) << "data_dir = \"/x\"\ndata-dir = \"/y\"\n";
  s = apply_toml_file(path.string(), c);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("are the same key, given twice"), std::string::npos) << s.message();
  std::ofstream(path) << "workers = 99999999999999999999\n";
  s = apply_toml_file(path.string(), c);
  EXPECT_NE(s.message().find("key 'workers': the integer is out of range"), std::string::npos) << s.message();
}

// `""` in a TOML file is the key left out, for every kind of key (it was
// parsed as the value: `epochs = ""` was "expected a non-negative
// integer", `dataset = ""` an unknown dataset); an unknown key is still
// refused.
TEST(ConfigFile, AnEmptyStringIsTheKeyLeftOut) {
  const asgd_test::TempDir scratch;
  const auto path = scratch / "c.toml";
  std::ofstream(path) << "epochs = \"\"\nlr = \"\"\ndataset = \"\"\npolicy = \"\"\nstatus-address = \"\"\n"
                         "stop-at-target = \"\"\nmetrics-out = \"\"\nworkers = 5\n";
  JobConfig c;
  c.metrics_out = "kept.jsonl";  // as a resumed job's value is
  const Status s = apply_toml_file(path.string(), c);
  ASSERT_TRUE(s.ok()) << s.message();
  const JobConfig defaults;
  EXPECT_EQ(c.epochs, defaults.epochs);
  EXPECT_FALSE(c.lr);
  EXPECT_EQ(c.dataset, defaults.dataset);
  EXPECT_EQ(c.policy, defaults.policy);
  EXPECT_EQ(c.status_address, defaults.status_address);
  EXPECT_EQ(c.metrics_out, "kept.jsonl");
  EXPECT_EQ(c.workers, 5u);
  std::ofstream(path) << "bogus = \"\"\n";
  EXPECT_NE(apply_toml_file(path.string(), c).message().find("unknown setting 'bogus'"), std::string::npos);
  std::ofstream(path) << "epoch = 2\n";  // a key misspelt gets the nearest, as a flag does
  EXPECT_NE(apply_toml_file(path.string(), c).message().find("unknown setting 'epoch'; did you mean 'epochs'?"),
            std::string::npos);
}

// What asgd writes (job.toml, asgd compare --processes' runs/<run>.toml,
// the coordinator's settings for its processes) is a config file a user's
// --config reads: numbers as numbers, in their shortest exact form, and
// every value back bit for bit.
TEST(ConfigFile, ToTomlWritesATypedFileThatReadsBackExactly) {
  JobConfig c;
  c.policy = "ssp";
  c.policy_options["staleness"] = 3;
  c.lr = 0.013;
  c.momentum = 0.1 + 0.2;  // 0.30000000000000004
  c.epochs = 7;
  c.stop_at_target = true;
  c.target_accuracy = 0.97;
  c.metrics_out = "run 1.jsonl";
  const std::string text = to_toml(c);
  for (const char* line : {"\nlr = 0.013\n", "\nmomentum = 0.30000000000000004\n", "\nepochs = 7\n",
                           "\nstop-at-target = true\n", "\nstaleness = 3\n", "\nmetrics-out = \"run 1.jsonl\"\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " in:\n" << text;
  const asgd_test::TempDir scratch;
  std::ofstream(scratch / "c.toml") << text;
  JobConfig back;
  ASSERT_TRUE(apply_toml_file((scratch / "c.toml").string(), back).ok());
  EXPECT_EQ(to_toml(back), text);
  EXPECT_EQ(*back.momentum, 0.1 + 0.2);
}

TEST(ConfigFile, ParsesFlagValuesStrictly) {
  JobConfig c;
  EXPECT_FALSE(set_job_field(c, "workers", "2x").ok());
  EXPECT_FALSE(set_job_field(c, "workers", "").ok());
  EXPECT_FALSE(set_job_field(c, "lr", "fast").ok());
  EXPECT_FALSE(set_job_field(c, "lr", "nan").ok());
  EXPECT_TRUE(set_job_field(c, "batch", "128").ok());
  EXPECT_EQ(c.batch, 128u);
  EXPECT_TRUE(set_job_field(c, "data_dir", "/x").ok());
  EXPECT_EQ(c.data_dir, "/x");
  // An integer too large for its field says so, not that it is negative.
  const Status big = set_job_field(c, "status-port", "70000");
  EXPECT_NE(big.message().find("expected an integer from 0 to 65535"), std::string::npos) << big.message();
  const Status huge = set_job_field(c, "epochs", "99999999999999999999999");
  EXPECT_NE(huge.message().find("expected an integer from 0 to 4294967295"), std::string::npos) << huge.message();
  EXPECT_NE(set_job_field(c, "epochs", "-1").message().find("non-negative"), std::string::npos);
}

TEST(RunJob, ReportsProgressTwiceASecondWithGrowingSamplesAnEtaAndTheEpoch) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c;
  c.data_dir = dir.string();
  c.epochs = 2;
  c.batch = 32;
  std::vector<Progress> seen;
  JobCallbacks callbacks;
  callbacks.on_progress = [&](const Progress& p) { seen.push_back(p); };
  auto result = run_job(c, callbacks);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_GE(seen.size(), 2u) << "training took " << result->train_s << " s";
  const std::uint64_t total = seen.front().total_samples;
  EXPECT_EQ(total, 2u * 55000u);  // two epochs of MNIST's training split less 5,000 for validation
  bool had_eta = false;
  bool had_loss = false;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    const Progress& p = seen[i];
    EXPECT_EQ(p.epochs, 2u);
    EXPECT_GE(p.epoch, 1u);
    EXPECT_LE(p.epoch, 2u);
    EXPECT_LE(p.samples, total);
    EXPECT_GE(p.samples_per_s, 0.0);
    if (i > 0) {
      EXPECT_GE(p.samples, seen[i - 1].samples);
      EXPECT_GT(p.wall_s, seen[i - 1].wall_s);
    }
    had_eta |= p.eta_s.has_value();
    had_loss |= std::isfinite(p.train_loss);
  }
  EXPECT_TRUE(had_eta);
  EXPECT_TRUE(had_loss);
}

}  // namespace
}  // namespace asgd

namespace asgd {
namespace {

TEST(RunJob, EvaluatesBetweenEpochsEveryEvalEverySecondsAndWritesEvalRecords) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c;
  c.data_dir = dir.string();
  c.epochs = 2;
  c.eval_every_s = 0.1;
  c.target_accuracy = 0.5;
  const asgd_test::TempDir scratch;
  c.metrics_out = (scratch / "run.jsonl").string();
  std::vector<EvalPoint> evals;
  JobCallbacks callbacks;
  callbacks.on_eval = [&](const EvalPoint& e) { evals.push_back(e); };
  auto result = run_job(c, callbacks);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_GE(evals.size(), 2u) << "training took " << result->train_s << " s";
  for (std::size_t i = 0; i < evals.size(); ++i) {
    EXPECT_GE(evals[i].val_accuracy, 0.0);
    EXPECT_LE(evals[i].val_accuracy, 1.0);
    if (i > 0) {
      EXPECT_GT(evals[i].wall_s, evals[i - 1].wall_s);
      // Counts as the workers reported them: never backwards.
      EXPECT_GE(evals[i].samples, evals[i - 1].samples);
      EXPECT_GE(evals[i].updates, evals[i - 1].updates);
    }
  }
  // A point after the first half second has seen work and a loss.
  const auto later = std::find_if(evals.begin(), evals.end(), [](const EvalPoint& e) { return e.wall_s > 1.0; });
  if (later != evals.end()) {
    EXPECT_GT(later->samples, 0u);
    EXPECT_GT(later->updates, 0u);
  }
  EXPECT_LE(evals.back().samples, static_cast<std::uint64_t>(result->samples_per_s * result->train_s) + 1);
  // The target time is no later than the first evaluation between epochs
  // that reached it (an epoch's evaluation may have been earlier).
  ASSERT_TRUE(result->time_to_target_s.has_value());
  for (const auto& e : evals) {
    if (e.val_accuracy >= 0.5) {
      EXPECT_LE(*result->time_to_target_s, e.wall_s);
      break;
    }
  }
  std::size_t eval_lines = 0;
  for (const auto& j : read_jsonl(c.metrics_out)) eval_lines += j["event"] == "eval";
  EXPECT_EQ(eval_lines, evals.size());
}

}  // namespace
}  // namespace asgd
