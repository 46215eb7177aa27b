// The worker's decisions, driven message by message: no actor system, no
// threads, no sleeps; time comes from a manual clock the test advances.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "actors/worker.hpp"
#include "actors/worker_core.hpp"

namespace asgd {
namespace {

namespace act = worker_action;
using Instant = WorkerCore::Instant;
using namespace std::chrono_literals;

constexpr std::size_t kBatch = 4;

// The mlp on 28x28 images; its parameters split over `shards`.
WorkerSetup setup(const std::string& policy, std::size_t shards) {
  WorkerSetup s;
  s.id = 1;
  s.model = "mlp";
  s.sample_shape = {1, 28, 28};
  s.policy.name = policy;
  s.optimizer = {"sgd", 0.05f, 0.0f, 0.0f};
  s.rpc_timeout = 2s;
  auto model = Model::build("mlp", {1, 28, 28}, 10);
  EXPECT_TRUE(model.ok());
  s.ranges = partition_keys(model->num_params(), shards);
  return s;
}

data::Batch batch(std::uint64_t epoch, bool last, float pixel = 0.5f, std::size_t size = kBatch) {
  data::Batch b;
  b.epoch = epoch;
  b.last_in_epoch = last;
  b.size = size;
  b.x.assign(size * 28 * 28, pixel);
  for (std::size_t i = 0; i < size; ++i) b.y.push_back(static_cast<std::int32_t>(i % 10));
  return b;
}

template <class A>
std::size_t count(const WorkerActions& out) {
  std::size_t n = 0;
  for (const auto& a : out) n += std::holds_alternative<A>(a) ? 1 : 0;
  return n;
}

template <class A>
const A* first(const WorkerActions& out) {
  for (const auto& a : out)
    if (const A* x = std::get_if<A>(&a)) return x;
  return nullptr;
}

// A core on a manual clock. Each reading of the clock advances it by
// `tick`, so a computation takes exactly one tick.
struct Driver {
  explicit Driver(const WorkerSetup& s) : ranges(s.ranges) {
    auto c = WorkerCore::make(s, [now = now, tick = tick] {
      const Instant t = *now;
      *now += *tick;
      return t;
    });
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (c.ok()) core.emplace(std::move(c).value());
  }

  std::shared_ptr<Instant> now = std::make_shared<Instant>(Instant{} + 1h);
  std::shared_ptr<Instant::duration> tick = std::make_shared<Instant::duration>(0);
  std::vector<KeyRange> ranges;
  std::optional<WorkerCore> core;
  WorkerActions out;  // what the last call asked for

  // Each call forgets what the previous one asked for.
  template <class F>
  WorkerActions& call(F&& f) {
    out.clear();
    f(*core, out);
    return out;
  }
  WorkerActions& start() {
    return call([](WorkerCore& c, WorkerActions& o) { c.start(o); });
  }
  WorkerActions& feed(data::Batch b) {
    return call([&](WorkerCore& c, WorkerActions& o) { c.batch(std::move(b), o); });
  }
  WorkerActions& step() {
    return call([](WorkerCore& c, WorkerActions& o) { c.step(o); });
  }
  WorkerActions& check() {
    return call([](WorkerCore& c, WorkerActions& o) { c.check_overdue(o); });
  }
  // Shard `shard` answers: `outcome`, with its range's parameters unless
  // `params` is false.
  WorkerActions& answer(std::size_t shard, PushOutcome outcome = PushOutcome::applied, bool params = true,
                        std::size_t size = 0, float value = 0.01f) {
    ShardReply r;
    r.shard = static_cast<std::uint32_t>(shard);
    r.outcome = static_cast<std::uint8_t>(outcome);
    r.clock = core->step();
    r.version = 7;
    if (params) r.params.assign(size ? size : ranges[shard].size(), value);
    return call([&](WorkerCore& c, WorkerActions& o) { c.reply(shard, r, o); });
  }
  // Every shard answers with parameters: the step in flight ends.
  WorkerActions& answer_all(PushOutcome outcome = PushOutcome::applied, float value = 0.01f) {
    WorkerActions all;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      answer(i, outcome, true, 0, value);
      all.insert(all.end(), out.begin(), out.end());
    }
    out = std::move(all);
    return out;
  }
  // Started, with the first pull answered: ready to train.
  void ready(float value = 0.01f) {
    start();
    answer_all(PushOutcome::none, value);
  }
};

TEST(WorkerCore, StartPullsFromEveryShardAsksForABatchAndArmsTheWatchdog) {
  Driver d(setup("async", 2));
  auto& out = d.start();
  ASSERT_EQ(count<act::Pull>(out), 2u);
  EXPECT_EQ(std::get<act::Pull>(out[0]).shard, 0u);
  EXPECT_EQ(std::get<act::Pull>(out[1]).shard, 1u);
  EXPECT_EQ(std::get<act::Pull>(out[1]).request.worker, 1u);
  EXPECT_EQ(count<act::RequestBatch>(out), 1u);
  EXPECT_EQ(count<act::Watch>(out), 1u);
  // The batch arrives before the parameters: nothing is computed yet.
  EXPECT_EQ(count<act::Push>(d.feed(batch(0, false))), 0u);
  d.answer(0);
  EXPECT_TRUE(d.out.empty());
  // The last parameters in: the step ends and the next one computes.
  EXPECT_EQ(count<act::NextStep>(d.answer(1)), 1u);
  auto& step = d.step();
  EXPECT_EQ(count<act::Push>(step), 2u);
  EXPECT_EQ(count<act::RequestBatch>(step), 1u);  // the feeder prepares the next one meanwhile
}

TEST(WorkerCore, AStepPushesEachShardItsSliceOfTheGradientTaggedWithItsClock) {
  Driver d(setup("async", 3));
  d.ready();
  auto& out = d.feed(batch(0, false));
  ASSERT_EQ(count<act::Push>(out), 3u);
  std::size_t i = 0;
  for (const auto& a : out) {
    const auto* p = std::get_if<act::Push>(&a);
    if (!p) continue;
    EXPECT_EQ(p->shard, i);
    EXPECT_EQ(p->request.payload.size(), d.ranges[i].size());
    EXPECT_EQ(p->request.clock, 0u);
    EXPECT_EQ(p->request.samples, kBatch);
    EXPECT_EQ(p->request.base_version, 7u);  // the version of the parameters it was computed on
    EXPECT_TRUE(p->request.want_params);
    ++i;
  }
  EXPECT_EQ(d.core->step(), 1u);
}

TEST(WorkerCore, TheLastBatchOfAnEpochIsReportedOnceEveryShardAnswered) {
  Driver d(setup("async", 2));
  *d.tick = 1ms;
  d.ready();
  d.feed(batch(0, false));
  d.answer_all();
  d.step();
  d.feed(batch(0, true));
  EXPECT_EQ(count<act::Report>(d.answer(0)), 0u);
  auto& out = d.answer(1);
  const auto* report = first<act::Report>(out);
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->report.worker, 1u);
  EXPECT_EQ(report->report.epoch, 0u);
  EXPECT_EQ(report->report.samples, 2 * kBatch);
  EXPECT_EQ(report->report.batches, 2u);
  EXPECT_EQ(report->report.updates, 2u);
  EXPECT_NEAR(report->report.compute_s, 0.002, 1e-9);  // one tick per computation
  EXPECT_GT(report->report.loss_sum, 0.0);
  const auto* progress = first<act::Progress>(out);
  ASSERT_NE(progress, nullptr);
  EXPECT_EQ(progress->progress.clock, 2u);
  EXPECT_EQ(progress->progress.samples, 2 * kBatch);
  EXPECT_EQ(count<act::NextStep>(out), 1u);
  // The next epoch's counts start from zero; the job's keep adding up.
  EXPECT_EQ(d.core->report().samples, 0u);
  EXPECT_EQ(d.core->progress().samples, 2 * kBatch);
}

TEST(WorkerCore, TenNonFiniteLossesInARowFailTheJobAsDivergedAndEachPushesOnlyAClockTick) {
  // Parameters that are NaN make every loss NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Driver d(setup("async", 1));
  d.ready(nan);
  // A step on NaN parameters; the shard answers with `next` ones.
  auto nan_step = [&](float next) {
    auto& out = d.feed(batch(0, false));
    const auto* p = first<act::Push>(out);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p->request.payload.empty());  // a tick: synchronous policies do not wait for us
    EXPECT_EQ(p->request.samples, 0u);
    d.answer(0, PushOutcome::applied, true, 0, next);
    d.step();
  };
  for (int i = 0; i < 8; ++i) nan_step(nan);
  nan_step(0.01f);
  EXPECT_EQ(d.core->report().dropped_batches, 9u);
  d.feed(batch(0, false));  // one finite loss resets the streak
  d.answer(0, PushOutcome::applied, true, 0, nan);
  d.step();
  for (int i = 0; i < 9; ++i) nan_step(nan);
  EXPECT_FALSE(d.core->finished());
  EXPECT_EQ(d.core->report().dropped_batches, 18u);
  auto& out = d.feed(batch(0, false));
  const auto* fail = first<act::Fail>(out);
  ASSERT_NE(fail, nullptr);
  EXPECT_EQ(fail->code, StatusCode::diverged);
  EXPECT_NE(fail->message.find("worker 1: the loss was nan for 10 steps in a row"), std::string::npos)
      << fail->message;
  EXPECT_TRUE(d.core->finished());
}

// Epochs of one step (a batch as large as the worker's share): ten in a
// row would be ten epochs; every step of two epochs is as clear.
TEST(WorkerCore, EveryLossOfTwoShortEpochsNonFiniteFailsTheJobAsDiverged) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Driver d(setup("async", 1));
  d.ready(nan);
  auto& first_epoch = d.feed(batch(0, true));
  EXPECT_EQ(first<act::Fail>(first_epoch), nullptr) << "one epoch of one bad batch is not yet divergence";
  d.answer(0, PushOutcome::applied, true, 0, nan);
  d.step();
  auto& out = d.feed(batch(1, true));
  const auto* fail = first<act::Fail>(out);
  ASSERT_NE(fail, nullptr);
  EXPECT_EQ(fail->code, StatusCode::diverged);
  EXPECT_NE(fail->message.find("the loss was nan for 2 steps in a row (up to step 1: every step of two epochs)"),
            std::string::npos)
      << fail->message;
}

TEST(WorkerCore, ARejectedPushFailsTheJobNamingTheShard) {
  Driver d(setup("async", 2));
  d.ready();
  d.feed(batch(0, false));
  const auto* fail = first<act::Fail>(d.answer(1, PushOutcome::rejected, false));
  ASSERT_NE(fail, nullptr);
  EXPECT_EQ(fail->code, StatusCode::internal);
  EXPECT_NE(fail->message.find("shard 1 rejected our push at step 1"), std::string::npos) << fail->message;
  // Finished: later replies ask for nothing.
  EXPECT_TRUE(d.answer(0).empty());
}

TEST(WorkerCore, ParametersOfTheWrongSizeFailTheJob) {
  Driver d(setup("async", 2));
  d.start();
  const auto* fail = first<act::Fail>(d.answer(0, PushOutcome::none, true, 3));
  ASSERT_NE(fail, nullptr);
  EXPECT_EQ(fail->code, StatusCode::internal);
  EXPECT_NE(fail->message.find("shard 0 sent 3 parameters for a range of"), std::string::npos) << fail->message;
}

TEST(WorkerCore, AReplyThatClaimsAnotherShardOrWasNotAskedForFailsTheJob) {
  {
    Driver d(setup("async", 2));
    d.start();
    ShardReply r;
    r.shard = 1;
    r.params.assign(d.ranges[0].size(), 0.0f);
    d.call([&](WorkerCore& c, WorkerActions& o) { c.reply(0, r, o); });
    const auto* fail = first<act::Fail>(d.out);
    ASSERT_NE(fail, nullptr);
    EXPECT_NE(fail->message.find("a reply from shard 0 claims to come from shard 1"), std::string::npos);
  }
  {
    Driver d(setup("async", 2));
    d.ready();
    const auto* fail = first<act::Fail>(d.answer(0));  // no request is in flight
    ASSERT_NE(fail, nullptr);
    EXPECT_NE(fail->message.find("an unexpected reply from shard 0"), std::string::npos) << fail->message;
  }
}

TEST(WorkerCore, TheWatchdogNamesTheShardsThatDidNotAnswerInTime) {
  Driver d(setup("ssp:3", 3));
  d.ready();
  d.feed(batch(0, false));
  d.answer(1);
  *d.now += 1s;
  const auto* watch = first<act::Watch>(d.check());
  ASSERT_NE(watch, nullptr);  // within --rpc-timeout: look again later
  EXPECT_EQ(watch->after, std::chrono::duration_cast<Instant::duration>(500ms));
  *d.now += 1500ms;
  const auto* fail = first<act::Fail>(d.check());
  ASSERT_NE(fail, nullptr);
  EXPECT_EQ(fail->code, StatusCode::timeout);
  EXPECT_NE(fail->message.find("no reply from shard(s) 0, 2 within 2 s (--rpc-timeout) at step 1 under policy ssp"),
            std::string::npos)
      << fail->message;
  EXPECT_NE(fail->message.find("holds a read until the slowest worker catches up"), std::string::npos);
}

TEST(WorkerCore, AnOverdueBatchFailsTheJobNamingTheFeeder) {
  Driver d(setup("async", 1));
  d.ready();  // asked for the first batch; the feeder never answers
  *d.now += 3s;
  const auto* fail = first<act::Fail>(d.check());
  ASSERT_NE(fail, nullptr);
  EXPECT_NE(fail->message.find("no batch from the data feeder within 2 s (--rpc-timeout) at step 0"),
            std::string::npos)
      << fail->message;
}

TEST(WorkerCore, AStragglerWaitsOnATimerBetweenComputingAndPushing) {
  WorkerSetup s = setup("async", 1);
  s.straggler.factor = 3.0;
  Driver d(s);
  *d.tick = 1ms;
  d.ready();
  auto& out = d.feed(batch(0, false));
  EXPECT_EQ(count<act::Push>(out), 0u);
  const auto* delay = first<act::Delay>(out);
  ASSERT_NE(delay, nullptr);
  EXPECT_EQ(delay->after, std::chrono::duration_cast<Instant::duration>(2ms));  // (3 - 1) x one tick of compute
  EXPECT_TRUE(d.step().empty());  // still straggling: no second step
  EXPECT_EQ(count<act::Push>(d.call([](WorkerCore& c, WorkerActions& o) { c.resume(o); })), 1u);
}

// The batch asked for before a step is timed from the step's end: a step
// (here a straggler's delay) longer than --rpc-timeout must not time out a
// feeder whose reply waits in the mailbox. Found under ASan, where a
// resnet18 step took longer than 60 s.
TEST(WorkerCore, ABatchAskedForBeforeALongStepIsTimedFromTheStepsEnd) {
  WorkerSetup s = setup("async", 1);
  s.straggler.factor = 3.0;
  Driver d(s);
  *d.tick = 1ms;
  d.ready();
  ASSERT_NE(first<act::Delay>(d.feed(batch(0, false))), nullptr);  // asked for the next batch, then waits
  *d.now += 10s;  // far past --rpc-timeout (2 s)
  d.call([](WorkerCore& c, WorkerActions& o) { c.resume(o); });
  d.answer_all();
  EXPECT_EQ(first<act::Fail>(d.check()), nullptr);
  *d.now += 3s;  // the feeder still silent: now it is overdue
  const auto* fail = first<act::Fail>(d.check());
  ASSERT_NE(fail, nullptr);
  EXPECT_NE(fail->message.find("no batch from the data feeder"), std::string::npos) << fail->message;
}

// A transient straggler (random:P:F) waits exactly at the steps its seed
// picks, F - 1 ticks of compute each time.
TEST(WorkerCore, ARandomStragglerWaitsAtTheStepsItsSeedPicks) {
  WorkerSetup s = setup("async", 1);
  s.straggler = parse_stragglers("random:0.3:3", 2, 11).value()[1];
  Driver d(s);
  *d.tick = 1ms;
  d.ready();
  std::size_t waited = 0;
  for (std::uint64_t step = 1; step <= 40; ++step) {
    auto& out = d.feed(batch(0, false));
    const auto* delay = first<act::Delay>(out);
    ASSERT_EQ(delay != nullptr, s.straggler.random_hit(step)) << "step " << step;
    if (delay) {
      ++waited;
      EXPECT_EQ(delay->after, std::chrono::duration_cast<Instant::duration>(2ms));
      d.call([](WorkerCore& c, WorkerActions& o) { c.resume(o); });
    }
    d.answer(0);
    d.step();
  }
  EXPECT_GT(waited, 0u);
  EXPECT_LT(waited, 40u);
}

TEST(WorkerCore, OutOfDataUnderAveragingPushesTheLastPartialRoundThenLeaves) {
  WorkerSetup s = setup("averaging", 1);
  s.policy.options["local-steps"] = 4;
  Driver d(s);
  d.ready();
  for (int i = 0; i < 2; ++i) {  // two local steps: no push yet
    EXPECT_EQ(count<act::Push>(d.feed(batch(0, false))), 0u);
    d.step();
  }
  EXPECT_EQ(d.core->report().local_updates, 2u);
  auto& out = d.feed(batch(0, false, 0.0f, 0));  // every epoch done
  const auto* push = first<act::Push>(out);
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(push->request.clock, 3u);  // the round's end: it joins the others' average
  EXPECT_FALSE(push->request.want_params);
  EXPECT_EQ(push->request.samples, 2 * kBatch);
  EXPECT_EQ(count<act::Leave>(d.answer(0, PushOutcome::aggregated, false)), 1u);
  EXPECT_TRUE(d.core->finished());
}

// Downpour's n_push past the steps it had: the summed gradients go at the
// end tagged with the clock of their last step, not with the far later one
// the plan would have pushed at (which made them count 99999 clocks stale).
TEST(WorkerCore, OutOfDataUnderAsyncPushesTheSummedGradientsAtTheirLastStepsClock) {
  WorkerSetup s = setup("async", 1);
  s.policy.options["push-every"] = 100000;
  s.policy.options["fetch-every"] = 100000;
  Driver d(s);
  d.ready();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(count<act::Push>(d.feed(batch(0, false))), 0u);
    d.step();
  }
  auto& out = d.feed(batch(0, false, 0.0f, 0));  // every epoch done
  const auto* push = first<act::Push>(out);
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(push->request.clock, 2u);  // steps 0, 1, 2
  EXPECT_EQ(push->request.samples, 3 * kBatch);
}

TEST(WorkerCore, OutOfDataWithEverythingPushedLeavesAtOnce) {
  Driver d(setup("async", 2));
  d.ready();
  d.feed(batch(0, true));
  d.answer_all();
  d.step();
  auto& out = d.feed(batch(0, false, 0.0f, 0));
  EXPECT_EQ(count<act::Push>(out), 0u);
  EXPECT_EQ(count<act::Leave>(out), 1u);
}

// Its feeder stopped mid-epoch (--stop-at-target): what it did of the
// epoch is reported, then it leaves.
TEST(WorkerCore, StoppedMidEpochItReportsWhatItDidOfTheEpochThenLeaves) {
  Driver d(setup("async", 2));
  d.ready();
  for (int i = 0; i < 2; ++i) {
    d.feed(batch(0, false));
    d.answer_all();
    d.step();
  }
  auto& out = d.feed(batch(0, false, 0.0f, 0));  // the feeder serves no more
  std::size_t report_at = out.size(), leave_at = out.size();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::holds_alternative<act::Report>(out[i])) report_at = i;
    if (std::holds_alternative<act::Leave>(out[i])) leave_at = i;
  }
  ASSERT_LT(leave_at, out.size());
  ASSERT_LT(report_at, leave_at) << "reported before it leaves";
  const EpochReport& r = std::get<act::Report>(out[report_at]).report;
  EXPECT_EQ(r.epoch, 0u);
  EXPECT_EQ(r.batches, 2u);
  EXPECT_EQ(r.samples, 2 * kBatch);
  EXPECT_EQ(r.updates, 2u);
}

TEST(WorkerCore, HogwildUpdatesTheSharedBufferAndCountsItsStaleness) {
  WorkerSetup s = setup("hogwild", 1);
  auto model = Model::build("mlp", {1, 28, 28}, 10);
  ASSERT_TRUE(model.ok());
  model->init_params(3);
  s.shared = std::make_shared<SharedParameters>(
      std::vector<float>(model->params().begin(), model->params().end()), 2);
  s.shared->clocks[0].store(0);  // worker 0 has not stepped yet
  const std::vector<float> before = s.shared->values;
  Driver d(s);
  EXPECT_EQ(count<act::Pull>(d.start()), 0u);  // nothing to fetch
  auto& out = d.feed(batch(0, false));
  EXPECT_EQ(count<act::Push>(out), 0u);
  EXPECT_EQ(count<act::NextStep>(out), 1u);
  EXPECT_NE(s.shared->values, before);
  EXPECT_EQ(s.shared->clocks[1].load(), 1u);
  d.step();
  d.feed(batch(0, false));
  // The second step's view was one clock ahead of worker 0's.
  EXPECT_EQ(d.core->report().staleness_histogram, (std::vector<std::uint64_t>{1, 1}));
  EXPECT_EQ(d.core->report().updates, 2u);
  d.step();
  EXPECT_EQ(count<act::Leave>(d.feed(batch(0, false, 0.0f, 0))), 1u);
  EXPECT_FALSE(s.shared->live[1].load());
}

TEST(WorkerCore, ABadDeviceOrAPolicyWithoutItsSharedBufferIsRefusedAtConstruction) {
  WorkerSetup s = setup("async", 1);
  s.device = "tpu";
  auto core = WorkerCore::make(s);
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(core.status().message().find("cannot compute on tpu"), std::string::npos) << core.status().message();

  auto hogwild = WorkerCore::make(setup("hogwild", 1));
  ASSERT_FALSE(hogwild.ok());
  EXPECT_NE(hogwild.status().message().find("needs the parameter buffer every worker of this process shares"),
            std::string::npos);
}

}  // namespace
}  // namespace asgd
