#include "actors/parameter_shard.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "actors/coordinator.hpp"
#include "compute/tensor.hpp"
#include "messaging/wire.hpp"
#include "shard_driver.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

using asgd_test::ShardDriver;

ShardSetup setup(std::size_t size, float lr = 0.5f, std::uint32_t workers = 2) {
  ShardSetup s;
  s.index = 3;
  s.range = {10, 10 + size};
  s.initial.assign(size, 1.0f);
  s.optimizer = {"sgd", lr, 0.0f, 0.0f};
  s.workers = workers;
  return s;
}

ShardDriver make_shard(std::size_t size, float lr = 0.5f) {
  auto core = ShardCore::make(setup(size, lr));
  EXPECT_TRUE(core.ok()) << core.status().to_string();
  return ShardDriver(std::move(core).value());
}

PushRequest grad(WorkerId w, Clock c, Clock base, std::vector<float> g, bool want = true) {
  return {w, c, base, 1, want, std::move(g)};
}

TEST(ShardCore, AppliesAPushWithItsOptimizerAndAnswersWithTheNewParameters) {
  ShardDriver shard = make_shard(4);
  ShardReply r = shard.push_now(grad(0, 0, 0, {1.0f, 2.0f, 0.0f, -2.0f}));
  EXPECT_EQ(static_cast<PushOutcome>(r.outcome), PushOutcome::applied);
  EXPECT_EQ(r.shard, 3u);
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(r.params, (std::vector<float>{0.5f, 0.0f, 1.0f, 2.0f}));
  EXPECT_EQ(std::vector<float>(shard.core.params().begin(), shard.core.params().end()), r.params);
}

// A push as the bridge hands on one from another process: its payload left
// in the frame's buffer (here a vector kept alive the same way), which the
// shard may write its reply over when `writable`.
PushRequest remote_grad(WorkerId w, Clock c, Clock base, std::vector<float> g, bool want = true,
                        bool writable = false) {
  auto frame = std::make_shared<std::vector<float>>(std::move(g));
  PushRequest r{w, c, base, 1, want, {}};
  r.received.values = *frame;
  if (writable) {
    r.received.writable = *frame;
  } else {
    r.received.spare.assign(frame->size(), -7.0f);  // recycled: stale contents
  }
  r.received.owner = std::move(frame);
  return r;
}

// The parameters a reply carries, wherever they are.
std::vector<float> params_of(const ShardReply& r) {
  if (r.params_in_frame.owner) return {r.params_in_frame.values.begin(), r.params_in_frame.values.end()};
  return r.params;
}

TEST(ShardCore, AppliesAPushLeftInItsFrameLikeOneInAVectorAndChecksumsTheReply) {
  // Big enough for several of the optimizer's blocks, and not a multiple of one.
  constexpr std::size_t kSize = 20000;
  for (const char* kind : {"sgd", "momentum", "adagrad", "adam"}) {
    for (bool writable : {false, true}) {
      ShardSetup s = setup(kSize);
      s.optimizer = {kind, 0.01f, 0.9f, 0.001f};
      auto local = ShardCore::make(s);
      auto remote = ShardCore::make(s);
      ASSERT_TRUE(local.ok() && remote.ok());
      ShardDriver a(std::move(local).value()), b(std::move(remote).value());
      for (Clock c = 0; c < 3; ++c) {
        std::vector<float> g(kSize);
        for (std::size_t i = 0; i < kSize; ++i) g[i] = static_cast<float>((i * 7 + c) % 13) - 6.0f;
        const ShardReply ra = a.push_now(grad(0, c, c, g));
        const ShardReply rb = b.push_now(remote_grad(0, c, c, g, true, writable));
        EXPECT_EQ(rb.params_in_frame.owner != nullptr, writable) << kind;
        const std::vector<float> pb = params_of(rb);
        ASSERT_EQ(ra.params, pb) << kind << " at clock " << c << (writable ? ", over the gradient" : "");
        EXPECT_FALSE(ra.params_crc.has_value());
        ASSERT_TRUE(rb.params_crc.has_value()) << kind;
        EXPECT_EQ(*rb.params_crc, messaging::crc32c(std::as_bytes(std::span<const float>(pb)))) << kind;
      }
    }
  }
}

TEST(ShardCore, CopiesARemotePayloadIntoAnAggregateInsteadOfKeepingItsFrame) {
  ShardSetup s = setup(3, 1.0f);
  s.policy.name = "bsp";
  auto core = ShardCore::make(s);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  ShardDriver shard(std::move(core).value());
  PushRequest r = remote_grad(0, 0, 0, {2.0f, 4.0f, 6.0f});
  std::weak_ptr<const void> frame = r.received.owner;
  const auto t0 = shard.push(std::move(r));
  EXPECT_TRUE(frame.expired()) << "the aggregate holds the frame's buffer";
  shard.push(remote_grad(1, 0, 0, {0.0f, 0.0f, 0.0f}));
  ASSERT_TRUE(shard.answered_now(t0));
  EXPECT_EQ(shard.reply(t0).params, (std::vector<float>{0.0f, -1.0f, -2.0f}));
}

// Under allreduce and gossip a shard keeps the copies the workers publish:
// the newest stays when an older one arrives late (it replaced it), and the
// updates it counts are the workers' optimizer steps the copies carry, as
// bsp's pushes count them (a copy every 8 steps was counted as one).
TEST(ShardCore, UnderGossipKeepsTheNewestPublishedCopyAndCountsTheStepsItCarries) {
  for (const char* policy : {"gossip:2", "allreduce"}) {
    ShardSetup s = setup(2);
    s.policy.name = policy;
    auto core = ShardCore::make(s);
    ASSERT_TRUE(core.ok()) << core.status().to_string();
    ShardDriver shard(std::move(core).value());
    shard.push_now(grad(0, 15, 15, {16.0f, 16.0f}, false));  // worker 0's copy after 16 steps
    EXPECT_EQ(shard.core.params()[0], 16.0f) << policy;
    EXPECT_EQ(shard.core.stats().updates_applied, 16u) << policy;
    shard.push_now(grad(1, 7, 7, {8.0f, 8.0f}, false));  // worker 1's after 8, late
    EXPECT_EQ(shard.core.params()[0], 16.0f) << policy << ": an older copy replaced a newer one";
    EXPECT_EQ(shard.core.stats().updates_applied, 24u) << policy;
    shard.push_now(grad(1, 23, 23, {24.0f, 24.0f}, false));
    EXPECT_EQ(shard.core.params()[0], 24.0f) << policy;
    EXPECT_EQ(shard.core.stats().updates_applied, 40u) << policy;
  }
}

// A shard restarted from its checkpoint goes on counting the seconds its
// optimizer took from where they were, like its update counts (the
// summary's shard_optimizer_s began at 0 again, beside cumulative counts).
TEST(ShardCore, ARestoredShardKeepsCountingItsOptimizerSeconds) {
  ShardDriver shard = make_shard(100000);
  for (Clock c = 0; c < 20; ++c) shard.push_now(grad(0, c, c, std::vector<float>(100000, 0.5f), false));
  const double spent = shard.core.stats().optimizer_s;
  ASSERT_GT(spent, 0.0);
  const asgd_test::TempDir dir;
  const std::string path = shard_checkpoint_path(dir.path().string(), 3);
  ASSERT_TRUE(shard.core.save(path).ok());
  auto again = ShardCore::make(setup(100000));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->restore(path, {}).ok());
  EXPECT_EQ(again->stats().optimizer_s, spent);
  EXPECT_EQ(again->stats().updates_applied, 20u);
}

// Under async's --push-every n a push sums the gradients of n steps: its
// weight decay is taken n times too, as n steps of their own would (it was
// taken once, so the decay per sample fell n-fold).
// No more than --push-every times, though: a shard restarted from its
// checkpoint holds clocks behind the workers' and took the decay of every
// step since (validation accuracy 0.88 fell to 0.105 at such a restart).
TEST(ShardCore, APushSummingStepsDecaysTheWeightsOnceForEachStep) {
  ShardSetup s = setup(1, 1.0f, 1);
  s.optimizer.weight_decay = 0.1f;
  s.policy.name = "async";
  s.policy.options["push-every"] = 4;
  auto core = ShardCore::make(s);
  ASSERT_TRUE(core.ok());
  ShardDriver shard(std::move(core).value());
  shard.push_now(grad(0, 3, 0, {0.0f}, false));  // steps 0-3 summed: p -= 1 * (0 + 4 * 0.1 * p)
  EXPECT_FLOAT_EQ(shard.core.params()[0], 0.6f);
  shard.push_now(grad(0, 4, 4, {0.0f}, false));  // one step (the last, short push): p -= 0.1 * p
  EXPECT_FLOAT_EQ(shard.core.params()[0], 0.54f);
  shard.push_now(grad(0, 104, 104, {0.0f}, false));  // 100 steps on (a restarted shard's clocks): 4 at most
  EXPECT_FLOAT_EQ(shard.core.params()[0], 0.54f * 0.6f);
  ShardSetup one = setup(1, 1.0f, 1);  // push-every 1: every push is one step, whatever the gap
  one.optimizer.weight_decay = 0.1f;
  auto plain = ShardCore::make(one);
  ASSERT_TRUE(plain.ok());
  ShardDriver again(std::move(plain).value());
  again.push_now(grad(0, 50, 0, {0.0f}, false));
  EXPECT_FLOAT_EQ(again.core.params()[0], 0.9f);
}

TEST(ShardCore, RejectsAGradientOfTheWrongSizeWithoutApplyingIt) {
  ShardDriver shard = make_shard(4);
  ShardReply r = shard.push_now(grad(0, 0, 0, {1.0f, 2.0f}));
  EXPECT_EQ(static_cast<PushOutcome>(r.outcome), PushOutcome::rejected);
  EXPECT_TRUE(r.params.empty());
  EXPECT_EQ(r.version, 0u);
  EXPECT_EQ(shard.core.stats().rejected, 1u);
  EXPECT_EQ(shard.core.stats().updates_applied, 0u);
  for (float p : shard.core.params()) EXPECT_EQ(p, 1.0f);
}

TEST(ShardCore, RejectsPushesAndPullsFromAWorkerItDoesNotKnowOrThatLeft) {
  ShardDriver shard = make_shard(2);
  EXPECT_EQ(static_cast<PushOutcome>(shard.push_now(grad(7, 0, 0, {1.0f, 1.0f})).outcome), PushOutcome::rejected);
  shard.leave(1);
  EXPECT_EQ(static_cast<PushOutcome>(shard.push_now(grad(1, 0, 0, {1.0f, 1.0f})).outcome), PushOutcome::rejected);
  const auto t = shard.pull({1, 0});
  EXPECT_EQ(static_cast<PushOutcome>(shard.reply(t).outcome), PushOutcome::rejected);
  // The unknown worker's push is malformed; the departed one's are counted apart.
  EXPECT_EQ(shard.core.stats().rejected, 1u);
  EXPECT_EQ(shard.core.stats().refused_departed, 2u);
}

TEST(ShardCore, RecordsStalenessInClocksBehindTheReadTheUpdateWasComputedOn) {
  ShardDriver shard = make_shard(2);
  shard.push_now(grad(0, 0, 0, {0.0f, 0.0f}, false));  // staleness 0
  shard.push_now(grad(1, 0, 0, {0.0f, 0.0f}, false));  // 0
  shard.push_now(grad(1, 1, 0, {0.0f, 0.0f}, false));  // clock 1 on a read complete to 0: 1
  shard.push_now(grad(0, 3, 1, {0.0f, 0.0f}, false));  // 2
  shard.push_now(grad(0, 4, 9, {0.0f, 0.0f}, false));  // a base from the future counts as fresh
  const ShardStats s = shard.core.stats();
  EXPECT_EQ(s.updates_applied, 5u);
  EXPECT_EQ(s.staleness_histogram, (std::vector<std::uint64_t>{3, 1, 1}));
}

TEST(ShardCore, TellsEachReadHowCompleteItIs) {
  ShardDriver shard = make_shard(2);
  EXPECT_EQ(shard.push_now(grad(0, 0, 0, {0.0f, 0.0f})).clock, 0u);  // worker 1 has pushed nothing
  EXPECT_EQ(shard.push_now(grad(1, 0, 0, {0.0f, 0.0f})).clock, 1u);  // both pushed clock 0
  EXPECT_EQ(shard.push_now(grad(1, 1, 1, {0.0f, 0.0f})).clock, 1u);
  shard.leave(0);
  EXPECT_EQ(shard.core.complete_clock(), 2u);  // only worker 1 is live
}

TEST(ShardCore, AnswersWithoutParametersWhenNoneAreWanted) {
  ShardDriver shard = make_shard(2);
  ShardReply r = shard.push_now(grad(0, 0, 0, {1.0f, 1.0f}, false));
  EXPECT_EQ(static_cast<PushOutcome>(r.outcome), PushOutcome::applied);
  EXPECT_TRUE(r.params.empty());
}

TEST(ShardCore, TreatsAnEmptyPushWithoutSamplesAsAClockTick) {
  ShardDriver shard = make_shard(2);
  ShardReply r = shard.push_now({0, 0, 0, 0, true, {}});
  EXPECT_EQ(static_cast<PushOutcome>(r.outcome), PushOutcome::none);
  EXPECT_EQ(r.params, (std::vector<float>{1.0f, 1.0f}));
  EXPECT_EQ(shard.core.view().min_clock, 0u);  // worker 1 is still at 0
  EXPECT_EQ(shard.core.stats().updates_applied, 0u);
  shard.push_now({1, 0, 0, 0, false, {}});
  EXPECT_EQ(shard.core.view().min_clock, 1u);
}

TEST(ShardCore, RefusesAGradientHoldingNaNOrInfinityButCountsItsClock) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ShardDriver shard = make_shard(3);
  ShardReply r = shard.push_now(grad(0, 0, 0, {1.0f, nan, 0.0f}));
  EXPECT_EQ(static_cast<PushOutcome>(r.outcome), PushOutcome::nonfinite);
  EXPECT_EQ(r.params, (std::vector<float>{1.0f, 1.0f, 1.0f}));  // answered, unchanged
  // From another process too, whether or not the bridge already knew.
  PushRequest checked = remote_grad(1, 0, 0, {-inf, 0.0f, 0.0f});
  checked.received.finite = false;
  EXPECT_EQ(static_cast<PushOutcome>(shard.push_now(std::move(checked)).outcome), PushOutcome::nonfinite);
  EXPECT_EQ(static_cast<PushOutcome>(shard.push_now(remote_grad(1, 1, 0, {0.0f, 0.0f, inf})).outcome),
            PushOutcome::nonfinite);
  const ShardStats s = shard.core.stats();
  EXPECT_EQ(s.nonfinite, 3u);
  EXPECT_EQ(s.updates_applied, 0u);
  EXPECT_EQ(s.rejected, 0u);
  for (float p : shard.core.params()) EXPECT_EQ(p, 1.0f);
  // Each still advanced its worker's clock: a barrier does not wait for them.
  EXPECT_EQ(shard.core.view().min_clock, 1u);
  // A finite push after them applies as usual.
  EXPECT_EQ(static_cast<PushOutcome>(shard.push_now(grad(0, 1, 1, {2.0f, 2.0f, 2.0f})).outcome),
            PushOutcome::applied);
  for (float p : shard.core.params()) EXPECT_EQ(p, 0.0f);
}

TEST(AllFinite, FindsANaNOrAnInfinityAnywhereAndNothingElse) {
  std::vector<float> v(5000, 1.5f);
  v[17] = -0.0f;
  v[18] = std::numeric_limits<float>::denorm_min();
  v[19] = std::numeric_limits<float>::max();
  EXPECT_TRUE(all_finite(v));
  EXPECT_TRUE(all_finite({}));
  for (std::size_t at : {std::size_t{0}, std::size_t{1023}, std::size_t{1024}, std::size_t{4999}}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::signaling_NaN()}) {
      std::vector<float> w = v;
      w[at] = bad;
      EXPECT_FALSE(all_finite(w)) << "at " << at << ": " << bad;
    }
  }
}

TEST(ShardCore, DescribesAReadHeldPastTheWarningTimeOnceNamingTheSlowestLiveWorkers) {
  using namespace std::chrono_literals;
  ShardSetup s = setup(2, 0.5f, 3);
  s.policy.name = "bsp";
  auto core = ShardCore::make(s);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const ShardCore::Instant t0 = std::chrono::steady_clock::now();
  std::vector<ShardCore::Answer> out;
  // Workers 0 and 2 push clock 0 and ask for clock 1: held until worker 1
  // pushes clock 0 too.
  core->push(grad(0, 0, 0, {1.0f, 1.0f}), 0, t0, out);
  core->push(grad(2, 0, 0, {1.0f, 1.0f}), 1, t0 + 1s, out);
  ASSERT_TRUE(out.empty());
  ASSERT_EQ(core->held_reads(), 2u);
  EXPECT_EQ(core->describe_overdue_reads(t0 + 2s, 5s), std::nullopt) << "nothing waited 5 s yet";
  const auto line = core->describe_overdue_reads(t0 + 5500ms, 5s);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("shard 3: 1 read(s) held by policy bsp for over 5 s"), std::string::npos) << *line;
  EXPECT_NE(line->find("worker 0's at clock 1, for 5.5 s"), std::string::npos) << *line;
  EXPECT_NE(line->find("waiting for the slowest live worker 1, at clock 0"), std::string::npos) << *line;
  EXPECT_EQ(core->describe_overdue_reads(t0 + 5800ms, 5s), std::nullopt) << "each read is described once";
  const auto second = core->describe_overdue_reads(t0 + 6500ms, 5s);
  ASSERT_TRUE(second);
  EXPECT_NE(second->find("worker 2's at clock 1"), std::string::npos) << *second;
  // Worker 1 is lost: the barrier re-forms and nothing is held any more.
  core->leave(1, t0 + 7s, out);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(core->held_reads(), 0u);
  EXPECT_EQ(core->describe_overdue_reads(t0 + 20s, 5s), std::nullopt);
}

TEST(ShardCore, RefusesInitialParametersOfTheWrongSize) {
  ShardSetup s = setup(5);
  s.initial.resize(4);
  auto core = ShardCore::make(s);
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), StatusCode::invalid_argument);
}

TEST(ShardCore, RefusesHogwildWithoutAParameterBufferSharedWithItsWorkers) {
  ShardSetup s = setup(2);
  s.policy.name = "hogwild";
  auto core = ShardCore::make(s);
  ASSERT_FALSE(core.ok());
  EXPECT_NE(core.status().message().find("cannot run across processes"), std::string::npos) << core.status().message();
  s.shared = std::make_shared<SharedParameters>(std::vector<float>(20, 0.0f), 2);
  EXPECT_TRUE(ShardCore::make(s).ok());
}

TEST(StalenessSummary, MergesHistogramsIntoMeanP99AndMax) {
  std::vector<std::uint64_t> merged;
  merge_histogram(merged, {50, 40});         // 50 x 0, 40 x 1
  merge_histogram(merged, {0, 0, 9, 0, 1});  // 9 x 2, 1 x 4
  const StalenessSummary s = summarize_staleness(merged);
  EXPECT_EQ(s.count, 100u);
  EXPECT_DOUBLE_EQ(s.mean, (40.0 + 18.0 + 4.0) / 100.0);
  EXPECT_DOUBLE_EQ(s.p99, 2.0);
  EXPECT_DOUBLE_EQ(s.max, 4.0);
  EXPECT_EQ(summarize_staleness({}).count, 0u);
}

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

TEST(LrSchedule, StepDropsTenfoldAtHalfAndAgainAtThreeQuartersOfTheJob) {
  const LrSchedule step{LrSchedule::Kind::step, 100};
  EXPECT_FLOAT_EQ(step.scale(0), 1.0f);
  EXPECT_FLOAT_EQ(step.scale(49), 1.0f);
  EXPECT_FLOAT_EQ(step.scale(50), 0.1f);
  EXPECT_FLOAT_EQ(step.scale(74), 0.1f);
  EXPECT_FLOAT_EQ(step.scale(75), 0.01f);
  EXPECT_FLOAT_EQ(step.scale(5000), 0.01f);
  EXPECT_FLOAT_EQ((LrSchedule{LrSchedule::Kind::step, 0}.scale(70)), 1.0f);
  LrSchedule::Kind k;
  EXPECT_TRUE(LrSchedule::parse("step", k));
  EXPECT_EQ(k, LrSchedule::Kind::step);
}

TEST(ShardCore, ScalesEachStepByTheScheduleAtTheUpdatesClock) {
  ShardSetup s = setup(1, 1.0f, 1);
  s.initial = {0.0f};
  s.schedule = {LrSchedule::Kind::cosine, 2};
  auto core = ShardCore::make(s);
  ASSERT_TRUE(core.ok());
  ShardDriver shard(std::move(core).value());
  EXPECT_FLOAT_EQ(shard.push_now(grad(0, 0, 0, {1.0f})).params[0], -1.0f);   // scale 1 at clock 0
  EXPECT_FLOAT_EQ(shard.push_now(grad(0, 1, 1, {1.0f})).params[0], -1.5f);   // scale 0.5 at clock 1
  EXPECT_NEAR(shard.push_now(grad(0, 2, 2, {1.0f})).params[0], -1.5f, 1e-6);  // 0 past the end
}

TEST(ShardCore, StalenessAwareStepsDivideAStaleStepsDoubledRateByItsStaleness) {
  ShardSetup s = setup(1, 1.0f, 1);  // one worker: a staleness of 1 is usual
  s.initial = {0.0f};
  s.staleness_aware_lr = true;
  auto core = ShardCore::make(s);
  ASSERT_TRUE(core.ok());
  ShardDriver shard(std::move(core).value());
  // Staleness counts the shard's updates since the version the push read.
  auto read_at = [](Clock c, std::uint64_t version) {
    PushRequest p = grad(0, c, c, {1.0f});
    p.base_version = version;
    return p;
  };
  EXPECT_FLOAT_EQ(shard.push_now(read_at(0, 0)).params[0], -1.0f);   // fresh: full step
  EXPECT_FLOAT_EQ(shard.push_now(read_at(1, 0)).params[0], -2.0f);   // 1 update behind: usual, full step
  EXPECT_FLOAT_EQ(shard.push_now(read_at(2, 0)).params[0], -3.0f);   // 2 behind: 2 x 1/2
  EXPECT_FLOAT_EQ(shard.push_now(read_at(3, 3)).params[0], -4.0f);   // read the latest: full step
  EXPECT_FLOAT_EQ(shard.push_now(read_at(4, 0)).params[0], -4.5f);   // 4 behind: 2 x 1/4
}

TEST(ShardCore, AStaleStepIsTakenWithMomentumHalfAndTheNextFreshOneWithTheConfiguredMomentum) {
  ShardSetup s = setup(1, 1.0f, 1);
  s.initial = {0.0f};
  s.optimizer = {"momentum", 1.0f, 0.9f, 0.0f};
  s.staleness_aware_lr = true;
  auto core = ShardCore::make(s);
  ASSERT_TRUE(core.ok());
  ShardDriver shard(std::move(core).value());
  PushRequest fresh = grad(0, 0, 0, {1.0f});
  EXPECT_FLOAT_EQ(shard.push_now(std::move(fresh)).params[0], -1.0f);  // v = 1
  PushRequest stale = grad(0, 1, 1, {1.0f});
  stale.base_version = 0;
  shard.push_now(grad(0, 1, 1, {0.0f}));                             // a zero gradient: v = 0.9, p = -1.9
  EXPECT_FLOAT_EQ(shard.push_now(std::move(stale)).params[0], -1.9f - (0.5f * 0.9f + 1.0f));  // 2 behind: v = 0.5 v + g, rate 2 x 1/2
  PushRequest again = grad(0, 2, 2, {1.0f});
  again.base_version = 3;
  EXPECT_NEAR(shard.push_now(std::move(again)).params[0], -1.9f - 1.45f - (0.9f * 1.45f + 1.0f), 1e-5);  // fresh: 0.9 again
}

}  // namespace
}  // namespace asgd
