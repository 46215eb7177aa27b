#include "actors/parameter_shard.hpp"

#include <gtest/gtest.h>

#include "actors/coordinator.hpp"

namespace asgd {
namespace {

ShardCore make_shard(std::size_t size, float lr = 0.5f) {
  auto core = ShardCore::make({3, {10, 10 + size}, std::vector<float>(size, 1.0f), {"sgd", lr, 0.0f, 0.0f}, {}, {}});
  EXPECT_TRUE(core.ok()) << core.status().to_string();
  return std::move(core).value();
}

TEST(ShardCore, AppliesAPushWithItsOptimizerAndAnswersWithTheNewParameters) {
  ShardCore shard = make_shard(4);
  PushReply r = shard.push({0, 0, 0, true, {1.0f, 2.0f, 0.0f, -2.0f}});
  EXPECT_TRUE(r.applied);
  EXPECT_EQ(r.shard, 3u);
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(r.params, (std::vector<float>{0.5f, 0.0f, 1.0f, 2.0f}));
  EXPECT_EQ(std::vector<float>(shard.params().begin(), shard.params().end()), r.params);
}

TEST(ShardCore, RejectsAGradientOfTheWrongSizeWithoutApplyingIt) {
  ShardCore shard = make_shard(4);
  PushReply r = shard.push({0, 0, 0, true, {1.0f, 2.0f}});
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(r.version, 0u);
  EXPECT_EQ(shard.stats().rejected, 1u);
  EXPECT_EQ(shard.stats().updates_applied, 0u);
  for (float p : shard.params()) EXPECT_EQ(p, 1.0f);
}

TEST(ShardCore, RecordsHowStaleEachAppliedGradientWas) {
  ShardCore shard = make_shard(2);
  shard.push({0, 0, 0, false, {0.0f, 0.0f}});  // staleness 0
  shard.push({1, 0, 0, false, {0.0f, 0.0f}});  // computed on version 0, applied at 1
  shard.push({1, 1, 0, false, {0.0f, 0.0f}});  // applied at 2
  shard.push({0, 1, 3, false, {0.0f, 0.0f}});  // fresh again
  const ShardStats s = shard.stats();
  EXPECT_EQ(s.updates_applied, 4u);
  EXPECT_EQ(s.staleness_histogram, (std::vector<std::uint64_t>{2, 1, 1}));
}

TEST(ShardCore, AnswersWithoutParametersWhenNoneAreWanted) {
  ShardCore shard = make_shard(2);
  PushReply r = shard.push({0, 0, 0, false, {1.0f, 1.0f}});
  EXPECT_TRUE(r.applied);
  EXPECT_TRUE(r.params.empty());
}

TEST(ShardCore, RefusesInitialParametersOfTheWrongSize) {
  auto core = ShardCore::make({0, {0, 5}, std::vector<float>(4, 0.0f), {}, {}, {}});
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), StatusCode::invalid_argument);
}

TEST(ShardCore, UnderAsyncAnswersEveryPullAtOnce) {
  ShardCore shard = make_shard(2);
  EXPECT_TRUE(shard.may_answer({0, 0}));
  EXPECT_TRUE(shard.may_answer({1, 1000}));
}

TEST(StalenessSummary, MergesShardHistogramsIntoMeanP99AndMax) {
  ShardStats a, b;
  a.staleness_histogram = {50, 40};        // 50 x 0, 40 x 1
  b.staleness_histogram = {0, 0, 9, 0, 1};  // 9 x 2, 1 x 4
  const StalenessSummary s = summarize_staleness({a, b});
  EXPECT_EQ(s.count, 100u);
  EXPECT_DOUBLE_EQ(s.mean, (40.0 + 18.0 + 4.0) / 100.0);
  EXPECT_DOUBLE_EQ(s.p99, 2.0);
  EXPECT_DOUBLE_EQ(s.max, 4.0);
  EXPECT_EQ(summarize_staleness({}).count, 0u);
}

}  // namespace
}  // namespace asgd

namespace asgd {
namespace {

TEST(LrSchedule, CosineFallsFromOneToZeroOverTheJob) {
  const LrSchedule cosine{LrSchedule::Kind::cosine, 100};
  EXPECT_FLOAT_EQ(cosine.scale(0), 1.0f);
  EXPECT_NEAR(cosine.scale(50), 0.5f, 1e-6);
  EXPECT_NEAR(cosine.scale(100), 0.0f, 1e-6);
  EXPECT_NEAR(cosine.scale(1000), 0.0f, 1e-6);
  EXPECT_GT(cosine.scale(10), cosine.scale(11));
  EXPECT_FLOAT_EQ((LrSchedule{LrSchedule::Kind::constant, 100}.scale(70)), 1.0f);
  EXPECT_FLOAT_EQ((LrSchedule{LrSchedule::Kind::cosine, 0}.scale(70)), 1.0f);
  LrSchedule::Kind k;
  EXPECT_TRUE(LrSchedule::parse("cosine", k));
  EXPECT_EQ(k, LrSchedule::Kind::cosine);
  EXPECT_FALSE(LrSchedule::parse("linear", k));
}

TEST(ShardCore, ScalesEachStepByTheScheduleAtItsOwnUpdateCount) {
  auto core = ShardCore::make({0, {0, 1}, {0.0f}, {"sgd", 1.0f, 0.0f, 0.0f}, {}, {LrSchedule::Kind::cosine, 2}});
  ASSERT_TRUE(core.ok());
  EXPECT_FLOAT_EQ(core->push({0, 0, 0, true, {1.0f}}).params[0], -1.0f);   // scale 1 at update 0
  EXPECT_FLOAT_EQ(core->push({0, 1, 1, true, {1.0f}}).params[0], -1.5f);   // scale 0.5 at update 1
  EXPECT_NEAR(core->push({0, 2, 2, true, {1.0f}}).params[0], -1.5f, 1e-6);  // 0 past the end
}

TEST(PlannedPushes, CountsEveryWorkersPushesOverTheJob) {
  JobConfig c;
  c.workers = 2;
  c.batch = 64;
  c.epochs = 3;
  EXPECT_EQ(planned_pushes(c, 55000), 2u * 3u * 430u);  // 27500 samples -> 430 batches each
  c.push_every = 4;
  EXPECT_EQ(planned_pushes(c, 55000), 2u * (1290u / 4u));
}

}  // namespace
}  // namespace asgd
