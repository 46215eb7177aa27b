// The coordinator's decisions, driven message by message: no actor system,
// no threads, no sleeps; the time of every message is passed in.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "actors/coordinator_core.hpp"
#include "captured_log.hpp"

namespace asgd {
namespace {

namespace act = coordinator_action;
using Instant = CoordinatorCore::Instant;

// Seconds into the test's timeline (never the clock's epoch: that means
// "not started").
Instant at(double s) {
  return Instant{} + std::chrono::hours(1) +
         std::chrono::duration_cast<Instant::duration>(std::chrono::duration<double>(s));
}

JobConfig config(std::uint32_t workers, std::uint32_t epochs) {
  JobConfig c;
  c.workers = workers;
  c.epochs = epochs;
  c.batch = 10;
  c.policy = "bsp";
  return c;
}

// A core for `c`, planned for 1000 parameters and 600 training samples,
// training from t = 0.
struct Driver {
  explicit Driver(const JobConfig& c) : core(c, plan(c), "synthetic") {
    core.start_training(at(0), out);
  }
  static JobPlan plan(const JobConfig& c) {
    auto p = plan_job(c, JobFacts{1000, 600, 10, {1, 28, 28}, Placement::one_process, 4});
    EXPECT_TRUE(p.ok()) << p.status().message();
    return p.ok() ? std::move(p).value() : JobPlan{};
  }

  CoordinatorCore core;
  CoordinatorActions out;  // what the last call asked for

  // Each call forgets what the previous one asked for.
  CoordinatorActions& report(std::uint32_t w, std::uint64_t epoch, double t, std::uint64_t samples = 100,
                             double loss_sum = 50.0) {
    EpochReport r;
    r.worker = w;
    r.epoch = epoch;
    r.samples = samples;
    r.batches = samples / 10;
    r.loss_sum = loss_sum;
    r.updates = r.batches;
    return call([&](CoordinatorActions& o) { core.report(r, at(t), o); });
  }
  CoordinatorActions& progress(std::uint32_t w, std::uint64_t epoch, std::uint64_t samples, double t) {
    WorkerProgress p;
    p.worker = w;
    p.epoch = epoch;
    p.samples = samples;
    out.clear();
    core.progress(p, at(t));
    return out;
  }
  CoordinatorActions& evaluated(double accuracy, double t, std::optional<std::uint64_t> applied = std::nullopt) {
    return call([&](CoordinatorActions& o) { core.evaluated(accuracy, applied, at(t), o); });
  }
  CoordinatorActions& tick(double t) {
    return call([&](CoordinatorActions& o) { core.eval_tick(at(t), o); });
  }
  CoordinatorActions& finished(std::uint32_t w) {
    return call([&](CoordinatorActions& o) { core.worker_finished(w, o); });
  }
  CoordinatorActions& lost(std::uint32_t w) {
    return call([&](CoordinatorActions& o) { core.worker_lost(w, "went silent", o); });
  }
  CoordinatorActions& rejoin(std::uint32_t w, bool placeable = true) {
    return call([&](CoordinatorActions& o) { core.rejoin(w, placeable, o); });
  }
  CoordinatorActions& cancel() {
    return call([&](CoordinatorActions& o) { core.cancel(o); });
  }

  template <class F>
  CoordinatorActions& call(F&& f) {
    out.clear();
    f(out);
    return out;
  }
};

template <class A>
std::vector<A> all(const CoordinatorActions& out) {
  std::vector<A> found;
  for (const auto& a : out)
    if (const A* x = std::get_if<A>(&a)) found.push_back(*x);
  return found;
}
template <class A>
std::size_t count(const CoordinatorActions& out) {
  return all<A>(out).size();
}
template <class A>
A only(const CoordinatorActions& out) {
  const auto found = all<A>(out);
  EXPECT_EQ(found.size(), 1u);
  return found.empty() ? A{} : found.front();
}

// ---- membership ----------------------------------------------------------------

TEST(CoordinatorCore, AWorkerLostMidEpochLeavesTheShardsAndTheEpochCompletesWithoutIt) {
  Driver d(config(3, 2));
  d.report(0, 0, 1.0);
  EXPECT_EQ(count<act::Evaluate>(d.report(1, 0, 1.5)), 0u) << "worker 2 has not reported epoch 1";

  const auto& out = d.lost(2);
  EXPECT_EQ(only<act::Leave>(out).worker, 2u) << "the shards stop waiting for it";
  EXPECT_EQ(count<act::Evaluate>(out), 1u) << "epoch 1 is complete without it";
  EXPECT_TRUE(d.core.members().lost(2));
  EXPECT_EQ(d.core.members().stopped(), 1u);

  const EpochMetrics m = only<act::EpochDone>(d.evaluated(0.9, 2.0)).metrics;
  EXPECT_EQ(m.epoch, 1u);
  EXPECT_DOUBLE_EQ(m.wall_s, 1.5) << "it ended with the last report it got, not when the loss was noticed";
  EXPECT_DOUBLE_EQ(m.train_loss, 0.5);

  // Its late report no longer counts; the next epoch needs only the others.
  d.report(2, 1, 2.1);
  d.report(0, 1, 3.0);
  EXPECT_EQ(count<act::Evaluate>(d.report(1, 1, 3.5)), 1u);
  EXPECT_EQ(only<act::EpochDone>(d.evaluated(0.95, 4.0)).metrics.epoch, 2u);
  d.finished(0);
  const auto& last = d.finished(1);
  EXPECT_EQ(count<act::Finish>(last), 1u);
  const JobSummary s = d.core.finished(0.96, {});
  EXPECT_EQ(s.workers_lost, 1u);
  EXPECT_EQ(s.updates_applied, 10u + 10u + 10u + 10u) << "the lost worker's epoch-1 report is not counted";
}

TEST(CoordinatorCore, ALostWorkersSecondLossAndAFinishedWorkersLossChangeNothing) {
  Driver d(config(3, 2));
  d.lost(1);
  EXPECT_TRUE(d.lost(1).empty());
  d.finished(0);
  EXPECT_TRUE(d.lost(0).empty()) << "worker 0 had already finished";
  EXPECT_EQ(d.core.members().stopped(), 2u);
  EXPECT_EQ(d.core.members().lost_count(), 1u);
}

TEST(CoordinatorCore, AWorkerWhoseProcessEndedIsKilledAndTheJobGoesOnWithoutIt) {
  Driver d(config(3, 2));
  const auto& out = d.call([&](CoordinatorActions& o) { d.core.worker_gone(1, "its process exited", o); });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(std::get<act::Kill>(out[0]).worker, 1u) << "no waiting for its heartbeat to time out";
  EXPECT_EQ(std::get<act::Leave>(out[1]).worker, 1u);
  EXPECT_TRUE(d.call([&](CoordinatorActions& o) { d.core.worker_gone(1, "again", o); }).empty());
}

// A worker whose process ended while the job was being placed (before
// training began) was not lost until its heartbeats had been missed for
// --join-timeout (60 s): the other workers waited at bsp's barrier so long.
TEST(CoordinatorCore, AWorkerWhoseProcessEndedBeforeTrainingBeganIsLostWhenItBegins) {
  const JobConfig c = config(3, 2);
  CoordinatorCore core(c, Driver::plan(c), "synthetic");
  CoordinatorActions out;
  core.worker_gone(1, "worker 1 (pid 7) was killed by signal 9", out);
  EXPECT_TRUE(out.empty()) << "nothing to do before training";
  core.start_training(at(0), out);
  ASSERT_GE(out.size(), 2u);
  EXPECT_EQ(std::get<act::Kill>(out[0]).worker, 1u);
  EXPECT_EQ(std::get<act::Leave>(out[1]).worker, 1u);
  EXPECT_TRUE(core.members().lost(1));
  EXPECT_EQ(core.members().lost_count(), 1u);
}

// ---- live status -----------------------------------------------------------------

TEST(CoordinatorCore, TheLiveStatusShowsTheSlowestWorkersEpochTheRateAndEachWorkersState) {
  Driver d(config(3, 2));  // 600 samples a epoch: 1200 in all
  d.progress(0, 1, 300, 1.0);
  d.progress(1, 0, 100, 1.5);
  d.progress(1, 0, 50, 1.8);  // late: counts only grow
  d.progress(2, 1, 200, 1.0);
  d.lost(2);
  const Progress p = d.core.tick(at(2.0));
  EXPECT_EQ(p.epoch, 1u) << "worker 1, the slowest, is in epoch 1";
  EXPECT_EQ(p.samples, 600u);
  // Worker 2's share ends where it was lost (200 of its 400): the job's
  // progress reaches 1 at its end, and the time left counts none of it.
  EXPECT_EQ(p.total_samples, 1000u);
  EXPECT_DOUBLE_EQ(p.samples_per_s, 300.0);
  EXPECT_DOUBLE_EQ(p.eta_s.value_or(-1.0), 400.0 * 2.0 / 600.0);

  LiveSnapshot snap;
  d.core.fill_live(snap, p, at(2.0));
  EXPECT_EQ(snap.state, "training");
  ASSERT_EQ(snap.worker.size(), 3u);
  EXPECT_DOUBLE_EQ(snap.worker[1].last_seen_s, 0.5);
  EXPECT_EQ(snap.worker[1].samples, 100u);
  EXPECT_TRUE(snap.worker[0].alive);
  EXPECT_FALSE(snap.worker[2].alive);
  EXPECT_DOUBLE_EQ(snap.progress, 0.6);

  d.finished(1);
  EXPECT_EQ(d.core.tick(at(3.0)).epoch, 2u) << "a finished worker holds no one back";
}

// ---- epochs --------------------------------------------------------------------

TEST(CoordinatorCore, AnEpochIsNotCompleteUntilTheStragglerReportsEvenWhenOthersAreAhead) {
  Driver d(config(3, 3));
  // Workers 1 and 2 finish epochs 1 and 2 before the straggler, worker 0,
  // finishes epoch 1: reports arrive out of epoch order.
  for (double t : {1.0, 2.0}) {
    EXPECT_TRUE(d.report(1, static_cast<std::uint64_t>(t - 1), t).empty());
    EXPECT_TRUE(d.report(2, static_cast<std::uint64_t>(t - 1), t + 0.1).empty());
  }
  EXPECT_EQ(d.core.epochs().epoch(0)->complete, false);

  EXPECT_EQ(count<act::Evaluate>(d.report(0, 0, 5.0, 100, 80.0)), 1u) << "epoch 1 is complete, epoch 2 still waits";
  EXPECT_FALSE(d.core.epochs().epoch(1)->complete);
  // Its epoch-2 report arrives while epoch 1 is being evaluated: one at a time.
  EXPECT_TRUE(d.report(0, 1, 6.0).empty());
  EXPECT_TRUE(d.core.epochs().epoch(1)->complete);

  const auto& after_first = d.evaluated(0.8, 6.5);
  const EpochMetrics first = only<act::EpochDone>(after_first).metrics;
  EXPECT_EQ(first.epoch, 1u);
  EXPECT_DOUBLE_EQ(first.wall_s, 5.0) << "the epoch ended with the straggler's report";
  EXPECT_DOUBLE_EQ(first.samples_per_s, 300.0 / 5.0);
  EXPECT_DOUBLE_EQ(first.train_loss, (50.0 + 50.0 + 80.0) / 300.0);
  EXPECT_EQ(count<act::Evaluate>(after_first), 1u) << "then epoch 2, queued meanwhile";

  const EpochMetrics second = only<act::EpochDone>(d.evaluated(0.85, 7.0)).metrics;
  EXPECT_EQ(second.epoch, 2u);
  EXPECT_DOUBLE_EQ(second.wall_s, 6.0);
  EXPECT_DOUBLE_EQ(second.samples_per_s, 300.0 / 1.0);
  EXPECT_EQ(second.updates, 60u) << "cumulative";
}

TEST(CoordinatorCore, AnEpochsRateNeverExceedsWhatItsBusiestWorkerTrained) {
  // One step per epoch: epoch 2's report comes a microsecond after epoch
  // 1's, but its worker spent 10 ms on it.
  Driver d(config(1, 2));
  auto report = [&](std::uint64_t epoch, double t) {
    EpochReport r;
    r.epoch = epoch;
    r.samples = 100;
    r.batches = 1;
    r.compute_s = 0.008;
    r.comm_s = 0.001;
    r.data_wait_s = 0.001;
    return d.call([&](CoordinatorActions& o) { d.core.report(r, at(t), o); });
  };
  report(0, 1.0);
  report(1, 1.000001);
  EXPECT_DOUBLE_EQ(only<act::EpochDone>(d.evaluated(0.5, 1.1)).metrics.samples_per_s, 100.0 / 1.0);
  EXPECT_NEAR(only<act::EpochDone>(d.evaluated(0.6, 1.2)).metrics.samples_per_s, 100.0 / 0.010, 1e-6)
      << "not 100 samples in a microsecond";
}

// A finite loss far above a uniform guess's ran to the end without a word.
TEST(CoordinatorCore, AnEpochWhoseLossIsFarAboveAGuesssIsWarnedOf) {
  asgd_test::CapturedLog log;
  Driver d(config(2, 2));
  d.report(0, 0, 1.0, 100, 50.0);  // loss 0.5
  d.report(1, 0, 1.0, 100, 50.0);
  d.evaluated(0.9, 1.5);
  EXPECT_EQ(log.count("the job is likely diverging"), 0u) << log.all();
  d.report(0, 1, 2.0, 100, 1e6);  // loss 1e4, against ln 10 = 2.30
  d.report(1, 1, 2.0, 100, 1e6);
  d.evaluated(0.1, 2.5);
  EXPECT_EQ(log.count("epoch 2: training loss 1e+04, over 100 times a uniform guess's (2.30)"), 1u) << log.all();
}

TEST(CoordinatorCore, AnEpochWhoseEveryBatchWasDroppedHasNoLossNotZero) {
  Driver d(config(1, 1));
  const auto report = [&](std::uint64_t dropped) -> CoordinatorActions& {
    EpochReport r;
    r.epoch = 0;
    r.samples = 100;
    r.batches = 2;
    r.dropped_batches = 2;
    r.dropped_samples = dropped;
    r.loss_sum = 0.0;
    return d.call([&](CoordinatorActions& o) { d.core.report(r, at(1.0), o); });
  };
  report(100);
  EXPECT_TRUE(std::isnan(only<act::EpochDone>(d.evaluated(0.1, 1.1)).metrics.train_loss))
      << "a loss of 0 read as a perfect fit";
}

TEST(CoordinatorCore, CurvesCountTheUpdatesInTheEvaluatedParameters) {
  // Workers report 20 updates an epoch; the shards' snapshot held 35 when
  // it was read (pushes applied after the workers' last report).
  JobConfig c = config(1, 2);
  c.eval_every_s = 1.0;
  Driver d(c);
  d.progress(0, 0, 40, 0.9);
  d.tick(1.0);
  EXPECT_EQ(only<act::PointDone>(d.evaluated(0.7, 1.1, 17)).point.updates, 17u);
  d.report(0, 0, 2.0);
  EXPECT_EQ(only<act::EpochDone>(d.evaluated(0.8, 2.1, 35)).metrics.updates, 35u);
  d.report(0, 1, 3.0);
  EXPECT_EQ(only<act::EpochDone>(d.evaluated(0.9, 3.1)).metrics.updates, 20u)
      << "without a count from the shards (hogwild's shared buffer): the workers' reports, cumulative";
}

// ---- evaluation timing -----------------------------------------------------------

TEST(CoordinatorCore, AnEvalPointIsDueExactlyWhenThePeriodHasPassedNotBefore) {
  JobConfig c = config(2, 3);
  c.eval_every_s = 2.0;
  Driver d(c);
  EXPECT_EQ(only<act::ArmEval>(d.out).after, std::chrono::seconds(2)) << "armed when training starts";

  d.progress(0, 0, 40, 1.0);
  const auto& early = d.call([&](CoordinatorActions& o) { d.core.eval_tick(at(2.0) - std::chrono::nanoseconds(1), o); });
  EXPECT_EQ(count<act::Evaluate>(early), 0u) << "a nanosecond before the period has passed";
  EXPECT_EQ(only<act::ArmEval>(early).after, std::chrono::nanoseconds(1)) << "a timer that fired early waits the rest";

  const auto& due = d.tick(2.0);
  EXPECT_EQ(count<act::Evaluate>(due), 1u);
  EXPECT_EQ(only<act::ArmEval>(due).after, std::chrono::seconds(2));
  const EvalPoint p = only<act::PointDone>(d.evaluated(0.7, 2.5)).point;
  EXPECT_DOUBLE_EQ(p.wall_s, 2.0) << "when the parameters were read, not when the evaluation ended";
  EXPECT_DOUBLE_EQ(p.val_accuracy, 0.7);
  EXPECT_EQ(p.samples, 40u);

  EXPECT_EQ(count<act::Evaluate>(d.tick(3.9)), 0u) << "the next is due at 4 s";
  EXPECT_EQ(count<act::Evaluate>(d.tick(4.0)), 1u);
}

TEST(CoordinatorCore, EveryEpochIsEvaluatedAndAnEvalPointDuringItsEvaluationIsSkipped) {
  JobConfig c = config(1, 2);
  c.eval_every_s = 1.0;
  Driver d(c);
  EXPECT_EQ(count<act::Evaluate>(d.report(0, 0, 0.5)), 1u) << "each completed epoch is evaluated";
  const auto& during = d.tick(1.0);
  EXPECT_EQ(count<act::Evaluate>(during), 0u) << "an epoch's evaluation is under way";
  EXPECT_EQ(count<act::ArmEval>(during), 1u) << "the next point is still armed";
  EXPECT_EQ(only<act::EpochDone>(d.evaluated(0.9, 1.2)).metrics.epoch, 1u);
  EXPECT_EQ(count<act::Evaluate>(d.tick(2.0)), 1u);
  EXPECT_EQ(count<act::PointDone>(d.evaluated(0.91, 2.1)), 1u);

  d.report(0, 1, 2.5);
  d.evaluated(0.92, 2.6);
  EXPECT_TRUE(d.tick(3.0).empty()) << "the last epoch is evaluated: no more points, no more timers";
  EXPECT_EQ(d.core.last_val_accuracy().value_or(0.0), 0.92);
}

// ---- rejoin ----------------------------------------------------------------------

TEST(CoordinatorCore, ALostWorkerRejoinsAtTheEpochAfterTheFurthestLiveWorkers) {
  Driver d(config(3, 4));
  d.progress(0, 1, 200, 1.0);  // worker 0 trains epoch 2
  d.lost(2);
  const auto place = only<act::Place>(d.rejoin(2));
  EXPECT_EQ(place.worker, 2u);
  EXPECT_EQ(place.first_epoch, 2u);
  EXPECT_EQ(count<act::Kill>(d.out), 0u) << "its old process is already gone";

  const auto join = only<act::Join>(d.call([&](CoordinatorActions& o) { d.core.rejoined(2, 2, o); }));
  EXPECT_EQ(join.clock, 2 * d.core.plan().workers[2].steps_per_epoch) << "the first step of its first epoch";
  EXPECT_FALSE(d.core.members().lost(2));
  EXPECT_EQ(d.core.members().rejoined(), 1u);
  EXPECT_EQ(d.core.members().stopped(), 0u);
  // Its epochs 1 and 2 are skipped: the live total (progress, eta) plans
  // 2 of its 4 epochs (it stopped short of 1 before).
  EXPECT_EQ(d.core.tick(at(1.2)).total_samples, 800u + 800u + 400u);

  const auto& confirmed = d.call([&](CoordinatorActions& o) { d.core.rejoin_confirmed(2, 2, at(1.5), o); });
  EXPECT_EQ(only<act::StartWorker>(confirmed).first_epoch, 2u);
  EXPECT_EQ(only<act::Record>(confirmed).record["event"], "worker_rejoined");

  // Epochs before its first are not awaited from it.
  d.report(0, 0, 2.0);
  EXPECT_EQ(count<act::Evaluate>(d.report(1, 0, 2.1)), 1u);
}

// The live totals (/status, asgd_samples_total) count on from the lost
// process's samples when a new one starts from zero: they went back before,
// and the rate wrapped to 3.7e19 samples/s.
TEST(CoordinatorCore, TheLiveTotalsNeverGoBackWhenANewProcessTakesALostWorkersPlace) {
  Driver d(config(2, 4));
  d.progress(0, 1, 400, 1.0);
  d.progress(1, 0, 250, 1.0);
  EXPECT_EQ(d.core.tick(at(1.0)).samples, 650u);
  d.lost(1);
  EXPECT_EQ(d.core.tick(at(2.0)).epoch, 2u) << "a lost worker's epoch holds no one back";
  EXPECT_EQ(only<act::Place>(d.rejoin(1)).first_epoch, 2u);
  d.call([&](CoordinatorActions& o) { d.core.rejoined(1, 2, o); });
  Progress p = d.core.tick(at(3.0));
  EXPECT_EQ(p.samples, 650u) << "the new process has said nothing yet";
  EXPECT_DOUBLE_EQ(p.samples_per_s, 0.0);
  EXPECT_EQ(p.epoch, 2u) << "worker 0 is in epoch 2, the new worker 1 starts epoch 3";
  d.progress(1, 2, 30, 3.5);
  p = d.core.tick(at(4.0));
  EXPECT_EQ(p.samples, 680u);
  EXPECT_DOUBLE_EQ(p.samples_per_s, 30.0);
  LiveSnapshot snap;
  d.core.fill_live(snap, p, at(4.0));
  ASSERT_EQ(snap.worker.size(), 2u);
  EXPECT_EQ(snap.worker[1].samples, 280u) << "its place's samples, the lost process's with the new one's";
  EXPECT_EQ(snap.worker[1].epoch, 3u);
}

// An epoch report says where a worker is before its next progress does: a
// new process rejoined in the epoch the others were already training.
TEST(CoordinatorCore, ARejoinCountsAnEpochReportedBeforeTheProgressThatFollowsIt) {
  Driver d(config(3, 4));
  d.progress(0, 0, 150, 0.5);
  d.report(0, 0, 1.0);  // worker 0 has finished epoch 1: it trains epoch 2
  d.lost(2);
  EXPECT_EQ(only<act::Place>(d.rejoin(2)).first_epoch, 2u) << "the epoch after worker 0's";
}

TEST(CoordinatorCore, ARejoinForAWorkerNotYetDeclaredLostKillsItsOldProcessFirst) {
  Driver d(config(2, 3));
  const auto& out = d.rejoin(1);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(std::get<act::Kill>(out[0]).worker, 1u);
  EXPECT_EQ(std::get<act::Leave>(out[1]).worker, 1u);
  EXPECT_EQ(std::get<act::Place>(out[2]).first_epoch, 1u);
}

// The others done with every epoch: a new process for a killed worker has
// nothing left it could train before the job ends (it was taken for the
// last epoch, once only the others had finished, not while they trained it).
TEST(CoordinatorCore, ARejoinIsDismissedWhenEveryOtherWorkerHasFinished) {
  Driver d(config(2, 2));
  d.report(0, 0, 1.0);
  d.report(0, 1, 2.0);
  d.finished(0);
  d.lost(1);
  const auto& out = d.rejoin(1);
  EXPECT_EQ(count<act::Place>(out), 0u);
  EXPECT_EQ(count<act::Dismiss>(out), 1u);
}

TEST(CoordinatorCore, ARejoinIsDismissedWhenNothingIsLeftForIt) {
  Driver d(config(3, 2));
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(1, false)).why,
            "worker 1's process ended while the job was being placed: the job goes on without it");
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(7)).why, "no such worker");
  d.finished(0);
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(0)).why, "worker 0 had finished its share");
  d.progress(1, 1, 100, 1.0);
  d.lost(2);
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(2)).why, "the others are in the last epoch: nothing is left for it to train");
  d.cancel();
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(2)).why, "the job is ending");
}

// ---- stop ------------------------------------------------------------------------

TEST(CoordinatorCore, CancellingFailsTheJobOnceAndNothingHappensAfter) {
  Driver d(config(2, 2));
  EXPECT_EQ(only<act::Fail>(d.cancel()).status.code(), StatusCode::cancelled);
  EXPECT_TRUE(d.core.done());
  EXPECT_TRUE(d.cancel().empty());
  EXPECT_TRUE(d.report(0, 0, 1.0).empty());
  EXPECT_TRUE(d.report(1, 0, 1.0).empty());
  EXPECT_TRUE(d.lost(0).empty());
  EXPECT_TRUE(d.tick(5.0).empty());
}

TEST(CoordinatorCore, AWorkersFailureFailsTheJobWithItsStatusAndAHintWhenItDiverged) {
  Driver d(config(2, 2));
  const Status s = only<act::Fail>(d.call([&](CoordinatorActions& o) {
                     d.core.failed(StatusCode::diverged, "worker 1: loss is NaN", o);
                   })).status;
  EXPECT_EQ(s.code(), StatusCode::diverged);
  EXPECT_NE(s.message().find("worker 1: loss is NaN; the job ran with lr"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("try --lr"), std::string::npos) << s.message();
  EXPECT_TRUE(d.call([&](CoordinatorActions& o) { d.core.failed(StatusCode::timeout, "late", o); }).empty());
}

TEST(CoordinatorCore, EveryWorkerLostFailsTheJobNamingTheLast) {
  Driver d(config(2, 2));
  d.lost(0);
  const Status s = only<act::Fail>(d.lost(1)).status;
  EXPECT_EQ(s.message(), "every worker was lost; the last, worker 1: went silent");
  EXPECT_EQ(s.code(), StatusCode::unavailable) << "not an internal error: the workers' processes are gone";
}

TEST(CoordinatorCore, TheJobFinishesExactlyOnceAfterTheLastEpochsEvaluationAndEveryWorkersStop) {
  Driver d(config(2, 1));
  d.report(0, 0, 1.0);
  d.report(1, 0, 1.2);
  d.finished(0);  // before the evaluation: a worker may stop early
  const auto& evaluated = d.evaluated(0.9, 1.5);
  EXPECT_EQ(count<act::EpochDone>(evaluated), 1u);
  EXPECT_EQ(count<act::Finish>(evaluated), 0u) << "worker 1 may still be pushing";
  EXPECT_EQ(count<act::Finish>(d.finished(1)), 1u);
  EXPECT_TRUE(d.core.finishing());
  EXPECT_TRUE(d.finished(1).empty()) << "finishes once";
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(0)).why, "the job is ending");

  ShardStats shard;
  shard.staleness_histogram = {3, 1};
  const JobSummary s = d.core.finished(0.93, {shard});
  EXPECT_TRUE(d.core.done());
  EXPECT_DOUBLE_EQ(s.final_test_accuracy, 0.93);
  EXPECT_DOUBLE_EQ(s.train_s, 1.2);
  EXPECT_EQ(s.updates_applied, 20u);
  EXPECT_DOUBLE_EQ(s.staleness_mean, 0.25);
  EXPECT_EQ(s.dataset, "synthetic");
  EXPECT_TRUE(d.cancel().empty()) << "a finished job is not failed afterwards";
}

// --stop-at-target: the first evaluation at the target stops the workers,
// once; nothing more is evaluated; the job finishes when every worker has
// stopped, with training ending at the last one's report (its part of the
// epoch it was in) and the updates of the epochs never evaluated counted.
TEST(CoordinatorCore, AtTheTargetTheWorkersStopOnceAndTheJobFinishesWithoutTheEpochsLeft) {
  JobConfig c = config(2, 3);
  c.eval_every_s = 1.0;
  c.target_accuracy = 0.9;
  c.stop_at_target = true;
  Driver d(c);
  d.report(0, 0, 0.8);
  d.report(1, 0, 0.9);
  EXPECT_EQ(count<act::StopTraining>(d.evaluated(0.85, 1.0)), 0u) << "epoch 1 is below the target";
  d.tick(1.0);
  const auto& reached = d.evaluated(0.91, 1.6);
  EXPECT_EQ(count<act::PointDone>(reached), 1u);
  EXPECT_EQ(count<act::StopTraining>(reached), 1u);
  EXPECT_EQ(count<act::Finish>(reached), 0u) << "the workers have not stopped yet";
  EXPECT_TRUE(d.tick(2.0).empty()) << "no more points, no more timers";
  d.report(0, 1, 1.7, 40);  // what each did of epoch 2 before it stopped
  EXPECT_EQ(count<act::Evaluate>(d.report(1, 1, 1.8, 50)), 0u) << "epoch 2 is not evaluated";
  EXPECT_EQ(count<act::StopTraining>(d.evaluated(0.95, 1.9)), 0u) << "stopped once";
  d.finished(0);
  EXPECT_EQ(only<act::Dismiss>(d.rejoin(0)).why, "the job is ending");
  EXPECT_EQ(count<act::Finish>(d.finished(1)), 1u);
  const JobSummary s = d.core.finished(0.92, {ShardStats{}});
  EXPECT_TRUE(s.stopped_at_target);
  EXPECT_DOUBLE_EQ(*s.time_to_target_s, 1.0) << "the point's time: when its parameters were read";
  EXPECT_DOUBLE_EQ(s.train_s, 1.8) << "the last worker's report";
  EXPECT_EQ(s.updates_applied, 20u + 9u) << "epoch 1's and the 4 + 5 steps of epoch 2";
  EXPECT_DOUBLE_EQ(s.samples_per_s, (200.0 + 90.0) / 1.8);
}

// A worker lost while the others stop at the target is not waited for.
TEST(CoordinatorCore, AWorkerLostWhileTheOthersStopAtTheTargetIsNotWaitedFor) {
  JobConfig c = config(3, 3);
  c.target_accuracy = 0.9;
  c.stop_at_target = true;
  Driver d(c);
  for (std::uint32_t w = 0; w < 3; ++w) d.report(w, 0, 1.0);
  EXPECT_EQ(count<act::StopTraining>(d.evaluated(0.95, 1.1)), 1u);
  d.finished(0);
  d.report(1, 1, 1.3, 20);
  const auto& lost = d.lost(2);
  EXPECT_EQ(only<act::Leave>(lost).worker, 2u);
  EXPECT_EQ(count<act::Evaluate>(lost), 0u) << "nothing is evaluated after the stop";
  EXPECT_EQ(count<act::Finish>(lost), 0u) << "worker 1 has not stopped yet";
  EXPECT_EQ(count<act::Finish>(d.finished(1)), 1u);
  const JobSummary s = d.core.finished(0.93, {ShardStats{}});
  EXPECT_TRUE(s.stopped_at_target);
  EXPECT_EQ(s.workers_lost, 1u);
}

TEST(CoordinatorCore, WithoutStopAtTargetReachingItOnlyRecordsWhen) {
  JobConfig c = config(1, 2);
  c.target_accuracy = 0.9;
  Driver d(c);
  d.report(0, 0, 1.0);
  EXPECT_EQ(count<act::StopTraining>(d.evaluated(0.95, 1.1)), 0u);
  d.report(0, 1, 2.0);
  d.evaluated(0.96, 2.1);
  EXPECT_EQ(count<act::Finish>(d.finished(0)), 1u);
  const JobSummary s = d.core.finished(0.95, {ShardStats{}});
  EXPECT_FALSE(s.stopped_at_target);
  EXPECT_DOUBLE_EQ(*s.time_to_target_s, 1.0);
  EXPECT_DOUBLE_EQ(s.train_s, 2.0);
}

}  // namespace
}  // namespace asgd
