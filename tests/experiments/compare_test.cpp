// asgd compare's arithmetic and files: lists, targets, spread, speedup, CSV.

#include "experiments/compare.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "cli/cli_run.hpp"
#include "temp_dir.hpp"

namespace asgd::experiments {
namespace {

CurvePoint eval_at(double wall_s, double accuracy) {
  CurvePoint p;
  p.kind = CurvePoint::Kind::eval;
  p.wall_s = wall_s;
  p.val_accuracy = accuracy;
  return p;
}

CurvePoint epoch_at(std::uint32_t epoch, double wall_s, double accuracy) {
  CurvePoint p = eval_at(wall_s, accuracy);
  p.kind = CurvePoint::Kind::epoch;
  p.epoch = epoch;
  p.updates = 100u * epoch;
  p.train_loss = 0.5 / epoch;
  p.samples_per_s = 1000.0;
  return p;
}

RunRecord run(const std::string& policy, std::uint32_t workers, std::uint32_t repeat, std::vector<CurvePoint> curve,
              double train_s = 2.0, double test_accuracy = 0.97) {
  RunRecord r;
  r.policy = policy;
  r.workers = workers;
  r.repeat = repeat;
  r.seed = 1 + repeat;
  r.curve = std::move(curve);
  r.summary.policy = policy.substr(0, policy.find(':'));
  r.summary.workers = workers;
  r.summary.shards = 1;
  r.summary.device = "cpu";
  r.summary.model = "mlp";
  r.summary.dataset = "mnist";
  r.summary.epochs = 2;
  r.summary.train_s = train_s;
  r.summary.wall_s = train_s + 1.0;
  r.summary.samples_per_s = 55000.0 * 2 / train_s;
  r.summary.final_test_accuracy = test_accuracy;
  r.summary.updates_applied = 200;
  r.summary.worker_wait_s = std::vector<double>(workers, 0.25);
  return r;
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::string field;
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quoted) {
        if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') field += '"', ++i;
        else if (c == '"') quoted = false;
        else field += c;
      } else if (c == '"') {
        quoted = true;
      } else if (c == ',') {
        fields.push_back(field);
        field.clear();
      } else {
        field += c;
      }
    }
    fields.push_back(field);
    rows.push_back(fields);
  }
  return rows;
}

TEST(PolicyList, KeepsTheEntriesInTheOrderGivenAsWritten) {
  const auto list = parse_policy_list("bsp, ssp:3 ,async");
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_EQ(*list, (std::vector<std::string>{"bsp", "ssp:3", "async"}));
}

TEST(PolicyList, RejectsAnEmptyListAnEmptyEntryAndARepeatNamingTheText) {
  for (const std::string bad : {"", "bsp,,async", "bsp,", "ssp:3,bsp,ssp:3"}) {
    const auto list = parse_policy_list(bad);
    ASSERT_FALSE(list.ok()) << bad;
    EXPECT_EQ(list.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(list.status().message().find("--policies " + bad), std::string::npos) << list.status().message();
  }
}

TEST(WorkerList, ReadsOneCountOrSeveralAscending) {
  EXPECT_EQ(*parse_worker_list("4"), (std::vector<std::uint32_t>{4}));
  EXPECT_EQ(*parse_worker_list("4,1, 2"), (std::vector<std::uint32_t>{1, 2, 4}));
}

TEST(WorkerList, RejectsZeroNonNumbersAndRepeatsNamingTheText) {
  for (const std::string bad : {"", "0", "1,0", "1,x", "2,2", "1.5", "-1"}) {
    const auto list = parse_worker_list(bad);
    ASSERT_FALSE(list.ok()) << bad;
    EXPECT_NE(list.status().message().find("--workers " + bad), std::string::npos) << list.status().message();
  }
}

TEST(ConfigForRun, SetsThePolicyWorkersAndTheRepeatsSeed) {
  JobConfig base;
  base.seed = 7;
  const JobConfig c = config_for_run(base, "ssp:3", 4, 2);
  EXPECT_EQ(c.policy, "ssp:3");
  EXPECT_EQ(c.workers, 4u);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_TRUE(validate(c).ok()) << validate(c).message();
}

TEST(ConfigForRun, KeepsAPolicysOwnSettingsForItAndDropsThemForTheOthers) {
  JobConfig base;
  base.policy_options = {{"staleness", 5}, {"fetch-every", 4}, {"backup-workers", 1}, {"local-steps", 2}};
  base.staleness_aware_lr = true;
  using Options = std::map<std::string, double>;
  const JobConfig ssp = config_for_run(base, "ssp", 2, 0);
  EXPECT_EQ(ssp.policy_options, (Options{{"staleness", 5}}));
  EXPECT_EQ(ssp.staleness_aware_lr, true);
  const JobConfig async = config_for_run(base, "async", 2, 0);
  EXPECT_EQ(async.policy_options, (Options{{"fetch-every", 4}}));
  const JobConfig bsp = config_for_run(base, "bsp", 2, 0);
  EXPECT_EQ(bsp.policy_options, (Options{{"backup-workers", 1}}));
  EXPECT_FALSE(bsp.staleness_aware_lr) << "unset: bsp's own default";
  const JobConfig easgd = config_for_run(base, "easgd", 2, 0);
  EXPECT_EQ(easgd.policy_options, (Options{{"local-steps", 2}})) << "a knob two policies take stays for both";
  for (const JobConfig& c : {ssp, async, bsp, easgd}) EXPECT_TRUE(validate(c).ok()) << c.policy << ": " << validate(c).message();
}

TEST(CurvePoints, AnEvaluationWithoutUpdatesSamplesOrLossHasNoneRatherThanZero) {
  EvalPoint e;
  e.wall_s = 0.5;
  e.val_accuracy = 0.9;
  e.train_loss = std::numeric_limits<double>::quiet_NaN();
  const CurvePoint p = curve_point(e);
  EXPECT_EQ(p.kind, CurvePoint::Kind::eval);
  EXPECT_FALSE(p.updates);
  EXPECT_FALSE(p.samples);
  EXPECT_FALSE(p.train_loss);
  EXPECT_FALSE(p.epoch);
  e.updates = 300;
  e.samples = 19200;
  e.train_loss = 0.41;
  const CurvePoint q = curve_point(e);
  EXPECT_EQ(q.updates, 300u);
  EXPECT_EQ(q.samples, 19200u);
  EXPECT_EQ(q.train_loss, 0.41);
}

TEST(CurvePoints, EpochSamplesComeFromTheRunsTotal) {
  RunRecord r = run("async", 2, 0, {epoch_at(1, 1.0, 0.9), eval_at(1.5, 0.92), epoch_at(2, 2.0, 0.95)});
  fill_epoch_samples(r, 110000);
  EXPECT_EQ(r.curve[0].samples, 55000u);
  EXPECT_FALSE(r.curve[1].samples);
  EXPECT_EQ(r.curve[2].samples, 110000u);
}

TEST(Target, IsTheHighestAccuracyEveryRunReachedFlooredToAHalfPercent) {
  const std::vector<RunRecord> runs = {run("bsp", 2, 0, {eval_at(0.5, 0.95), epoch_at(1, 1.0, 0.9734)}),
                                       run("async", 2, 0, {eval_at(0.5, 0.9712), epoch_at(1, 1.0, 0.9690)})};
  EXPECT_DOUBLE_EQ(*highest_common_accuracy(runs), 0.97);
  const auto target = choose_target(runs, std::nullopt);
  ASSERT_TRUE(target);
  EXPECT_FALSE(target->given);
  EXPECT_NE(target->how.find("highest validation accuracy that every run reached"), std::string::npos);
}

TEST(Target, AnAccuracyOnAHalfPercentStepIsItsOwnTargetAndEveryRunReachesIt) {
  // 4850 of 5000 validation images: 0.97 exactly, which must not floor to 0.965.
  const std::vector<RunRecord> runs = {run("bsp", 2, 0, {epoch_at(1, 1.0, 4850.0 / 5000.0)}),
                                       run("async", 2, 0, {epoch_at(1, 0.8, 0.99)})};
  const double target = *highest_common_accuracy(runs);
  EXPECT_DOUBLE_EQ(target, 0.97);
  for (const RunRecord& r : runs) EXPECT_TRUE(time_to_target(r.curve, target)) << r.policy;
}

TEST(Target, AGivenTargetWinsAndWithoutPointsThereIsNone) {
  const std::vector<RunRecord> runs = {run("bsp", 2, 0, {epoch_at(1, 1.0, 0.96)})};
  const auto given = choose_target(runs, 0.98);
  EXPECT_TRUE(given->given);
  EXPECT_EQ(given->accuracy, 0.98);
  EXPECT_FALSE(choose_target({}, std::nullopt));
  EXPECT_FALSE(choose_target({run("bsp", 2, 0, {})}, std::nullopt));
}

TEST(Target, TimeToTargetIsTheFirstPointAtOrAboveIt) {
  const std::vector<CurvePoint> curve = {eval_at(0.5, 0.90), eval_at(1.0, 0.955), epoch_at(1, 1.2, 0.95),
                                         eval_at(1.5, 0.97)};
  EXPECT_EQ(time_to_target(curve, 0.95), 1.0);
  EXPECT_EQ(time_to_target(curve, 0.97), 1.5);
  EXPECT_FALSE(time_to_target(curve, 0.98));
}

TEST(GroupStats, GivesMeanMinAndMaxOverRepeatsAndCountsTheRunsThatReachedTheTarget) {
  const std::vector<RunRecord> runs = {
      run("bsp", 2, 0, {eval_at(1.0, 0.96), eval_at(2.0, 0.97)}, 2.0, 0.96),
      run("bsp", 2, 1, {eval_at(1.5, 0.97)}, 3.0, 0.98),
      run("async", 2, 0, {eval_at(1.0, 0.96)}, 1.0, 0.95),
  };
  const Target target{0.97, true, ""};
  const auto groups = group_stats(runs, {"bsp", "async"}, target);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].policy, "bsp");
  EXPECT_EQ(groups[0].runs, 2u);
  EXPECT_EQ(groups[0].reached, 2u);
  EXPECT_DOUBLE_EQ(groups[0].time_to_target_s->mean, 1.75);
  EXPECT_DOUBLE_EQ(groups[0].time_to_target_s->min, 1.5);
  EXPECT_DOUBLE_EQ(groups[0].time_to_target_s->max, 2.0);
  EXPECT_DOUBLE_EQ(groups[0].final_test_accuracy.mean, 0.97);
  EXPECT_DOUBLE_EQ(groups[0].train_s.max, 3.0);
  EXPECT_FALSE(groups[0].energy_j);
  EXPECT_EQ(groups[1].reached, 0u);
  EXPECT_FALSE(groups[1].time_to_target_s);
}

TEST(Scaling, SpeedupIsT1OverTNAndEfficiencyIsSpeedupOverN) {
  const std::vector<RunRecord> runs = {
      run("async", 1, 0, {eval_at(4.0, 0.97)}), run("async", 1, 1, {eval_at(4.0, 0.97)}),
      run("async", 2, 0, {eval_at(2.5, 0.97)}), run("async", 2, 1, {eval_at(2.5, 0.97)}),
      run("async", 4, 0, {eval_at(2.0, 0.97)}),
  };
  const auto rows = scaling_rows(group_stats(runs, {"async"}, Target{0.97, true, ""}));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].workers, 1u);
  EXPECT_DOUBLE_EQ(rows[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(rows[0].efficiency, 1.0);
  EXPECT_EQ(rows[1].base_workers, 1u);
  EXPECT_EQ(rows[1].measure, "time to target");
  EXPECT_DOUBLE_EQ(rows[1].speedup, 1.6);
  EXPECT_DOUBLE_EQ(rows[1].efficiency, 0.8);
  EXPECT_DOUBLE_EQ(rows[2].speedup, 2.0);
  EXPECT_DOUBLE_EQ(rows[2].efficiency, 0.5);
}

TEST(Scaling, WithoutAOneWorkerRunTheBaseIsTheSmallestCountAndEfficiencyIsRelativeToIt) {
  const std::vector<RunRecord> runs = {run("bsp", 2, 0, {eval_at(3.0, 0.97)}), run("bsp", 4, 0, {eval_at(2.0, 0.97)})};
  const auto rows = scaling_rows(group_stats(runs, {"bsp"}, Target{0.97, true, ""}));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].base_workers, 2u);
  EXPECT_DOUBLE_EQ(rows[1].speedup, 1.5);
  EXPECT_DOUBLE_EQ(rows[1].efficiency, 0.75);
}

TEST(Scaling, UsesTrainingTimeForEveryCountWhenARunOfThePolicyMissedTheTarget) {
  const std::vector<RunRecord> runs = {run("bsp", 1, 0, {eval_at(3.0, 0.97)}, 6.0),
                                       run("bsp", 2, 0, {eval_at(3.0, 0.90)}, 4.0)};
  const auto rows = scaling_rows(group_stats(runs, {"bsp"}, Target{0.97, true, ""}));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].measure, "training time");
  EXPECT_DOUBLE_EQ(rows[1].time_s, 4.0);
  EXPECT_DOUBLE_EQ(rows[1].speedup, 1.5);
}

TEST(Scaling, IsEmptyWithOneWorkerCount) {
  const std::vector<RunRecord> runs = {run("bsp", 2, 0, {eval_at(3.0, 0.97)}), run("async", 2, 0, {eval_at(2.0, 0.97)})};
  EXPECT_TRUE(scaling_rows(group_stats(runs, {"bsp", "async"}, Target{0.97, true, ""})).empty());
}

TEST(Csv, QuotesAFieldOnlyWhenItMust) {
  EXPECT_EQ(csv_field("ssp:3"), "ssp:3");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
}

TEST(Csv, ResultsHaveOneRowPerRunWithTheSummaryAndTheTimeToTarget) {
  RunRecord a = run("ssp:3", 2, 1, {eval_at(0.5, 0.95), eval_at(1.0, 0.97)});
  a.summary.staleness = 3;
  a.summary.staleness_mean = 1.5;
  a.summary.staleness_max = 3;
  RunRecord b = run("async", 2, 1, {eval_at(1.0, 0.96)});
  b.summary.model = "my,model";  // a field that needs quoting
  b.energy_j = 1234.5;
  b.edp_js = 2469.0;
  b.lr = 0.04;
  b.batch = 32;
  const auto rows = parse_csv(results_csv({a, b}, Target{0.97, true, ""}));
  ASSERT_EQ(rows.size(), 3u);
  const std::vector<std::string> header = {
      "run", "policy", "staleness", "workers", "shards", "device", "model", "dataset", "epochs", "seed", "repeat",
      "wall_s", "train_s", "samples_per_s", "final_test_accuracy", "target_accuracy", "time_to_target_s",
      "updates_applied", "staleness_mean", "staleness_p99", "staleness_max", "worker_wait_mean_s", "energy_j",
      "edp_js", "lr", "batch"};
  EXPECT_EQ(rows[0], header);
  auto col = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  EXPECT_EQ(rows[1][col("run")], "ssp:3-w2-r1");
  EXPECT_EQ(rows[1][col("policy")], "ssp:3");
  EXPECT_EQ(rows[1][col("staleness")], "3");
  EXPECT_EQ(rows[1][col("seed")], "2");
  EXPECT_EQ(rows[1][col("repeat")], "1");
  EXPECT_EQ(rows[1][col("train_s")], "2");
  EXPECT_EQ(rows[1][col("target_accuracy")], "0.97");
  EXPECT_EQ(rows[1][col("time_to_target_s")], "1");
  EXPECT_EQ(rows[1][col("staleness_mean")], "1.5");
  EXPECT_EQ(rows[1][col("worker_wait_mean_s")], "0.25");
  EXPECT_EQ(rows[1][col("energy_j")], "");
  EXPECT_EQ(rows[2][col("staleness")], "");        // async has no bound
  EXPECT_EQ(rows[2][col("time_to_target_s")], "");  // never reached 0.97
  EXPECT_EQ(rows[2][col("model")], "my,model");
  EXPECT_EQ(rows[2][col("energy_j")], "1234.5");
  EXPECT_EQ(rows[2][col("edp_js")], "2469");
  EXPECT_EQ(rows[2][col("lr")], "0.04");
  EXPECT_EQ(rows[2][col("batch")], "32");
  for (const auto& row : rows) EXPECT_EQ(row.size(), header.size());
}

TEST(Csv, CurvesHaveOneRowPerPointWithEmptyFieldsForWhatAnEvaluationLacks) {
  RunRecord r = run("bsp", 2, 0, {eval_at(0.5, 0.93), epoch_at(1, 0.9, 0.95)});
  fill_epoch_samples(r, 110000);
  const auto rows = parse_csv(curves_csv({r}));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"run", "policy", "workers", "repeat", "kind", "epoch", "wall_s", "updates",
                                               "samples", "train_loss", "val_accuracy", "samples_per_s"}));
  EXPECT_EQ(rows[1], (std::vector<std::string>{"bsp-w2-r0", "bsp", "2", "0", "eval", "", "0.5", "", "", "", "0.93", ""}));
  EXPECT_EQ(rows[2],
            (std::vector<std::string>{"bsp-w2-r0", "bsp", "2", "0", "epoch", "1", "0.9", "100", "55000", "0.5", "0.95", "1000"}));
}

TEST(WriteFile, ReplacesTheFileWholeAndNamesAPathItCannotWrite) {
  const asgd_test::TempDir dir;
  const std::string path = (dir / "results.csv").string();
  ASSERT_TRUE(write_file(path, "first\n").ok());
  ASSERT_TRUE(write_file(path, "second\n").ok());
  EXPECT_EQ(asgd_test::slurp(path), "second\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);  // no temporary left behind
  const Status s = write_file((dir / "missing" / "x.csv").string(), "x");
  EXPECT_EQ(s.code(), StatusCode::io_error);
  EXPECT_NE(s.message().find("missing/x.csv"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace asgd::experiments
