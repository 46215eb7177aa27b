// Backpressure end to end, through `asgd bench load` (bench/load_bench.cpp):
// real shard processes (`asgd shard`) under simulated workers that push as
// fast as the shards take them. The full acceptance run (5 minutes,
// docs/benchmarks.md) is too long for the suite; these are its short forms.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli/cli_run.hpp"
#include "temp_dir.hpp"

namespace {

using asgd_test::asgd;
using asgd_test::CliRun;

// Built with -DASGD_BUILD_BENCH=OFF there is no asgd-bench for the command to run.
bool has_bench_load() { return asgd("bench load --help").exit_code == 0; }

// Resident memory says nothing under a sanitizer (shadow memory, quarantined
// frees): there only the counters are checked.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr const char* kRssTolerance = "100000";
#else
constexpr const char* kRssTolerance = "50";
#endif

nlohmann::json run_load(const std::string& args, const asgd_test::TempDir& dir) {
  const std::string json = (dir.path() / "load.json").string();
  const CliRun r = asgd("bench load " + args + " --rss-tolerance " + kRssTolerance + " --json " + json);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(json);
  if (!in) {
    ADD_FAILURE() << "no JSON written: " << r.out << r.err;
    return {};
  }
  return nlohmann::json::parse(in);
}

struct Bound {
  std::uint64_t peak = 0;
  std::uint64_t limit = 0;
};

// "shard 0: at most 256 requests were unanswered at once (limit 256); ..."
std::vector<Bound> bounds_logged(const nlohmann::json& j) {
  std::vector<Bound> out;
  static const std::regex line(R"(at most (\d+) requests were unanswered at once \(limit (\d+)\))");
  for (const auto& l : j.value("shard_log", nlohmann::json::array())) {
    std::smatch m;
    const std::string text = l.get<std::string>();
    if (std::regex_search(text, m, line)) out.push_back({std::stoull(m[1]), std::stoull(m[2])});
  }
  return out;
}

// The workers keep no window of their own (--window 0: they send whenever
// ZeroMQ takes a push), and adam makes each push cost the shard more than
// it costs to deliver: without the shards' bound on unanswered requests
// their mailboxes grew by about 30 MiB a second here (docs/benchmarks.md).
TEST(BenchLoad, ShardsPushedWithoutAnyWindowKeepTheirMemoryFlatAndCountEveryAppliedPushOnce) {
  if (!has_bench_load()) GTEST_SKIP() << "asgd built without benchmarks";
  const asgd_test::TempDir dir("_load");
  const auto j = run_load("--workers 32 --shards 2 --seconds 20 --window 0 --optimizer adam", dir);
  ASSERT_FALSE(j.is_null());
  EXPECT_TRUE(j.at("counters_agree").get<bool>()) << j.dump(1);
  EXPECT_TRUE(j.at("rss_ok").get<bool>()) << j.dump(1);
  ASSERT_EQ(j.at("per_shard").size(), 2u);
  for (const auto& s : j.at("per_shard")) {
    EXPECT_GT(s.at("pushes_sent").get<std::uint64_t>(), 1000u) << s.dump();
    EXPECT_EQ(s.at("applied_replies"), s.at("updates_applied")) << s.dump();
    EXPECT_EQ(s.at("replies"), s.at("pushes_sent")) << s.dump();
    EXPECT_EQ(s.at("rejected").get<std::uint64_t>(), 0u);
  }
  EXPECT_GE(j.at("rss_samples").size(), 18u);
  // The rates count pushes answered within the window, and an update is
  // the whole model's: a push to each of the 2 shards.
  std::uint64_t in_window = 0, applied = 0;
  for (const auto& s : j.at("per_shard")) {
    EXPECT_LE(s.at("replies_in_window").get<std::uint64_t>(), s.at("replies").get<std::uint64_t>()) << s.dump();
    EXPECT_LE(s.at("applied_in_window").get<std::uint64_t>(), s.at("replies_in_window").get<std::uint64_t>());
    in_window += s.at("replies_in_window").get<std::uint64_t>();
    applied += s.at("applied_in_window").get<std::uint64_t>();
  }
  const double seconds = j.at("seconds").get<double>();
  EXPECT_NEAR(j.at("pushes_per_s").get<double>(), static_cast<double>(in_window) / seconds, 1e-6);
  EXPECT_NEAR(j.at("model_updates_per_s").get<double>(), static_cast<double>(applied) / 2 / seconds, 1e-6);
  const auto bounds = bounds_logged(j);
  ASSERT_EQ(bounds.size(), 2u) << j.at("shard_log").dump(1);
  for (const Bound& b : bounds) EXPECT_LE(b.peak, b.limit);
}

// Under bsp every worker's push is held at the barrier until the last
// worker's arrives, so a shard must read one unanswered push per worker: with
// more workers than the default bound (256) a fixed bound would deadlock.
TEST(BenchLoad, ABspShardWithMoreWorkersThanTheDefaultBoundPassesEveryBarrier) {
  if (!has_bench_load()) GTEST_SKIP() << "asgd built without benchmarks";
  const asgd_test::TempDir dir("_load_bsp");
  const auto j = run_load("--policy bsp --workers 300 --shards 1 --window 1 --keys 1000 --seconds 8", dir);
  ASSERT_FALSE(j.is_null());
  EXPECT_TRUE(j.at("counters_agree").get<bool>()) << j.dump(1);
  ASSERT_EQ(j.at("per_shard").size(), 1u);
  const auto& s = j.at("per_shard")[0];
  EXPECT_GE(s.at("pushes_sent").get<std::uint64_t>(), 300u * 10) << "fewer than ten barriers passed: " << s.dump();
  EXPECT_EQ(s.at("applied_replies"), s.at("updates_applied")) << s.dump();
  const auto bounds = bounds_logged(j);
  ASSERT_EQ(bounds.size(), 1u) << j.at("shard_log").dump(1);
  EXPECT_GE(bounds[0].peak, 300u) << "every worker's push is held at a barrier at once";
  EXPECT_LE(bounds[0].peak, bounds[0].limit);
}

// A run stopped early wrote no --json (the runs whose RSS samples matter
// most): the file holds why the run stopped and the samples until then.
TEST(BenchLoad, ARunStoppedEarlyStillWritesItsJson) {
  if (!has_bench_load()) GTEST_SKIP() << "asgd built without benchmarks";
  const asgd_test::TempDir dir("_load_early");
  const std::string json = (dir.path() / "early.json").string();
  const CliRun r = asgd("bench load --workers 2 --shards 1 --keys 1000 --seconds 30 --rss-abort 1 --json " + json);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(" MiB, passed --rss-abort 1 MiB"), std::string::npos) << r.err;
  std::ifstream in(json);
  ASSERT_TRUE(in) << "no JSON written: " << r.err;
  const auto j = nlohmann::json::parse(in);
  EXPECT_FALSE(j.at("ok").get<bool>());
  EXPECT_NE(j.at("error").get<std::string>().find("--rss-abort"), std::string::npos) << j.dump(1);
  // The sample that passed the limit is kept (it was dropped: none at all).
  ASSERT_TRUE(j.at("rss_samples").is_array());
  EXPECT_GE(j.at("rss_samples").size(), 1u) << j.dump(1);
}

}  // namespace
