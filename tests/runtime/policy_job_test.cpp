// Whole jobs under each consistency policy, on real MNIST: what a researcher
// switching --policy relies on.

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "asgd/job.hpp"
#include "captured_log.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

JobConfig mnist_job(const std::string& dir, const std::string& policy) {
  JobConfig c;
  c.data_dir = dir;
  c.policy = policy;
  c.workers = 2;
  c.epochs = 3;
  return c;
}

struct Outcome {
  JobSummary summary;
  std::vector<double> losses;
  std::vector<float> params;
};

Outcome run(const JobConfig& c) {
  Outcome r;
  JobCallbacks cb;
  cb.on_epoch = [&](const EpochMetrics& m) { r.losses.push_back(m.train_loss); };
  cb.on_final_params = [&](std::span<const float> p) { r.params.assign(p.begin(), p.end()); };
  auto result = run_job(c, cb);
  EXPECT_TRUE(result.ok()) << c.policy << ": " << result.status().to_string();
  if (result.ok()) r.summary = *result;
  return r;
}

TEST(Policies, EachTrainsMnistMlpWithTwoWorkersToAtLeast97PercentInThreeEpochs) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  for (const std::string policy : {"bsp", "ssp:3", "async", "hogwild", "averaging", "easgd", "allreduce", "gossip:2"}) {
    const Outcome r = run(mnist_job(dir.string(), policy));
    const JobSummary& s = r.summary;
    EXPECT_GE(s.final_test_accuracy, 0.97) << policy;
    EXPECT_EQ(s.policy, policy);
    EXPECT_EQ(r.losses.size(), 3u) << policy;
    EXPECT_GT(s.updates_applied, 0u) << policy;
    std::uint64_t counted = 0;
    for (auto n : s.staleness_histogram) counted += n;
    EXPECT_GT(counted, 0u) << policy << ": no update recorded its staleness";
    if (policy == "bsp") {
      EXPECT_EQ(s.staleness_max, 0.0) << "bsp updates are never stale";
    } else if (policy == "ssp:3") {
      EXPECT_LE(s.staleness_max, 3.0) << "ssp(3) bounds staleness by 3";
    } else if (policy == "gossip:2") {
      EXPECT_LE(s.staleness_max, 2.0) << "gossip:2 uses no copy more than 2 clocks behind";
    } else if (policy == "allreduce") {
      EXPECT_EQ(s.staleness_max, 0.0) << "an all-reduce is never stale";
    } else if (policy == "averaging") {
      EXPECT_LE(s.staleness_max, 7.0) << "8 local steps lag at most 7 clocks";
    }
    ASSERT_EQ(s.worker_wait_s.size(), 2u);
    if (policy == "async" || policy == "hogwild") {
      for (double w : s.worker_wait_s) EXPECT_EQ(w, 0.0) << policy << " never holds a read";
    }
  }
}

// Exact: no tolerance.
void expect_bitwise_equal(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what << ": the loss curves differ";
  EXPECT_TRUE(a.params == b.params) << what << ": the final parameters differ";
  EXPECT_EQ(a.summary.final_test_accuracy, b.summary.final_test_accuracy) << what;
}

TEST(Policies, TwoBspRunsWithTheSameSeedAreBitwiseIdentical) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c = mnist_job(dir.string(), "bsp");
  c.epochs = 2;
  c.shards = 2;
  const Outcome a = run(c);
  ASSERT_EQ(a.losses.size(), 2u);
  ASSERT_EQ(a.params.size(), 235146u);
  expect_bitwise_equal(a, run(c), "two bsp runs");
}

// The same update as bsp, without the shard in the way: each worker applies
// the all-reduced mean to its own copy, so with the same seed the loss curve
// and the parameters are bsp's, bit for bit (and so from run to run).
TEST(Policies, AllreduceTrainsExactlyAsBspDoesAndTwoRunsAreBitwiseIdentical) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c = mnist_job(dir.string(), "bsp");
  c.epochs = 2;
  c.workers = 3;
  const Outcome bsp = run(c);
  c.policy = "allreduce";
  const Outcome a = run(c);
  ASSERT_EQ(a.losses.size(), 2u);
  expect_bitwise_equal(a, run(c), "two allreduce runs");
  expect_bitwise_equal(a, bsp, "allreduce against bsp");
  EXPECT_EQ(a.summary.updates_applied, bsp.summary.updates_applied);
}

TEST(Policies, UnderBspAStragglersPeerWaitsForItAndTheStragglerHardlyWaits) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c = mnist_job(dir.string(), "bsp");
  c.epochs = 1;
  c.straggler = "0:4";
  const Outcome r = run(c);
  ASSERT_EQ(r.summary.worker_wait_s.size(), 2u);
  EXPECT_GT(r.summary.worker_wait_s[1], 2.0 * r.summary.worker_wait_s[0])
      << "worker 1 should spend its time waiting for the slow worker 0";
}

TEST(Policies, AutomaticWorkerWeightsGiveASlowWorkerASmallerBatch) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c = mnist_job(dir.string(), "bsp");
  c.epochs = 1;
  c.straggler = "0:4";
  c.worker_weights = "auto";
  const Outcome r = run(c);
  ASSERT_EQ(r.summary.worker_batch.size(), 2u);
  // Calibrated from measured throughput: about 1:4, so 128 samples split
  // about 26:102. Timing noise moves it a little, never past 1:2.
  EXPECT_LT(2 * r.summary.worker_batch[0], r.summary.worker_batch[1]);
  EXPECT_NEAR(static_cast<double>(r.summary.worker_batch[0] + r.summary.worker_batch[1]), 128.0, 1.0);
  EXPECT_GE(r.summary.final_test_accuracy, 0.9);
}

TEST(Policies, ExplicitWorkerWeightsScaleEachWorkersBatch) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  JobConfig c = mnist_job(dir.string(), "ssp:2");
  c.epochs = 1;
  c.worker_weights = "1,3";
  const Outcome r = run(c);
  EXPECT_EQ(r.summary.worker_batch, (std::vector<std::uint32_t>{32, 96}));
  EXPECT_LE(r.summary.staleness_max, 2.0);
}

// The pushes a worker sends once its data ran out (averaging's last
// partial round, Downpour's n_push) are updates too: the summary counted
// none of averaging's with more local steps than an epoch has ("0
// updates" for a trained model), though its staleness histogram had them.
TEST(Policies, ThePushesAfterTheLastEpochCountInTheJobsUpdates) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  for (const auto& [policy, option, value] : {std::tuple{"averaging", "local-steps", 100000.0},
                                              std::tuple{"averaging", "local-steps", 8.0},
                                              std::tuple{"async", "push-every", 3.0}}) {
    JobConfig c = mnist_job(data.string(), policy);
    c.epochs = 1;
    c.policy_options[option] = value;
    const JobSummary s = run(c).summary;
    std::uint64_t pushes = 0;
    for (std::uint64_t n : s.staleness_histogram) pushes += n;
    EXPECT_EQ(s.updates_applied, pushes) << policy << " " << option << " " << value;
    EXPECT_GT(s.updates_applied, 0u);
  }
}

// An interval longer than the whole job is legal but almost surely a
// mistake: Downpour's were warned of, averaging's and the decentralized
// policies' publishing were not (the epochs' evaluations stayed at the
// initial parameters without a word).
TEST(Policies, AnIntervalLongerThanTheJobIsWarnedOf) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  for (const auto& [policy, knob] : {std::pair{"averaging", "local-steps"}, std::pair{"allreduce", "publish-steps"},
                                     std::pair{"async", "push-every"}}) {
    asgd_test::CapturedLog log;
    JobConfig c = mnist_job(dir.string(), policy);
    c.epochs = 1;
    c.validation_size = 1000;
    c.policy_options[knob] = 100000;
    ASSERT_TRUE(run_job(c).ok()) << policy;
    EXPECT_EQ(log.count(std::string("--") + knob + " 100000 is more than a worker's"), 1u) << log.all();
  }
  // A warm-up longer than the job: the rate never reaches its full value.
  asgd_test::CapturedLog log;
  JobConfig c = mnist_job(dir.string(), "async");
  c.epochs = 1;
  c.validation_size = 1000;
  c.lr_warmup_epochs = 2;
  ASSERT_TRUE(run_job(c).ok());
  EXPECT_EQ(log.count("--lr-warmup 2 is longer than the job's 1 epoch(s)"), 1u) << log.all();
}

TEST(Policies, ValidateNamesTheBadPolicySetting) {
  auto error = [](auto edit) {
    JobConfig c;
    edit(c);
    return validate(c).message();
  };
  EXPECT_NE(error([](JobConfig& c) { c.policy = "ssp:x"; }).find("ssp:S"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "bsp:2"; }).find("only ssp and gossip take a parameter"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "petuum"; }).find("unknown policy 'petuum'"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "bsp"; c.policy_options["fetch-every"] = 4; }).find("--policy async only"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "async"; c.policy_options["staleness"] = 2; }).find("--staleness"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "ssp:2"; c.policy_options["staleness"] = 3; }).find("disagrees"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "bsp"; c.policy_options["backup-workers"] = 2; }).find("--backup-workers 2"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "averaging"; c.policy_options["local-steps"] = 0; }).find("local-steps"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.worker_weights = "1,2,3"; }).find("one per worker"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.straggler = "5:2"; }).find("names worker 5 of"), std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "bsp"; c.staleness_aware_lr = true; }).find("async and ssp only"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "bsp"; c.policy_options["local-steps"] = 4; }).find("--policy averaging, easgd only"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "easgd"; c.policy_options["moving-rate"] = 1.5; }).find("<= 1"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "ssp"; c.policy_options["staleness"] = 2.5; }).find("whole number"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy_options["speed"] = 2; }).find("no policy takes a setting 'speed'"),
            std::string::npos);
  // `false` given to a policy that takes no such setting (it was taken
  // without a word); a moving rate of 0 (or one that is 0 as a float)
  // never moves the center the job evaluates (chance accuracy, exit 0);
  // values as given, not rounded, and a huge S measured, not "not whole".
  EXPECT_NE(error([](JobConfig& c) { c.policy = "bsp"; c.staleness_aware_lr = false; }).find("--staleness-aware-lr false"),
            std::string::npos);
  for (double alpha : {0.0, 1e-60})
    EXPECT_NE(error([&](JobConfig& c) { c.policy = "easgd"; c.policy_options["moving-rate"] = alpha; }).find("must be > 0"),
              std::string::npos)
        << alpha;
  EXPECT_NE(error([](JobConfig& c) { c.policy = "easgd"; c.policy_options["moving-rate"] = 1.0000001; })
                .find("--moving-rate 1.0000001: must be <= 1"),
            std::string::npos);
  EXPECT_NE(error([](JobConfig& c) { c.policy = "ssp:99999999999"; }).find("--staleness 99999999999: must be <= 1000000000"),
            std::string::npos);
  // A momentum for an optimizer without one was ignored, and still turned
  // the staleness-aware steps off.
  EXPECT_NE(error([](JobConfig& c) { c.optimizer = "adam"; c.momentum = 0.5; })
                .find("--momentum 0.5: applies to --optimizer momentum only, not to adam"),
            std::string::npos);
  JobConfig ok;
  ok.policy = "ssp";
  ok.policy_options["staleness"] = 2;
  EXPECT_TRUE(validate(ok).ok());
  ok.policy = "easgd";
  ok.policy_options = {{"moving-rate", 1e-4}};
  EXPECT_TRUE(validate(ok).ok());
}

}  // namespace
}  // namespace asgd
