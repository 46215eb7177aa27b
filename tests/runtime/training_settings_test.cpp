// The optimizer defaults that follow the policy and the worker count, and
// the rule that a value the user set is used exactly as set.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "actors/coordinator.hpp"
#include "asgd/job.hpp"
#include "cli/cli_run.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

const char* const kPolicies[] = {"bsp", "ssp:3", "async", "averaging", "hogwild", "allreduce", "gossip:2"};

TEST(TrainingSettings, TwoWorkersTrainWithTheTunedDefaultsUnderEveryPolicy) {
  for (const char* policy : {"ssp:3", "async", "averaging", "hogwild"}) {
    JobConfig c;
    c.policy = policy;
    const TrainingSettings t = training_settings(c);
    EXPECT_DOUBLE_EQ(t.lr, 0.02) << policy;
    EXPECT_DOUBLE_EQ(t.momentum, 0.9) << policy;
    EXPECT_DOUBLE_EQ(t.lr_warmup_epochs, 0.0) << policy;
    EXPECT_TRUE(t.adjusted.empty()) << policy << ": " << t.adjusted.front();
  }
  // One step per clock from every worker's gradient: async's rate per
  // sample, from two workers on.
  for (const char* policy : {"bsp", "allreduce", "gossip:2"}) {
    JobConfig c;
    c.policy = policy;
    const TrainingSettings t = training_settings(c);
    EXPECT_DOUBLE_EQ(t.lr, 0.04) << policy;
    EXPECT_DOUBLE_EQ(t.lr_warmup_epochs, 0.0) << policy;
    ASSERT_EQ(t.adjusted.size(), 1u) << policy;
    EXPECT_NE(t.adjusted.front().find("lr 0.04 (0.02 x 2 workers"), std::string::npos) << t.adjusted.front();
  }
}

TEST(TrainingSettings, MoreWorkersAdjustTheDefaultsAndSayWhich) {
  JobConfig bsp;
  bsp.policy = "bsp";
  bsp.workers = 8;
  const TrainingSettings b = training_settings(bsp);
  EXPECT_DOUBLE_EQ(b.lr, 0.16);  // 0.02 per worker's gradient
  EXPECT_DOUBLE_EQ(b.lr_warmup_epochs, 0.5);
  EXPECT_DOUBLE_EQ(b.momentum, 0.9);
  ASSERT_FALSE(b.adjusted.empty());
  EXPECT_NE(b.adjusted.front().find("lr 0.16"), std::string::npos) << b.adjusted.front();

  JobConfig averaging4;
  averaging4.policy = "averaging";
  averaging4.workers = 4;
  EXPECT_DOUBLE_EQ(training_settings(averaging4).lr, 0.04);  // the linear scaling rule from two workers
  EXPECT_DOUBLE_EQ(training_settings(averaging4).lr_warmup_epochs, 1.0);

  JobConfig async;
  async.workers = 16;
  const TrainingSettings a = training_settings(async);
  EXPECT_TRUE(a.staleness_aware_lr);
  EXPECT_DOUBLE_EQ(a.lr, 0.02);
  EXPECT_DOUBLE_EQ(a.momentum, 0.9);  // stale steps take less (ShardCore), fresh ones this
  EXPECT_EQ(a.adjusted.size(), 3u);  // the batch, the warm-up and the staleness-aware steps

  // Fresh steps take twice the rate up to 4 workers in one process and up
  // to 8 worker processes, falling to the two-worker rate beyond.
  const auto lr_of = [&](std::uint32_t workers, Placement where) {
    async.workers = workers;
    return training_settings(async, where).lr;
  };
  EXPECT_DOUBLE_EQ(lr_of(4, Placement::one_process), 0.04);
  EXPECT_DOUBLE_EQ(lr_of(8, Placement::one_process), 0.02);
  EXPECT_DOUBLE_EQ(lr_of(8, Placement::processes), 0.04);
  EXPECT_DOUBLE_EQ(lr_of(16, Placement::processes), 0.02);
  EXPECT_DOUBLE_EQ(lr_of(2, Placement::processes), 0.02);
  async.momentum = 0.9;  // a given momentum keeps the two-worker rate
  EXPECT_DOUBLE_EQ(lr_of(4, Placement::processes), 0.02);
  async.momentum.reset();

  // Beyond 4 workers async and ssp hold workers x batch at 256, in one
  // process and across processes; the other policies keep 64.
  const auto batch_of = [&](const char* policy, std::uint32_t workers, Placement where) {
    JobConfig c;
    c.policy = policy;
    c.workers = workers;
    return training_settings(c, where);
  };
  for (const char* policy : {"async", "ssp:3"}) {
    for (Placement where : {Placement::one_process, Placement::processes}) {
      const TrainingSettings t = batch_of(policy, 16, where);
      EXPECT_EQ(t.batch, 16u) << policy;
      const auto says = [](const std::string& line) { return line.starts_with("batch 16 per worker (256 / 16"); };
      EXPECT_EQ(std::count_if(t.adjusted.begin(), t.adjusted.end(), says), 1) << policy;
      EXPECT_EQ(batch_of(policy, 8, where).batch, 32u) << policy;
      EXPECT_EQ(batch_of(policy, 12, where).batch, 21u) << policy;
      EXPECT_EQ(batch_of(policy, 64, where).batch, 8u) << policy;
      EXPECT_EQ(batch_of(policy, 4, where).batch, 64u) << policy;
    }
  }
  for (const char* policy : {"bsp", "averaging", "hogwild", "allreduce", "gossip:2"})
    EXPECT_EQ(batch_of(policy, 16, Placement::processes).batch, 64u) << policy;
  JobConfig given;
  given.workers = 16;
  given.batch = 64;
  EXPECT_EQ(training_settings(given, Placement::processes).batch, 64u) << "a batch given is used as given";
  given.batch.reset();
  given.lr = 0.02;
  EXPECT_EQ(training_settings(given, Placement::processes).batch, 64u) << "with a rate given, the batch it was for";

  // A rate or momentum given by the user is used exactly: no staleness-aware
  // steps change it unless asked for.
  async.lr = 0.01;
  EXPECT_FALSE(training_settings(async).staleness_aware_lr);

  JobConfig averaging;
  averaging.policy = "averaging";
  averaging.workers = 16;
  EXPECT_EQ(training_settings(averaging).policy_options.at("local-steps"), 4.0);
  EXPECT_EQ(policy_config(averaging).options.at("local-steps"), 4.0);  // what the workers and shards run with
  averaging.workers = 8;
  EXPECT_FALSE(policy_config(averaging).options.count("local-steps")) << "the policy's own default, 8";

  JobConfig hogwild;
  hogwild.policy = "hogwild";
  hogwild.workers = 16;
  EXPECT_TRUE(training_settings(hogwild).adjusted.empty()) << "hogwild shares one buffer in one process";
}

// Done-when 3 of issue 25: an explicit --lr / --momentum is what trains.
TEST(TrainingSettings, ValuesTheUserSetAreUsedUnchangedAtEveryWorkerCount) {
  for (const char* policy : kPolicies) {
    for (std::uint32_t workers : {1u, 2u, 4u, 8u, 16u, 64u}) {
      JobConfig c;
      c.policy = policy;
      c.workers = workers;
      c.lr = 0.05;
      c.momentum = 0.3;
      c.lr_warmup_epochs = 0.0;
      c.policy_options["local-steps"] = 8;  // averaging's own knob, set too
      const std::string p = policy;
      if (p == "async" || p == "ssp:3") c.staleness_aware_lr = false;
      const TrainingSettings t = training_settings(c);
      EXPECT_DOUBLE_EQ(t.lr, 0.05) << policy << " x" << workers;
      EXPECT_DOUBLE_EQ(t.momentum, 0.3) << policy << " x" << workers;
      EXPECT_DOUBLE_EQ(t.lr_warmup_epochs, 0.0) << policy << " x" << workers;
      EXPECT_FALSE(t.staleness_aware_lr) << policy << " x" << workers;
      EXPECT_TRUE(t.adjusted.empty()) << policy << " x" << workers << ": " << t.adjusted.front();
      EXPECT_EQ(training_settings(c, Placement::processes).batch, 64u) << policy << " x" << workers;
      // What the shards and workers are built with.
      const OptimizerConfig o = optimizer_config(c);
      EXPECT_FLOAT_EQ(o.lr, 0.05f);
      EXPECT_FLOAT_EQ(o.momentum, 0.3f);
      EXPECT_EQ(lr_schedule(c, 1000).warmup_steps, 0u);
    }
  }
}

TEST(TrainingSettings, TheWarmUpSpansTheGivenEpochsOfTheSchedule) {
  JobConfig c;
  c.epochs = 5;
  c.lr_warmup_epochs = 2.0;
  const LrSchedule s = lr_schedule(c, 1000);  // 200 clocks an epoch
  EXPECT_EQ(s.warmup_steps, 400u);
  EXPECT_FLOAT_EQ(s.scale(0), 1.0f / 400.0f);  // the cosine is still 1 there
  EXPECT_LT(s.scale(199), s.scale(399));
  const LrSchedule plain{s.kind, 1000};
  EXPECT_FLOAT_EQ(s.scale(400), plain.scale(400));
}

// The start-up line says which defaults were adjusted; with the values set
// on the command line nothing is adjusted and the line shows them.
TEST(TrainingSettings, TheStartUpLineNamesTheAdjustmentsAndAnExplicitLrIsPrinted) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const std::string job = " --epochs 1 --workers 8 --policy bsp --validation-size 1000 --log-level warn --data-dir " +
                          mnist.string();
  const asgd_test::CliRun adjusted = asgd_test::asgd("train" + job);
  ASSERT_EQ(adjusted.exit_code, 0) << adjusted.err;
  EXPECT_NE(adjusted.out.find("lr 0.16 (data:"), std::string::npos) << adjusted.out;
  EXPECT_NE(adjusted.out.find("defaults adjusted for this policy and worker count"), std::string::npos)
      << adjusted.out;
  const asgd_test::CliRun set = asgd_test::asgd("train" + job + " --lr 0.05 --momentum 0.3 --lr-warmup 0");
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_NE(set.out.find("lr 0.05 (data:"), std::string::npos) << set.out;
  EXPECT_EQ(set.out.find("defaults adjusted"), std::string::npos) << set.out;
}

// Across processes the batch beyond 4 workers (async) reaches every
// worker process, and the start-up line says why.
TEST(TrainingSettings, NineAsyncWorkerProcessesTrainAtTheBatchTheRuleGives) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const asgd_test::CliRun r =
      asgd_test::asgd("cluster --epochs 1 --workers 9 --validation-size 1000 --log-level warn --data-dir " +
                      mnist.string() + " --metrics-out " + (scratch / "m.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("batch 28 per worker (256 / 9 workers"), std::string::npos) << r.out;
  const auto lines = asgd_test::read_jsonl(scratch / "m.jsonl");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().at("worker_batch"), nlohmann::json(std::vector<int>(9, 28))) << lines.back().dump();
}

}  // namespace
}  // namespace asgd
