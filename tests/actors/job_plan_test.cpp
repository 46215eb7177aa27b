// The job plan: what a JobConfig and the sizes of its model and data make
// of a job, worked out once, without an actor system, files or data.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "actors/data_feeder.hpp"
#include "actors/job_plan.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"

namespace asgd {
namespace {

JobFacts facts(std::size_t num_params = 1000, std::size_t train_count = 1000,
               Placement where = Placement::one_process, unsigned cores = 8) {
  return {num_params, train_count, 10, {1, 28, 28}, where, cores};
}

JobPlan planned(const JobConfig& c, const JobFacts& f = facts()) {
  auto plan = plan_job(c, f);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : JobPlan{};
}

std::string refusal(const JobConfig& c, const JobFacts& f = facts()) {
  auto plan = plan_job(c, f);
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? std::string() : plan.status().message();
}

TEST(JobPlan, TheShardsKeyRangesCoverEveryParameterOnceInOrder) {
  JobConfig c;
  c.shards = 3;
  const JobPlan plan = planned(c, facts(1001));
  ASSERT_EQ(plan.ranges.size(), 3u);
  ASSERT_EQ(plan.shards.size(), 3u);
  std::size_t next = 0;
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(plan.shards[i].index, i);
    EXPECT_EQ(plan.shards[i].range, plan.ranges[i]);
    EXPECT_EQ(plan.ranges[i].begin, next);
    EXPECT_GE(plan.ranges[i].size(), 333u);
    next = plan.ranges[i].end;
  }
  EXPECT_EQ(next, 1001u);
  EXPECT_EQ(plan.num_params, 1001u);
}

TEST(JobPlan, TheWorkersSharesCoverTheTrainingSplitOnceInOrder) {
  for (const char* weights : {"", "1,2,3"}) {
    JobConfig c;
    c.workers = 3;
    c.worker_weights = weights;
    const JobPlan plan = planned(c, facts(1000, 1001));
    ASSERT_EQ(plan.workers.size(), 3u) << weights;
    std::size_t next = 0;
    for (std::uint32_t w = 0; w < 3; ++w) {
      EXPECT_EQ(plan.workers[w].id, w);
      EXPECT_EQ(plan.workers[w].share.partition.begin, next) << weights;
      next = plan.workers[w].share.partition.end;
    }
    EXPECT_EQ(next, 1001u) << weights;
  }
}

TEST(JobPlan, WeightedWorkersTakeAsManyStepsPerEpochAndTheScheduleSpansThem) {
  JobConfig c;
  c.workers = 2;
  c.batch = 10;
  c.epochs = 3;
  c.worker_weights = "1,3";
  const JobPlan plan = planned(c);
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_EQ(plan.workers[0].share.partition.size(), 250u);
  EXPECT_EQ(plan.workers[1].share.partition.size(), 750u);
  EXPECT_EQ(plan.workers[0].share.batch, 5u);
  EXPECT_EQ(plan.workers[1].share.batch, 15u);
  EXPECT_EQ(plan.workers[0].steps_per_epoch, 50u);
  EXPECT_EQ(plan.workers[1].steps_per_epoch, 50u);
  EXPECT_EQ(plan.planned_clocks, 150u);
  EXPECT_EQ(plan.schedule.total_steps, 150u);
}

TEST(JobPlan, ALastPartialBatchIsAStep) {
  JobConfig c;
  c.workers = 2;
  c.batch = 64;
  const JobPlan plan = planned(c, facts(1000, 55000));
  EXPECT_EQ(plan.workers[0].steps_per_epoch, 430u);  // 27500 samples: 429 full batches and one of 44
  EXPECT_EQ(plan.planned_clocks, c.epochs * 430u);
}

TEST(JobPlan, BadSettingsAreRefusedNamingTheFlag) {
  JobConfig c;
  c.shards = 5;
  EXPECT_EQ(refusal(c, facts(4)), "--shards 5 exceeds the model's 4 parameters");
  c = {};
  c.workers = 3;
  EXPECT_EQ(refusal(c, facts(1000, 2)), "--workers 3: more workers than the 2 training samples");
  c = {};
  c.worker_weights = "1,x";
  EXPECT_EQ(refusal(c), "--worker-weights 1,x: 'x' is not a positive number");
  c.worker_weights = "1,2,3";
  EXPECT_NE(refusal(c).find("expected 2 comma-separated weights"), std::string::npos);
  c = {};
  c.straggler = "5:2";
  EXPECT_EQ(refusal(c), "--straggler 5:2: '5:2' names worker 5 of 2 (workers count from 0)");
  c.straggler = "0:0.5";
  EXPECT_EQ(refusal(c), "--straggler 0:0.5: '0:0.5' needs a factor of at least 1 and at most 1000000");
  c = {};
  c.policy = "no-such-policy";
  EXPECT_FALSE(refusal(c).empty());
  c = {};
  c.resume = "/some/checkpoints";
  EXPECT_TRUE(plan_job(c, facts(1000, 1000, Placement::processes)).ok());  // asgd cluster resumes too
  c.worker_weights = "auto";
  EXPECT_EQ(refusal(c), "--resume: not available with --worker-weights auto (give the weights)");
}

// Weights that starve a worker (issue 27: the job idled past its rpc
// timeout forever) are refused, naming the weights.
TEST(JobPlan, WeightsThatLeaveAWorkerLessThanABatchAreRefusedNamingThem) {
  JobConfig c;
  for (const char* weights : {"1,1000000", "1e-300,1"}) {
    c.worker_weights = weights;
    const std::string why = refusal(c, facts(1000, 55000));
    EXPECT_EQ(why.rfind("--worker-weights " + std::string(weights) + ": worker 0's share", 0), 0u) << why;
    EXPECT_NE(why.find("give each worker a weight within a factor of about"), std::string::npos) << why;
  }
}

TEST(JobPlan, StragglersAreEachWorkersSlowDown) {
  JobConfig c;
  c.workers = 3;
  c.straggler = "2:4,0:1.5";
  const JobPlan plan = planned(c);
  EXPECT_DOUBLE_EQ(plan.workers[0].straggler.factor, 1.5);
  EXPECT_DOUBLE_EQ(plan.workers[1].straggler.factor, 1.0);
  EXPECT_FALSE(plan.workers[1].straggler.slows());
  EXPECT_DOUBLE_EQ(plan.workers[2].straggler.factor, 4.0);
  EXPECT_DOUBLE_EQ(worker_setup(plan, plan.workers[2]).straggler.factor, 4.0);
}

TEST(JobPlan, ThePolicysOptionsAreResolvedOnce) {
  JobConfig c;
  c.policy = "averaging";
  c.workers = 16;
  const JobFacts enough = facts(1000, 16 * 64);  // a batch for every worker
  EXPECT_EQ(planned(c, enough).policy.options.at("local-steps"), 4.0) << "more than 8 workers average twice as often";
  c.policy_options["local-steps"] = 2;
  EXPECT_EQ(planned(c, enough).policy.options.at("local-steps"), 2.0) << "a value given is used as given";
  c.workers = 8;
  c.policy_options.clear();
  EXPECT_EQ(planned(c).policy.options.count("local-steps"), 0u) << "the policy's own default";
  EXPECT_EQ(planned(c).policy.name, "averaging");
}

TEST(JobPlan, AWorkerWhoseShareIsSmallerThanItsBatchIsRefusedWithAdvice) {
  JobConfig c;
  c.workers = 4;
  c.batch = 64;
  EXPECT_TRUE(plan_job(c, facts(1000, 4 * 64)).ok()) << "a share of exactly one batch trains";
  const std::string why = refusal(c, facts(1000, 4 * 64 - 1));
  // Shares of 64, 64, 64 and 63: the last is short of a batch.
  EXPECT_NE(why.find("--workers 4 with --batch 64: worker 3's share of the 255 training samples is 63, less than "
                     "its batch of 64"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("a --batch of at most 63"), std::string::npos) << why;
}

TEST(JobPlan, SaysWhatThePolicyAsksOfTheRuntime) {
  JobConfig c;
  c.policy = "hogwild";
  const JobPlan hogwild = planned(c);
  EXPECT_TRUE(hogwild.shares_parameters);
  EXPECT_EQ(hogwild.policy_name, "hogwild");
  c.policy = "ssp:3";
  const JobPlan ssp = planned(c);
  EXPECT_FALSE(ssp.shares_parameters);
  EXPECT_EQ(ssp.staleness_bound, std::optional<std::uint32_t>(3));
  c.policy = "async";
  EXPECT_FALSE(planned(c).staleness_bound.has_value());
}

TEST(JobPlan, AsyncTakesAFasterRateAcrossProcessesThanInOneAtEightWorkers) {
  JobConfig c;
  c.policy = "async";
  c.workers = 8;
  const JobPlan here = planned(c);
  const JobPlan apart = planned(c, facts(1000, 1000, Placement::processes));
  EXPECT_FLOAT_EQ(here.optimizer.lr, 0.02f);   // in one process, twice the rate diverged at 8
  EXPECT_FLOAT_EQ(apart.optimizer.lr, 0.04f);  // up to 8 worker processes take twice the rate
  EXPECT_EQ(here.placement, Placement::one_process);
  EXPECT_EQ(apart.placement, Placement::processes);
  EXPECT_TRUE(here.training.staleness_aware_lr);
  EXPECT_FLOAT_EQ(shard_setup(apart, apart.shards[0], {}).optimizer.lr, 0.04f);
  EXPECT_FLOAT_EQ(worker_setup(apart, apart.workers[0]).optimizer.lr, 0.04f);
}

TEST(JobPlan, EachWorkerComputesOnItsShareOfTheCoresUnlessThreadsAreGiven) {
  JobConfig c;
  c.workers = 2;
  EXPECT_EQ(planned(c, facts(1000, 1000, Placement::one_process, 8)).compute_threads, 4u);
  EXPECT_EQ(planned(c, facts(1000, 1000, Placement::one_process, 8)).actor_threads, 2u);
  EXPECT_EQ(planned(c, facts(1000, 1000, Placement::one_process, 1)).compute_threads, 1u);
  EXPECT_EQ(planned(c, facts(1000, 1000, Placement::one_process, 1)).actor_threads, 1u);
  EXPECT_EQ(planned(c, facts(1000, 1000, Placement::one_process, 0)).compute_threads, 1u) << "cores unknown";
  c.threads = 3;
  EXPECT_EQ(planned(c, facts(1000, 1000, Placement::one_process, 8)).compute_threads, 3u);
}

TEST(JobPlan, ShardSetupsCarryThePlan) {
  JobConfig c;
  c.shards = 2;
  c.workers = 3;
  c.rpc_timeout_s = 30;
  c.checkpoint_dir = "/tmp/ckpt";
  c.checkpoint_every_s = 5;
  const JobPlan plan = planned(c, facts(10));
  const ShardSetup s = shard_setup(plan, plan.shards[1], std::vector<float>(5, 1.0f));
  EXPECT_EQ(s.index, 1u);
  EXPECT_EQ(s.range, plan.ranges[1]);
  EXPECT_EQ(s.initial.size(), 5u);
  EXPECT_EQ(s.workers, 3u);
  EXPECT_EQ(s.schedule.total_steps, plan.planned_clocks);
  EXPECT_DOUBLE_EQ(s.hold_warning_s, 15.0);
  EXPECT_EQ(s.checkpoint_path, shard_checkpoint_path("/tmp/ckpt", 1));
  EXPECT_DOUBLE_EQ(s.checkpoint_every_s, 5.0);
  EXPECT_TRUE(ShardCore::make(s).ok());
  c.checkpoint_every_s = 0;  // a folder for the model's checkpoint only
  const JobPlan unsaved = planned(c, facts(10));
  EXPECT_TRUE(shard_setup(unsaved, unsaved.shards[0], {}).checkpoint_path.empty());
}

TEST(JobPlan, EachWorkerGetsItsItemOfADeviceListOrTheOneDeviceForAll) {
  JobConfig c;
  c.workers = 3;
  c.device = "cuda:1,cpu,cuda";
  const JobPlan plan = planned(c);
  EXPECT_EQ(worker_setup(plan, plan.workers[0]).device, "cuda:1");
  EXPECT_EQ(worker_setup(plan, plan.workers[1]).device, "cpu");
  EXPECT_EQ(worker_setup(plan, plan.workers[2]).device, "cuda");
  EXPECT_EQ(*parse_worker_devices("cuda:2", 3), (std::vector<std::string>{"cuda:2", "cuda:2", "cuda:2"}));
  EXPECT_FALSE(parse_worker_devices("cpu,cpu", 3).ok());
  EXPECT_FALSE(parse_worker_devices("cpu,,cpu", 3).ok());
}

TEST(JobPlan, WorkerAndFeederSetupsCarryThePlan) {
  JobConfig c;
  c.workers = 2;
  c.batch = 10;
  c.prefetch = 3;
  c.seed = 7;
  c.device = "cpu";
  const JobPlan plan = planned(c);
  const WorkerSetup w = worker_setup(plan, plan.workers[1]);
  EXPECT_EQ(w.id, 1u);
  EXPECT_EQ(w.model, c.model);
  EXPECT_EQ(w.sample_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(w.classes, 10u);
  EXPECT_EQ(w.ranges, plan.ranges);
  EXPECT_EQ(w.schedule.total_steps, plan.planned_clocks);
  EXPECT_EQ(w.first_clock, 0u);
  const FeederSetup f = feeder_setup(plan, plan.workers[1], nullptr, 2);
  EXPECT_EQ(f.partition.begin, 500u);
  EXPECT_EQ(f.batch, 10u);
  EXPECT_EQ(f.capacity, 3u);
  EXPECT_EQ(f.seed, 7u);
  EXPECT_EQ(f.stream, 2u);
  EXPECT_EQ(f.first_epoch, 2u);
}

TEST(JobPlan, AWorkerStartingLaterStartsAtItsEpochsFirstStep) {
  const WorkerPlan w = plan_worker(1, {{0, 95}, 10}, Straggler{}, 3);
  EXPECT_EQ(w.steps_per_epoch, 10u);
  EXPECT_EQ(w.first_clock, 30u);
}

TEST(JobPlan, AutoWeightsStartEqualAndAreReplannedFromMeasuredRates) {
  JobConfig c;
  c.workers = 2;
  c.batch = 10;
  c.worker_weights = "auto";
  JobPlan plan = planned(c);
  EXPECT_TRUE(plan.calibrate_weights);
  EXPECT_EQ(plan.workers[0].share.partition.size(), 500u);
  const LrSchedule before = plan.schedule;
  replan_shares(plan, {100.0, 300.0});
  EXPECT_EQ(plan.workers[0].share.partition.size(), 250u);
  EXPECT_EQ(plan.workers[1].share.batch, 15u);
  EXPECT_EQ(plan.workers[1].steps_per_epoch, 50u);
  EXPECT_EQ(plan.schedule.total_steps, before.total_steps) << "the schedule keeps its length";
}

// Steps of equal length: B_w = (T - fixed_w) / per_sample_w, adding up to the total.
TEST(JobPlan, BalancedBatchesMakeEveryWorkersStepEquallyLong) {
  // Without fixed costs, batches in proportion to the rates (1/per_sample).
  auto b = balanced_batches({{0.0, 1e-5}, {0.0, 3e-5}}, 128);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NEAR(b[0], 96.0, 1e-9);
  EXPECT_NEAR(b[1], 32.0, 1e-9);
  // A GPU (1 ms fixed, 2 us a sample) beside a CPU (70 us a sample): the
  // GPU's fixed part makes its fair batch larger than its rate at 64 says.
  const std::vector<StepCost> hybrid = {{1e-3, 2e-6}, {0.0, 7e-5}};
  b = balanced_batches(hybrid, 128);
  EXPECT_NEAR(b[0] + b[1], 128.0, 1e-9);
  const double t0 = hybrid[0].fixed_s + b[0] * hybrid[0].per_sample_s;
  const double t1 = hybrid[1].fixed_s + b[1] * hybrid[1].per_sample_s;
  EXPECT_NEAR(t0, t1, 1e-12);
  EXPECT_GT(b[0], 128.0 * (64 / 1.128e-3) / (64 / 1.128e-3 + 1 / 7e-5));
  // A worker too slow to keep up even at one sample stays at one; the
  // others share the rest equally fast.
  b = balanced_batches({{0.0, 1e-6}, {0.0, 1e-6}, {0.5, 1e-3}}, 64);
  EXPECT_EQ(b[2], 1.0);
  EXPECT_NEAR(b[0], 31.5, 1e-9);
  EXPECT_NEAR(b[1], 31.5, 1e-9);
}

// A cluster's shard and worker processes plan from the same settings and
// the clocks their assignment carries: they must come to the coordinator's.
TEST(JobPlan, AProcessPlansTheSameSettingsAsTheCoordinator) {
  JobConfig c;
  c.policy = "averaging";
  c.workers = 12;
  c.epochs = 4;
  c.lr_schedule = "cosine";
  const JobPlan coordinator = planned(c, facts(1000, 6000, Placement::processes));
  auto process = plan_settings(c, Placement::processes, 8);
  ASSERT_TRUE(process.ok());
  plan_clocks(*process, coordinator.planned_clocks);
  EXPECT_EQ(process->policy.options, coordinator.policy.options);
  EXPECT_FLOAT_EQ(process->optimizer.lr, coordinator.optimizer.lr);
  EXPECT_EQ(process->schedule.kind, coordinator.schedule.kind);
  EXPECT_EQ(process->schedule.total_steps, coordinator.schedule.total_steps);
  EXPECT_EQ(process->schedule.warmup_steps, coordinator.schedule.warmup_steps);
  EXPECT_GT(coordinator.schedule.warmup_steps, 0u);  // more than two workers warm up over the first epoch
  const ShardPlan shard = plan_shard(*process, 0, coordinator.ranges[0]);
  const ShardSetup there = shard_setup(*process, shard, {});
  const ShardSetup here = shard_setup(coordinator, coordinator.shards[0], {});
  EXPECT_EQ(there.workers, here.workers);
  EXPECT_EQ(there.staleness_aware_lr, here.staleness_aware_lr);
  EXPECT_EQ(there.schedule.warmup_steps, here.schedule.warmup_steps);
}

TEST(JobPlan, TheSameInputsGiveTheSamePlan) {
  JobConfig c;
  c.workers = 3;
  c.shards = 2;
  c.worker_weights = "1,2,2";
  const JobPlan a = planned(c, facts(777, 5000));
  const JobPlan b = planned(c, facts(777, 5000));
  EXPECT_EQ(a.ranges, b.ranges);
  for (std::size_t w = 0; w < 3; ++w) {
    EXPECT_EQ(a.workers[w].share.partition.begin, b.workers[w].share.partition.begin);
    EXPECT_EQ(a.workers[w].share.batch, b.workers[w].share.batch);
  }
  EXPECT_EQ(a.planned_clocks, b.planned_clocks);
}

TEST(WorkerShares, SplitDataAndBatchInProportionToTheWeights) {
  const auto equal = assign_shares(55000, 64, {1.0, 1.0});
  EXPECT_EQ(equal[0].partition.size(), 27500u);
  EXPECT_EQ(equal[1].batch, 64u);
  EXPECT_EQ(planned_clocks(equal, 3), 3u * 430u);  // 27500 samples -> 430 batches each
  const auto weighted = assign_shares(1000, 10, {1.0, 3.0});
  EXPECT_EQ(weighted[0].partition.size(), 250u);
  EXPECT_EQ(weighted[1].partition.size(), 750u);
  EXPECT_EQ(weighted[0].partition.end, weighted[1].partition.begin);
  EXPECT_EQ(weighted[0].batch, 5u);
  EXPECT_EQ(weighted[1].batch, 15u);
  EXPECT_EQ(planned_clocks(weighted, 1), 50u);  // both take 50 steps per epoch
}

TEST(WorkerWeights, ParseOnePositiveNumberPerWorker) {
  EXPECT_EQ(*parse_worker_weights("", 3), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(*parse_worker_weights("1,2.5", 2), (std::vector<double>{1, 2.5}));
  EXPECT_FALSE(parse_worker_weights("1,2", 3).ok());
  EXPECT_FALSE(parse_worker_weights("1,-2", 2).ok());
  EXPECT_FALSE(parse_worker_weights("1,x", 2).ok());
}

std::vector<double> factors(const std::string& text, std::uint32_t workers) {
  std::vector<double> out;
  const auto parsed = parse_stragglers(text, workers, 1);
  for (const Straggler& s : parsed.value()) out.push_back(s.factor);
  return out;
}

TEST(Stragglers, ParseWorkerColonFactor) {
  EXPECT_EQ(factors("", 2), (std::vector<double>{1, 1}));
  EXPECT_EQ(factors("none", 2), (std::vector<double>{1, 1}));  // a resume's way to drop the checkpointed job's
  EXPECT_FALSE(parse_stragglers("none,0:4", 2, 1).ok());
  EXPECT_EQ(factors("0:4", 2), (std::vector<double>{4, 1}));
  EXPECT_EQ(factors("1:2,0:3", 2), (std::vector<double>{3, 2}));
  EXPECT_FALSE(parse_stragglers("2:4", 2, 1).ok());
  EXPECT_FALSE(parse_stragglers("0:0.5", 2, 1).ok());
  EXPECT_FALSE(parse_stragglers("0", 2, 1).ok());
  EXPECT_FALSE(parse_stragglers("a:2", 2, 1).ok());
}

TEST(Stragglers, ParseTheTransientModels) {
  const std::vector<Straggler> s = parse_stragglers("random:0.1:4,pause:1:50:0.2,0:2", 3, 7).value();
  for (const Straggler& w : s) {
    EXPECT_DOUBLE_EQ(w.chance, 0.1);
    EXPECT_DOUBLE_EQ(w.chance_factor, 4.0);
  }
  EXPECT_DOUBLE_EQ(s[0].factor, 2.0);
  EXPECT_EQ(s[1].pause_every, 50u);
  EXPECT_DOUBLE_EQ(s[1].pause_s, 0.2);
  EXPECT_EQ(s[2].pause_every, 0u);
  EXPECT_DOUBLE_EQ(s[0].mean_factor(), 2.0 + 0.1 * 3.0);
  for (const char* bad : {"random:0:4", "random:1.5:4", "random:0.1:0.5", "random:0.1", "pause:3:50:0.2",
                          "pause:0:0:0.2", "pause:0:50:0", "pause:0:x:1", "random:nan:2"}) {
    const auto r = parse_stragglers(bad, 3, 7);
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().message();
  }
}

// Issue 24: the same seed slows the same steps of the same workers, in any
// run; another seed, or another worker, other steps; about P of them.
TEST(Stragglers, TheSameSeedSlowsTheSameStepsOfTheSameWorkers) {
  auto hits = [](std::uint64_t seed, std::uint32_t worker) {
    const Straggler s = parse_stragglers("random:0.1:4", 4, seed).value()[worker];
    std::vector<std::uint64_t> out;
    for (std::uint64_t step = 1; step <= 5000; ++step)
      if (s.random_hit(step)) out.push_back(step);
    return out;
  };
  EXPECT_EQ(hits(5, 0), hits(5, 0));
  EXPECT_EQ(hits(5, 3), hits(5, 3));
  EXPECT_NE(hits(5, 0), hits(5, 1));
  EXPECT_NE(hits(5, 0), hits(6, 0));
  for (std::uint32_t w = 0; w < 4; ++w) {
    const double share = static_cast<double>(hits(5, w).size()) / 5000.0;
    EXPECT_NEAR(share, 0.1, 0.02) << "worker " << w;
  }
  const Straggler s = parse_stragglers("random:0.1:4,pause:0:10:0.5", 1, 5).value()[0];
  for (std::uint64_t step = 1; step <= 100; ++step) {
    const double expected = (s.random_hit(step) ? 0.3 : 0.0) + (step % 10 == 0 ? 0.5 : 0.0);
    EXPECT_DOUBLE_EQ(s.delay_s(step, 0.1), expected) << "step " << step;
  }
}

}  // namespace
}  // namespace asgd
