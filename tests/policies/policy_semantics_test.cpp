// What each consistency policy promises, proved on the real policies
// (make_policy) inside the real ShardCore, with a deterministic scheduler:
// scripted schedules for the exact cases, and a seeded random-interleaving
// simulator of workers that checks every invariant after every event. No
// threads, no sleeps, no actor system.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../actors/shard_driver.hpp"
#include "actors/parameter_shard.hpp"
#include "base/random.hpp"

namespace asgd {
namespace {

using asgd_test::ShardDriver;
using Ticket = ShardCore::Ticket;

PolicyConfig policy_named(const std::string& name) {
  PolicyConfig c;
  c.name = name;
  return c;
}
PolicyConfig bsp(std::uint32_t backups = 0) {
  PolicyConfig c = policy_named("bsp");
  c.options["backup-workers"] = backups;
  return c;
}
PolicyConfig ssp(std::uint32_t s) { return policy_named("ssp:" + std::to_string(s)); }
PolicyConfig averaging(std::uint32_t local_steps) {
  PolicyConfig c = policy_named("averaging");
  c.options["local-steps"] = local_steps;
  return c;
}

ShardDriver make_shard(const PolicyConfig& policy, std::uint32_t workers, std::vector<float> initial, float lr) {
  ShardSetup s;
  s.range = {0, initial.size()};
  s.initial = std::move(initial);
  s.optimizer = {"sgd", lr, 0.0f, 0.0f};
  s.policy = policy;
  s.workers = workers;
  auto core = ShardCore::make(std::move(s));
  if (!core.ok()) throw std::runtime_error(core.status().to_string());
  return ShardDriver(std::move(core).value());
}

PushOutcome outcome(const ShardReply& r) { return static_cast<PushOutcome>(r.outcome); }

std::vector<float> params_of(const ShardDriver& d) { return {d.core.params().begin(), d.core.params().end()}; }

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Seeded values in [-1, 1), different for every (seed, worker, clock).
std::vector<float> seeded_values(std::uint64_t seed, std::uint64_t worker, std::uint64_t clock, std::size_t n) {
  Rng rng(mix_seed(seed, worker, clock));
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

/// initial - lr * (samples-weighted mean of grads), in double.
std::vector<double> sgd_on_weighted_mean(const std::vector<double>& initial, double lr,
                                         const std::vector<std::vector<float>>& grads,
                                         const std::vector<std::uint32_t>& samples) {
  double total = 0;
  for (std::size_t w = 0; w < grads.size(); ++w) total += samples[w];
  std::vector<double> out = initial;
  for (std::size_t i = 0; i < out.size(); ++i) {
    double mean = 0;
    for (std::size_t w = 0; w < grads.size(); ++w) mean += samples[w] / total * grads[w][i];
    out[i] -= lr * mean;
  }
  return out;
}

void expect_near(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], tolerance) << "at " << i;
}

// ---------------------------------------------------------------------------
// bsp

TEST(BspSemantics, AppliesOneSamplesWeightedMeanUpdatePerClockOnceEveryWorkerPushed) {
  constexpr std::uint32_t kWorkers = 3;
  constexpr std::size_t kSize = 5;
  constexpr float kLr = 0.1f;
  const std::vector<std::uint32_t> samples = {1, 2, 5};
  std::vector<float> initial = seeded_values(7, 99, 99, kSize);
  ShardDriver shard = make_shard(bsp(), kWorkers, initial, kLr);
  std::vector<double> expected(initial.begin(), initial.end());

  for (WorkerId w = 0; w < kWorkers; ++w) ASSERT_TRUE(shard.answered_now(shard.pull({w, 0})));
  for (Clock t = 0; t < 6; ++t) {
    std::vector<std::vector<float>> grads;
    for (WorkerId w = 0; w < kWorkers; ++w) grads.push_back(seeded_values(7, w, t, kSize));
    const std::vector<float> before = params_of(shard);
    // Worker 2 pushes without asking for parameters and reads for t + 1
    // with a pull of its own, ahead of its push.
    const Ticket early_pull = shard.pull({2, t + 1});
    const Ticket first = shard.push({0, t, t, samples[0], true, grads[0]});
    const Ticket second = shard.push({1, t, t, samples[1], true, grads[1]});
    EXPECT_FALSE(shard.answered_now(early_pull)) << "a read at clock " << t + 1 << " before every clock-" << t << " push";
    EXPECT_FALSE(shard.answered_now(first));
    EXPECT_FALSE(shard.answered_now(second));
    EXPECT_EQ(shard.core.held_reads(), 3u);
    EXPECT_TRUE(bitwise_equal(params_of(shard), before)) << "applied before the clock was complete";
    EXPECT_EQ(shard.core.stats().commits, t);

    const ShardReply last = shard.push_now({2, t, t, samples[2], false, grads[2]});
    EXPECT_EQ(outcome(last), PushOutcome::aggregated);
    EXPECT_TRUE(last.params.empty());
    expected = sgd_on_weighted_mean(expected, kLr, grads, samples);
    expect_near(params_of(shard), expected, 1e-6);
    EXPECT_EQ(shard.core.stats().commits, t + 1) << "exactly one update per clock";
    EXPECT_EQ(shard.core.stats().updates_applied, kWorkers * (t + 1));
    EXPECT_EQ(shard.core.held_reads(), 0u);
    for (Ticket ticket : {early_pull, first, second}) {
      ASSERT_TRUE(shard.answered_now(ticket));
      EXPECT_EQ(shard.reply(ticket).clock, t + 1);
      EXPECT_TRUE(bitwise_equal(shard.reply(ticket).params, params_of(shard)));
    }
    EXPECT_EQ(outcome(shard.reply(first)), PushOutcome::aggregated);
    EXPECT_EQ(outcome(shard.reply(early_pull)), PushOutcome::none);
  }
}

TEST(BspSemantics, WithOneBackupWorkerOfThreeCommitsOnTheFirstTwoPushesAndDiscardsTheLateOne) {
  constexpr float kLr = 0.5f;
  PolicyConfig config = bsp(1);
  ShardDriver shard = make_shard(config, 3, {1.0f, 2.0f}, kLr);
  std::vector<double> expected = {1.0, 2.0};
  // The late worker changes from clock to clock.
  const std::vector<std::vector<WorkerId>> orders = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}};
  for (Clock t = 0; t < orders.size(); ++t) {
    const auto& order = orders[t];
    std::vector<std::vector<float>> grads;
    for (WorkerId w = 0; w < 3; ++w) grads.push_back(seeded_values(11, w, t, 2));

    const Ticket first = shard.push({order[0], t, t, 1, true, grads[order[0]]});
    EXPECT_FALSE(shard.answered_now(first));
    EXPECT_EQ(shard.core.stats().commits, t);
    const Ticket second = shard.push({order[1], t, t, 1, true, grads[order[1]]});
    ASSERT_TRUE(shard.answered_now(first)) << "two of three is enough with one backup";
    ASSERT_TRUE(shard.answered_now(second));
    EXPECT_EQ(shard.core.stats().commits, t + 1);
    expected = sgd_on_weighted_mean(expected, kLr, {grads[order[0]], grads[order[1]]}, {1, 1});
    expect_near(params_of(shard), expected, 1e-6);
    const std::vector<float> committed = params_of(shard);

    const ShardReply late = shard.push_now({order[2], t, t, 1, true, grads[order[2]]});
    EXPECT_EQ(outcome(late), PushOutcome::discarded);
    EXPECT_TRUE(bitwise_equal(params_of(shard), committed)) << "the late gradient was applied";
    EXPECT_TRUE(bitwise_equal(late.params, committed)) << "the late worker still reads clock " << t + 1;
    EXPECT_EQ(late.clock, t + 1);
    EXPECT_EQ(shard.core.stats().updates_discarded, t + 1);
    EXPECT_EQ(shard.core.stats().updates_applied, 2 * (t + 1));
  }
}

TEST(BspSemantics, AWorkerLeavingReleasesTheAggregateTheOthersWaitFor) {
  constexpr float kLr = 0.25f;
  ShardDriver shard = make_shard(bsp(), 3, {0.0f, 0.0f, 0.0f}, kLr);
  const std::vector<float> g0 = {1.0f, 2.0f, 3.0f}, g1 = {3.0f, -2.0f, 1.0f};
  const Ticket a = shard.push({0, 0, 0, 1, true, g0});
  const Ticket b = shard.push({1, 0, 0, 1, true, g1});
  EXPECT_FALSE(shard.answered_now(a));
  EXPECT_FALSE(shard.answered_now(b));
  shard.leave(2);
  ASSERT_TRUE(shard.answered_now(a));
  ASSERT_TRUE(shard.answered_now(b));
  expect_near(shard.reply(a).params, sgd_on_weighted_mean({0, 0, 0}, kLr, {g0, g1}, {1, 1}), 1e-7);
  EXPECT_EQ(shard.reply(a).clock, 1u);
  EXPECT_EQ(shard.core.stats().commits, 1u);
  // From now on two workers make a clock.
  const Ticket c = shard.push({0, 1, 1, 1, true, g0});
  EXPECT_FALSE(shard.answered_now(c));
  shard.push_now({1, 1, 1, 1, false, g1});
  EXPECT_TRUE(shard.answered_now(c));
  EXPECT_EQ(shard.core.stats().commits, 2u);
}

TEST(BspSemantics, AWorkerThatPushedAndThenLeftStillHasItsGradientInTheAverage) {
  constexpr float kLr = 0.5f;
  ShardDriver shard = make_shard(bsp(), 3, {0.0f, 0.0f}, kLr);
  const std::vector<float> g0 = {4.0f, 0.0f}, g1 = {0.0f, 2.0f}, g2 = {2.0f, 2.0f};
  EXPECT_EQ(outcome(shard.push_now({0, 0, 0, 1, false, g0})), PushOutcome::aggregated);
  shard.leave(0);
  EXPECT_EQ(shard.core.stats().commits, 0u) << "a departed worker's push must not stand in for a live one";
  const Ticket t1 = shard.push({1, 0, 0, 1, true, g1});
  EXPECT_FALSE(shard.answered_now(t1)) << "worker 2 is still computing clock 0";
  shard.push_now({2, 0, 0, 1, false, g2});
  ASSERT_TRUE(shard.answered_now(t1));
  EXPECT_EQ(shard.core.stats().commits, 1u);
  EXPECT_EQ(shard.core.stats().updates_applied, 3u);
  expect_near(params_of(shard), sgd_on_weighted_mean({0, 0}, kLr, {g0, g1, g2}, {1, 1, 1}), 1e-7);
}

TEST(BspSemantics, CommitsWhatWasPushedOnceEveryWorkerHasLeft) {
  // Nothing is left to wait for: the last clock's gradients must not be lost
  // from the final parameters.
  constexpr float kLr = 1.0f;
  ShardDriver shard = make_shard(bsp(), 2, {0.0f}, kLr);
  shard.push_now({0, 0, 0, 1, false, {2.0f}});
  shard.leave(0);
  shard.leave(1);
  EXPECT_EQ(shard.core.stats().commits, 1u);
  EXPECT_EQ(params_of(shard), (std::vector<float>{-2.0f}));
}

TEST(BspSemantics, SumsGradientsInWorkerOrderSoParametersAreBitwiseTheSameWhateverOrderPushesArriveIn) {
  constexpr std::uint32_t kWorkers = 4;
  constexpr std::size_t kSize = 64;
  constexpr float kLr = 0.3f;
  const std::vector<std::uint32_t> samples = {3, 1, 4, 7};
  // Magnitudes far apart, so float sums depend on their order.
  auto grad = [&](WorkerId w, Clock t) {
    auto g = seeded_values(23, w, t, kSize);
    for (auto& x : g) x *= std::ldexp(1.0f, static_cast<int>(3 * w) - 4);
    return g;
  };
  const std::vector<float> initial = seeded_values(23, 9, 9, kSize);
  ShardDriver in_order = make_shard(bsp(), kWorkers, initial, kLr);
  ShardDriver shuffled = make_shard(bsp(), kWorkers, initial, kLr);
  const std::vector<std::vector<WorkerId>> arrivals = {{3, 1, 0, 2}, {2, 3, 1, 0}, {1, 0, 3, 2}, {3, 2, 1, 0}};
  bool order_matters = false;  // the test is only as strong as this
  for (Clock t = 0; t < arrivals.size(); ++t) {
    for (WorkerId w = 0; w < kWorkers; ++w) in_order.push_now({w, t, t, samples[w], false, grad(w, t)});
    for (WorkerId w : arrivals[t]) shuffled.push_now({w, t, t, samples[w], false, grad(w, t)});
    ASSERT_EQ(in_order.core.stats().commits, t + 1);
    ASSERT_EQ(shuffled.core.stats().commits, t + 1);
    EXPECT_TRUE(bitwise_equal(params_of(in_order), params_of(shuffled))) << "after clock " << t;

    // Would summing in arrival order have given other bits?
    const float total = 15.0f;
    for (std::size_t i = 0; i < kSize; ++i) {
      float by_worker = 0.0f, by_arrival = 0.0f;
      for (WorkerId w = 0; w < kWorkers; ++w) by_worker += samples[w] / total * grad(w, t)[i];
      for (WorkerId w : arrivals[t]) by_arrival += samples[w] / total * grad(w, t)[i];
      order_matters |= by_worker != by_arrival;
    }
  }
  EXPECT_TRUE(order_matters) << "the gradients are too tame to tell summation orders apart";
}

// ---------------------------------------------------------------------------
// ssp, scripted

class SspStaleness : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(SspStaleness, AnswersAReadAtClockCExactlyWhenTheSlowestLiveWorkerHasReachedCMinusS) {
  const std::uint32_t s = GetParam();
  constexpr Clock kAhead = 12;  // clocks workers 0 and 1 push before worker 2 starts
  ShardDriver shard = make_shard(ssp(s), 3, {0.0f}, 1.0f);
  for (WorkerId w = 0; w < 2; ++w)
    for (Clock t = 0; t < kAhead; ++t) shard.push_now({w, t, 0, 1, false, {0.0f}});

  struct Read {
    Ticket ticket;
    Clock clock;
  };
  std::vector<Read> held;
  // m: clocks worker 2, the slowest, has pushed.
  for (Clock m = 0; m <= 6; ++m) {
    for (auto it = held.begin(); it != held.end();) {
      const bool may = m + s >= it->clock;
      EXPECT_EQ(shard.answered_now(it->ticket), may) << "read at " << it->clock << " with the slowest at " << m;
      it = may ? held.erase(it) : it + 1;
    }
    for (Clock c = m; c <= m + s + 3; ++c) {
      const Ticket ticket = shard.pull({0, c});
      const bool may = m + s >= c;
      EXPECT_EQ(shard.answered_now(ticket), may) << "read at " << c << " with the slowest at " << m;
      if (may) {
        EXPECT_EQ(shard.reply(ticket).clock, m);
      } else {
        held.push_back({ticket, c});
      }
    }
    EXPECT_EQ(shard.core.held_reads(), held.size());
    shard.push_now({2, m, 0, 1, false, {0.0f}});
  }
  // Once the slowest leaves, worker 0 and 1's kAhead clocks bound the reads.
  shard.leave(2);
  for (const Read& r : held) EXPECT_EQ(shard.answered_now(r.ticket), kAhead + s >= r.clock);
}

TEST_P(SspStaleness, BlocksAWorkerExactlyWhenItIsSPlusOneClocksAheadOfTheSlowest) {
  const std::uint32_t s = GetParam();
  ShardDriver shard = make_shard(ssp(s), 2, {0.0f}, 1.0f);
  // Worker 0 runs ahead while worker 1 has pushed nothing: its pushes of
  // clocks 0 .. s - 1 are answered with the read for the next clock.
  for (Clock t = 0; t < s; ++t) EXPECT_TRUE(shard.answered_now(shard.push({0, t, 0, 1, true, {0.0f}})));
  for (Clock slow = 0; slow < 5; ++slow) {
    // Pushing clock slow + s makes it s + 1 clocks ahead: its read is held...
    const Ticket ahead = shard.push({0, slow + s, slow, 1, true, {0.0f}});
    EXPECT_FALSE(shard.answered_now(ahead)) << "s + 1 = " << s + 1 << " clocks ahead";
    // ...until the slowest worker catches up by one clock.
    EXPECT_TRUE(shard.answered_now(shard.push({1, slow, slow, 1, true, {0.0f}})));
    EXPECT_TRUE(shard.answered_now(ahead));
  }
}

INSTANTIATE_TEST_SUITE_P(S, SspStaleness, ::testing::Values(0u, 1u, 3u));

// ---------------------------------------------------------------------------
// averaging

TEST(AveragingSemantics, ReplacesTheParametersByTheSamplesWeightedMeanOnceEveryWorkerPushedItsRound) {
  constexpr std::uint32_t kWorkers = 3, kLocalSteps = 4;
  constexpr std::size_t kSize = 6;
  const std::vector<std::uint32_t> samples = {1, 2, 5};
  const std::vector<float> initial = seeded_values(31, 9, 9, kSize);
  ShardDriver shard = make_shard(averaging(kLocalSteps), kWorkers, initial, 0.1f);
  std::vector<Clock> base(kWorkers);
  for (WorkerId w = 0; w < kWorkers; ++w) {
    const Ticket t = shard.pull({w, 0});
    ASSERT_TRUE(shard.answered_now(t));
    EXPECT_TRUE(bitwise_equal(shard.reply(t).params, initial));
    base[w] = shard.reply(t).clock;
  }
  for (Clock round = 0; round < 4; ++round) {
    const Clock end = round * kLocalSteps + kLocalSteps - 1;  // the round's last step
    std::vector<std::vector<float>> local;  // each worker's parameters after its k local steps
    for (WorkerId w = 0; w < kWorkers; ++w) local.push_back(seeded_values(31, w, round, kSize));
    const std::vector<float> before = params_of(shard);

    std::vector<Ticket> tickets;
    for (WorkerId w : {2u, 0u}) tickets.push_back(shard.push({w, end, base[w], samples[w], true, local[w]}));
    // A read for the next round from a worker still computing its round.
    const Ticket next_round = shard.pull({1, end + 1});
    for (Ticket t : tickets) EXPECT_FALSE(shard.answered_now(t));
    EXPECT_FALSE(shard.answered_now(next_round));
    EXPECT_TRUE(bitwise_equal(params_of(shard), before)) << "averaged before every worker pushed round " << round;

    tickets.push_back(shard.push({1, end, base[1], samples[1], true, local[1]}));
    tickets.push_back(next_round);
    // Parameters, not gradients: the mean replaces them, lr plays no part.
    const std::vector<double> mean = sgd_on_weighted_mean(std::vector<double>(kSize, 0.0), -1.0, local, samples);
    expect_near(params_of(shard), mean, 1e-6);
    for (Ticket t : tickets) {
      ASSERT_TRUE(shard.answered_now(t));
      EXPECT_TRUE(bitwise_equal(shard.reply(t).params, params_of(shard)));
      EXPECT_EQ(shard.reply(t).clock, end + 1);
    }
    std::fill(base.begin(), base.end(), end + 1);
    EXPECT_EQ(shard.core.stats().commits, round + 1);
  }
  // Every worker's last local step of a round misses the others' k - 1.
  std::vector<std::uint64_t> histogram(kLocalSteps, 0);
  histogram[kLocalSteps - 1] = 4 * kWorkers;
  EXPECT_EQ(shard.core.stats().staleness_histogram, histogram);
}

PolicyConfig easgd(std::uint32_t tau, double alpha) {
  PolicyConfig c = policy_named("easgd");
  c.options = {{"local-steps", tau}, {"moving-rate", alpha}};
  return c;
}

TEST(EasgdSemantics, CenterAndWorkerEachMoveAlphaOfTheirDifferenceAndNobodyWaits) {
  constexpr std::uint32_t kWorkers = 2, kTau = 4;
  constexpr double kAlpha = 0.25;
  constexpr std::size_t kSize = 5;
  const std::vector<float> initial = seeded_values(41, 9, 9, kSize);
  ShardDriver shard = make_shard(easgd(kTau, kAlpha), kWorkers, initial, 0.1f);
  std::vector<double> center(initial.begin(), initial.end());
  for (Clock round = 0; round < 3; ++round) {
    const Clock end = round * kTau + kTau - 1;
    // Only worker 1 pushes: under easgd it is answered at once, worker 0
    // being a round behind or not.
    for (WorkerId w : {1u, 0u}) {
      if (w == 0 && round == 1) continue;
      const std::vector<float> local = seeded_values(41, w, round, kSize);
      const Ticket t = shard.push({w, end, 0, 64, true, local});
      ASSERT_TRUE(shard.answered_now(t)) << "worker " << w << " round " << round;
      std::vector<double> moved(kSize);
      for (std::size_t i = 0; i < kSize; ++i) {
        const double d = kAlpha * (local[i] - center[i]);  // the elastic difference; lr plays no part
        center[i] += d;
        moved[i] = local[i] - d;
      }
      expect_near(params_of(shard), center, 1e-6);
      expect_near(shard.reply(t).params, moved, 1e-6);
    }
  }
  EXPECT_EQ(shard.core.stats().updates_applied, 5u);
}

TEST(EasgdSemantics, IsAKnownPolicyWithItsTwoKnobsAndRefusesAMovingRateOutsideZeroToOne) {
  auto made = make_policy(easgd(4, 0.5));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_EQ((*made)->name(), "easgd");
  EXPECT_EQ((*made)->combine().rule, Combine::Rule::elastic);
  EXPECT_FLOAT_EQ((*made)->combine().moving_rate, 0.5f);
  const StepPlan mid = (*made)->plan(1), end = (*made)->plan(3);
  EXPECT_TRUE(mid.local_update && !mid.push && !mid.pull);
  EXPECT_TRUE(end.local_update && end.push && end.pull);
  EXPECT_FALSE(make_policy(easgd(4, 1.5)).ok());
  EXPECT_FALSE(make_policy(easgd(0, 0.5)).ok());
  PolicyConfig defaults = policy_named("easgd");
  EXPECT_TRUE(make_policy(defaults).ok());
  EXPECT_NE(std::find(known_policies().begin(), known_policies().end(), "easgd"), known_policies().end());
}

TEST(AveragingSemantics, AWorkerThatEndsOnAPartialRoundAndLeavesDoesNotStallOneWithMoreSteps) {
  // Workers with unequal step counts (--worker-weights): worker 0 ends after
  // 2 steps with a partial round pushed at clock 1 (as actors/worker.cpp
  // does when it runs out of data) and leaves; worker 1 ends its round at
  // clock 3 and would never push at clock 1.
  ShardDriver shard = make_shard(averaging(4), 2, {0.0f, 0.0f}, 0.1f);
  shard.pull({0, 0});
  shard.pull({1, 0});
  shard.push_now({0, 1, 0, 2, false, {1.0f, 1.0f}});
  shard.leave(0);
  const Ticket round_end = shard.push({1, 3, 0, 8, true, {3.0f, 5.0f}});
  ASSERT_TRUE(shard.answered_now(round_end)) << "worker 1 waits for a clock no live worker will push";
  EXPECT_EQ(shard.reply(round_end).clock, 4u);
  EXPECT_EQ(shard.reply(round_end).params, (std::vector<float>{3.0f, 5.0f}));
  EXPECT_EQ(shard.core.held_reads(), 0u);
}

// ---------------------------------------------------------------------------
// The random-interleaving simulator

/// What a shard under test must do, stated without ShardCore: when a read
/// may be answered, what its parameters contain, how stale an update may be.
enum class Rule { async, ssp, bsp };

struct ShardUnderTest {
  Rule rule;
  std::uint32_t s = 0;  // ssp's staleness; 0 for bsp
  ShardDriver driver;
};

struct SimOptions {
  std::vector<Clock> clocks;         // (workers,) steps each worker takes
  std::vector<double> speed;         // (workers,) relative chance to be picked among the unblocked
  double separate_pulls = 0.0;       // chance that a step pushes without parameters, then pulls
  bool one_hot = true;               // the gradient of (w, t) is -e_slot(w, t), else seeded values
  std::size_t dense_size = 8;        // parameters when !one_hot
  std::uint64_t seed = 0;
};

/// N simulated workers that behave as actors/worker.cpp does: pull clock 0,
/// then each step push the gradient tagged with its clock and, as its base
/// clock, the clock of its last read (ShardReply.clock); the push's reply is
/// the read for the next clock (or, for `separate_pulls`, the push asks for
/// nothing and a pull follows); leave after the last step. Each event, a
/// seeded scheduler lets one worker that is not waiting for a held read take
/// its next action, on every shard under test at once (they must answer
/// alike), then checks every invariant.
class Simulation {
 public:
  Simulation(std::vector<ShardUnderTest> shards, SimOptions options)
      : shards_(std::move(shards)), options_(std::move(options)), rng_(options_.seed) {
    const std::size_t n = options_.clocks.size();
    workers_.resize(n);
    pushed_.assign(n, 0);
    live_.assign(n, true);
    max_clocks_ = *std::max_element(options_.clocks.begin(), options_.clocks.end());
  }

  /// Parameters a shard needs for this simulation.
  static std::size_t size(const SimOptions& o) {
    return o.one_hot ? o.clocks.size() * *std::max_element(o.clocks.begin(), o.clocks.end()) : o.dense_size;
  }

  /// One event; false once every worker has left, after a failed check, or
  /// when no worker can move although some have not left (a deadlock).
  bool step() {
    if (failed_) return false;
    std::vector<std::size_t> ready;
    double total = 0;
    for (std::size_t w = 0; w < workers_.size(); ++w) {
      if (workers_[w].left || workers_[w].waiting) continue;
      ready.push_back(w);
      total += options_.speed[w];
    }
    if (ready.empty()) {
      for (std::size_t w = 0; w < workers_.size(); ++w) {
        if (!workers_[w].left) {
          ADD_FAILURE() << "deadlock: worker " << w << " waits for its read at clock " << workers_[w].read_clock
                        << " forever";
          failed_ = true;
        }
      }
      return false;
    }
    double pick = rng_.uniform() * total;
    std::size_t chosen = ready.back();
    for (std::size_t w : ready) {
      if (pick < options_.speed[w]) {
        chosen = w;
        break;
      }
      pick -= options_.speed[w];
    }
    act(static_cast<WorkerId>(chosen));
    check();
    failed_ = failed_ || ::testing::Test::HasFailure();
    return !failed_;
  }

  void run() {
    while (step()) {
    }
    if (!failed_) finish();
  }

  /// The shards' complete clock as the workers' pushes determine it: the
  /// slowest live worker's pushes, or the most pushes when none is live.
  Clock complete() const {
    Clock lowest = std::numeric_limits<Clock>::max(), highest = 0;
    bool any = false;
    for (std::size_t w = 0; w < pushed_.size(); ++w) {
      highest = std::max(highest, pushed_[w]);
      if (live_[w]) {
        any = true;
        lowest = std::min(lowest, pushed_[w]);
      }
    }
    return any ? lowest : highest;
  }

  const std::vector<ShardUnderTest>& shards() const { return shards_; }
  std::uint64_t holds() const { return holds_; }
  Clock max_lead() const { return max_lead_; }
  const std::vector<std::uint64_t>& staleness() const { return staleness_; }

 private:
  struct Worker {
    Clock step = 0;          // the clock it computes (and pushes) next
    Clock base = 0;          // ShardReply.clock of its last read
    bool has_read = false;   // it holds the read for `step`
    std::optional<Ticket> waiting;  // a read not answered yet
    Clock read_clock = 0;    // of that read
    bool fresh = false;      // that read was asked in this event
    bool left = false;
  };

  std::size_t slot(std::size_t w, Clock t) const { return w * max_clocks_ + t; }

  std::vector<float> gradient(WorkerId w, Clock t) const {
    if (!options_.one_hot) return seeded_values(options_.seed, w, t, options_.dense_size);
    // With sgd at lr 1 (and 1/n in a bsp mean) the slot tells whether this
    // one push is in the parameters.
    std::vector<float> g(size(options_), 0.0f);
    g[slot(w, t)] = -1.0f;
    return g;
  }

  Ticket on_all(const auto& call) {
    const Ticket ticket = call(shards_.front().driver);
    for (std::size_t k = 1; k < shards_.size(); ++k) EXPECT_EQ(call(shards_[k].driver), ticket);
    return ticket;
  }

  void act(WorkerId w) {
    Worker& me = workers_[w];
    const Clock clocks = options_.clocks[w];
    if (me.step == clocks) {  // done: tell the shards to stop waiting for us
      for (auto& s : shards_) s.driver.leave(w);
      live_[w] = false;
      me.left = true;
      return;
    }
    if (!me.has_read) {
      const Ticket t = on_all([&](ShardDriver& d) { return d.pull({w, me.step}); });
      wait_for(me, t, me.step);
      return;
    }
    const Clock t = me.step;
    const bool want = !(options_.separate_pulls > 0 && rng_.uniform() < options_.separate_pulls);
    const Clock staleness = t - me.base;
    for (const auto& s : shards_) {
      if (s.rule != Rule::async) {  // bsp's s is 0
        EXPECT_LE(staleness, s.s) << "worker " << w << "'s push of clock " << t << " on a read at " << me.base;
      }
    }
    if (staleness_.size() <= staleness) staleness_.resize(staleness + 1, 0);
    ++staleness_[staleness];
    ++pushes_;
    const std::vector<float> g = gradient(w, t);
    const std::uint32_t samples = 1;
    const Ticket ticket = on_all([&](ShardDriver& d) { return d.push({w, t, me.base, samples, want, g}); });
    pushed_[w] = t + 1;
    ++me.step;
    me.has_read = false;
    const Clock slowest = complete();
    max_lead_ = std::max(max_lead_, pushed_[w] - std::min(slowest, pushed_[w]));
    for (const auto& s : shards_) {
      if (s.rule != Rule::async) {
        EXPECT_LE(pushed_[w] - slowest, s.s + 1) << "worker " << w << " ran ahead of the slowest";
      }
    }
    if (want) {
      wait_for(me, ticket, t + 1);
    } else {
      for (const auto& s : shards_) {
        ASSERT_TRUE(s.driver.answered_now(ticket)) << "held a push that asked for no read";
        EXPECT_TRUE(s.driver.reply(ticket).params.empty());
      }
    }
  }

  void wait_for(Worker& me, Ticket ticket, Clock clock) {
    me.waiting = ticket;
    me.read_clock = clock;
    me.fresh = true;
  }

  bool allowed(const ShardUnderTest& s, Clock c) const {
    switch (s.rule) {
      case Rule::async: return true;
      case Rule::ssp: return complete() + s.s >= c;
      case Rule::bsp: return complete() >= c;
    }
    return false;
  }

  // Pushes of clocks below this must all be in a read at clock c.
  static Clock required_below(const ShardUnderTest& s, Clock c) {
    switch (s.rule) {
      case Rule::async: return 0;
      case Rule::ssp: return c > s.s ? c - s.s : 0;
      case Rule::bsp: return c;
    }
    return 0;
  }

  // Whether the push of (w, t) is in the parameters now: ssp and async apply
  // a push on arrival, bsp once its clock is complete.
  bool included_now(const ShardUnderTest& s, std::size_t w, Clock t) const {
    return t < pushed_[w] && (s.rule != Rule::bsp || t < complete());
  }

  void check_read(const ShardUnderTest& s, std::size_t reader, Clock c, const ShardReply& r) {
    EXPECT_TRUE(allowed(s, c)) << "answered worker " << reader << "'s read at clock " << c
                               << " with the slowest live worker at " << complete();
    EXPECT_EQ(r.clock, complete()) << "a reply's clock must be its parameters' complete clock";
    ASSERT_EQ(r.params.size(), size(options_));
    if (!options_.one_hot) return;
    const Clock required = required_below(s, c);
    for (std::size_t w = 0; w < workers_.size(); ++w) {
      for (Clock t = 0; t < options_.clocks[w]; ++t) {
        const bool in = r.params[slot(w, t)] != 0.0f;
        if (t < required) {
          ASSERT_TRUE(in) << "a read at clock " << c << " misses worker " << w << "'s push of clock " << t;
        }
        ASSERT_EQ(in, included_now(s, w, t)) << "worker " << w << "'s push of clock " << t << " in a read at " << c;
      }
    }
  }

  void check() {
    std::size_t waiting = 0;
    for (std::size_t w = 0; w < workers_.size(); ++w) {
      Worker& me = workers_[w];
      if (!me.waiting) continue;
      const Ticket ticket = *me.waiting;
      const bool answered = shards_.front().driver.answered_now(ticket);
      for (auto& s : shards_) {
        ASSERT_EQ(s.driver.answered_now(ticket), answered) << "shards under the same schedule disagree";
        if (answered) {
          check_read(s, w, me.read_clock, s.driver.reply(ticket));
        } else {
          ASSERT_FALSE(allowed(s, me.read_clock)) << "holds worker " << w << "'s read at clock " << me.read_clock
                                                  << " with the slowest live worker at " << complete();
        }
      }
      if (me.fresh && !answered) ++holds_;
      me.fresh = false;
      if (answered) {
        me.waiting.reset();
        me.has_read = true;
        me.base = shards_.front().driver.reply(ticket).clock;
        for (std::size_t k = 1; k < shards_.size(); ++k)
          EXPECT_EQ(shards_[k].driver.reply(ticket).clock, me.base) << "shards under the same schedule disagree";
      } else {
        ++waiting;
      }
    }
    for (const auto& s : shards_) EXPECT_EQ(s.driver.core.held_reads(), waiting);
  }

  void finish() {
    for (const auto& s : shards_) {
      const ShardStats stats = s.driver.core.stats();
      EXPECT_EQ(stats.updates_applied, pushes_);
      EXPECT_EQ(stats.commits, s.rule == Rule::bsp ? max_clocks_ : pushes_) << "bsp: one update per clock";
      EXPECT_EQ(stats.updates_discarded, 0u);
      EXPECT_EQ(stats.rejected, 0u);
      EXPECT_EQ(stats.staleness_histogram, staleness_);
      EXPECT_EQ(s.driver.core.held_reads(), 0u);
      if (options_.one_hot) {
        for (std::size_t w = 0; w < workers_.size(); ++w)
          for (Clock t = 0; t < options_.clocks[w]; ++t)
            EXPECT_NE(s.driver.core.params()[slot(w, t)], 0.0f) << "lost worker " << w << "'s push of clock " << t;
      }
    }
  }

  std::vector<ShardUnderTest> shards_;
  SimOptions options_;
  Rng rng_;
  std::vector<Worker> workers_;
  std::vector<Clock> pushed_;  // per worker: pushes sent (and so received: the shard's clock table)
  std::vector<bool> live_;
  Clock max_clocks_ = 0;
  bool failed_ = false;
  std::uint64_t pushes_ = 0;
  std::uint64_t holds_ = 0;                 // reads a shard held rather than answered at once
  Clock max_lead_ = 0;                      // most clocks a worker got ahead of the slowest live one
  std::vector<std::uint64_t> staleness_;    // clock - base of every push
};

constexpr std::uint64_t kSeeds = 200;
constexpr Clock kClocks = 30;

/// 2 to 4 workers of kClocks steps (of 15 to kClocks when `uneven`), half
/// the time with one straggler, sometimes pulling apart from pushing.
SimOptions random_options(std::uint64_t seed, bool uneven) {
  Rng rng(mix_seed(seed, 0xC10C));
  SimOptions o;
  o.seed = seed;
  const std::size_t n = 2 + rng.below(3);
  for (std::size_t w = 0; w < n; ++w) {
    o.clocks.push_back(uneven ? 15 + rng.below(kClocks - 15 + 1) : kClocks);
    o.speed.push_back(1.0);
  }
  if (rng.below(2) == 1) o.speed[rng.below(n)] = 0.1 + 0.3 * rng.uniform();
  if (rng.below(2) == 1) o.separate_pulls = 0.3;
  return o;
}

struct Totals {
  std::uint64_t holds = 0;
  Clock max_lead = 0;
  std::size_t max_staleness = 0;
};

/// Runs one simulation per seed with a fresh shard under `rule` each time.
Totals simulate(const PolicyConfig& policy, Rule rule, std::uint32_t s, bool uneven) {
  Totals totals;
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed) + ", policy " + policy.name);
    const SimOptions o = random_options(seed, uneven);
    std::vector<ShardUnderTest> shards;
    shards.push_back({rule, s, make_shard(policy, static_cast<std::uint32_t>(o.clocks.size()),
                                          std::vector<float>(Simulation::size(o), 0.0f), 1.0f)});
    Simulation sim(std::move(shards), o);
    sim.run();
    if (::testing::Test::HasFailure()) break;
    totals.holds += sim.holds();
    totals.max_lead = std::max(totals.max_lead, sim.max_lead());
    totals.max_staleness = std::max(totals.max_staleness, sim.staleness().size() - 1);
  }
  return totals;
}

TEST_P(SspStaleness, UnderRandomInterleavingsAnswersReadsExactlyWhenAllowedAndNeverMissesAnUpdateOlderThanCMinusSMinusOne) {
  const std::uint32_t s = GetParam();
  for (bool uneven : {false, true}) {
    const Totals totals = simulate(ssp(s), Rule::ssp, s, uneven);
    EXPECT_GT(totals.holds, 0u) << "the schedules never made a worker wait";
    EXPECT_EQ(totals.max_lead, s + 1) << "workers get s + 1 clocks ahead of the slowest and no further";
  }
}

TEST_P(SspStaleness, EveryUpdateOfWorkersReadingTheirBaseClockFromTheReplyIsAtMostSClocksStale) {
  const std::uint32_t s = GetParam();
  for (std::uint64_t seed = 0; seed < kSeeds; seed += 10) {
    const SimOptions o = random_options(seed, true);
    std::vector<ShardUnderTest> shards;
    shards.push_back({Rule::ssp, s, make_shard(ssp(s), static_cast<std::uint32_t>(o.clocks.size()),
                                               std::vector<float>(Simulation::size(o), 0.0f), 1.0f)});
    Simulation sim(std::move(shards), o);
    sim.run();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "seed " << seed;
    const auto histogram = sim.shards().front().driver.core.stats().staleness_histogram;
    EXPECT_LE(histogram.size(), s + 1) << "seed " << seed;
  }
  // The bound is reached, not only respected.
  EXPECT_EQ(simulate(ssp(s), Rule::ssp, s, false).max_staleness, s);
}

TEST(BspSemantics, UnderRandomInterleavingsAnswersAReadAtClockCOnlyWithEveryPushOfClocksBelowCAndNothingLater) {
  for (bool uneven : {false, true}) {
    const Totals totals = simulate(bsp(), Rule::bsp, 0, uneven);
    EXPECT_GT(totals.holds, 0u);
    EXPECT_EQ(totals.max_lead, 1u) << "a bsp worker is never more than the clock it just pushed ahead";
  }
}

TEST(BspSemantics, EveryUpdateOfRealisticWorkersHasStalenessZero) {
  for (std::uint64_t seed = 0; seed < kSeeds; seed += 10) {
    const SimOptions o = random_options(seed, true);
    std::vector<ShardUnderTest> shards;
    shards.push_back({Rule::bsp, 0, make_shard(bsp(), static_cast<std::uint32_t>(o.clocks.size()),
                                               std::vector<float>(Simulation::size(o), 0.0f), 1.0f)});
    Simulation sim(std::move(shards), o);
    sim.run();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "seed " << seed;
    const ShardStats stats = sim.shards().front().driver.core.stats();
    std::uint64_t pushes = 0;
    for (Clock c : o.clocks) pushes += c;
    EXPECT_EQ(stats.staleness_histogram, (std::vector<std::uint64_t>{pushes})) << "seed " << seed;
  }
}

TEST(AsyncSemantics, UnderRandomInterleavingsAnswersEveryReadAtOnceWithEveryPushReceivedSoFar) {
  for (bool uneven : {false, true}) {
    const Totals totals = simulate(policy_named("async"), Rule::async, 0, uneven);
    EXPECT_EQ(totals.holds, 0u) << "async held a read";
    EXPECT_GT(totals.max_lead, 5u) << "the schedules never let workers drift apart";
  }
}

// ---------------------------------------------------------------------------
// ssp(0) against bsp

TEST(SspZeroVersusBsp, HoldAndAnswerTheSameReadsAtTheSameMomentsOnTheSameSchedule) {
  for (std::uint64_t seed = 0; seed < kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SimOptions o = random_options(seed, seed % 2 == 1);
    const auto n = static_cast<std::uint32_t>(o.clocks.size());
    std::vector<ShardUnderTest> shards;
    shards.push_back({Rule::bsp, 0, make_shard(bsp(), n, std::vector<float>(Simulation::size(o), 0.0f), 1.0f)});
    shards.push_back({Rule::ssp, 0, make_shard(ssp(0), n, std::vector<float>(Simulation::size(o), 0.0f), 1.0f)});
    Simulation sim(std::move(shards), o);  // checks after each event that both answered the same tickets
    sim.run();
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(SspZeroVersusBsp, SspZeroAtLrOverNMatchesBspAtLrAfterEveryClock) {
  constexpr float kLr = 0.1f;
  for (std::uint64_t seed = 0; seed < kSeeds; seed += 4) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    SimOptions o = random_options(seed, false);
    o.one_hot = false;
    const auto n = static_cast<std::uint32_t>(o.clocks.size());
    const std::vector<float> initial = seeded_values(seed, 99, 99, o.dense_size);
    std::vector<ShardUnderTest> shards;
    shards.push_back({Rule::bsp, 0, make_shard(bsp(), n, initial, kLr)});
    shards.push_back({Rule::ssp, 0, make_shard(ssp(0), n, initial, kLr / static_cast<float>(n))});
    Simulation sim(std::move(shards), o);
    Clock compared = 0;
    while (sim.step()) {
      if (sim.complete() == compared || sim.complete() > kClocks) continue;
      compared = sim.complete();
      const auto& b = sim.shards()[0].driver.core;
      const auto& a = sim.shards()[1].driver.core;
      ASSERT_EQ(b.stats().commits, compared);
      for (std::size_t i = 0; i < o.dense_size; ++i)
        ASSERT_NEAR(a.params()[i], b.params()[i], 1e-6) << "after clock " << compared - 1 << ", at " << i;
    }
    ASSERT_FALSE(::testing::Test::HasFailure());
    EXPECT_EQ(compared, kClocks);
  }
}

}  // namespace
}  // namespace asgd
