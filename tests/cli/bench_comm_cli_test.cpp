// `asgd bench comm`: ours against raw ZeroMQ in one run, the shared-memory
// path beside memcpy's bound, and the one-float round trip issue 21's
// second item is about; with --busy-poll-us, what ran says so.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"

namespace {

using asgd_test::asgd;
using asgd_test::CliRun;

bool has_bench() { return asgd("bench comm --help").exit_code == 0; }

// One run of the bench on a small size, as JSON.
nlohmann::json comm_json(const std::string& extra) {
  const CliRun r = asgd("bench comm --sizes 4096 --repeats 1 --shards 1 --json " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j;
  EXPECT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  return j;
}

TEST(BenchCommCli, MeasuresOursRawAndSharedMemoryPerSizeAndTheOneFloatRoundTrip) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const nlohmann::json j = comm_json("");
  ASSERT_EQ(j["sizes"].size(), 1u) << j.dump();
  const auto& row = j["sizes"][0];
  EXPECT_EQ(row["floats"], 4096);
  for (const char* field : {"raw_gb_per_s", "ours_gb_per_s", "shm_gb_per_s", "memcpy_gb_per_s"})
    EXPECT_GT(row[field].get<double>(), 0.0) << field << ": " << row.dump();
  EXPECT_NEAR(row["ratio"].get<double>(), row["ours_gb_per_s"].get<double>() / row["raw_gb_per_s"].get<double>(),
              1e-9);
  // The shard's update of its slice is part of ours' round trip, not more than it.
  EXPECT_GT(row["shard_update_s"].get<double>(), 0.0) << row.dump();
  EXPECT_LT(row["shard_update_s"].get<double>(), row["ours_round_trip_s"].get<double>()) << row.dump();
  EXPECT_GT(j["small_round_trip_us"]["raw"].get<double>(), 0.0) << j.dump();
  EXPECT_GT(j["small_round_trip_us"]["ours"].get<double>(), 0.0) << j.dump();
  EXPECT_EQ(j["busy_poll_us"], 0);
}

TEST(BenchCommCli, WithBusyPollingEveryRoundTripStillCompletesAndTheOutputSaysSo) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const nlohmann::json j = comm_json("--busy-poll-us 100");
  EXPECT_EQ(j["busy_poll_us"], 100);
  EXPECT_GT(j["sizes"][0]["ours_gb_per_s"].get<double>(), 0.0) << j.dump();
  EXPECT_GT(j["small_round_trip_us"]["ours"].get<double>(), 0.0) << j.dump();
  const CliRun table = asgd("bench comm --sizes 4096 --repeats 1 --shards 1 --busy-poll-us 100");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("ours polling 100 us before sleeping"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("x (medians of 1 runs of 2000)"), std::string::npos) << table.out;  // ours over raw
  asgd_test::expect_one_line_error(asgd("bench comm --busy-poll-us -1"), 2, "--busy-poll-us");
}

// A size not a whole number of M floats was labelled by its whole Ms
// (1536K read "1M"); raw ZeroMQ went through one echo process where ours
// spread over --shards (a slower baseline, which flattered ours).
TEST(BenchCommCli, EachSizeIsLabelledAsGivenAndRawSpreadsOverAsManyProcessesAsOurs) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const CliRun r = asgd("bench comm --sizes 3K,1000 --repeats 1 --shards 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\n3K     "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n1000   "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("raw through as many echo processes, one a slice"), std::string::npos) << r.out;
  asgd_test::expect_one_line_error(asgd("bench comm-server --mode foo"), 2, "--mode foo: raw or shard");
}

TEST(BenchCommCli, ASizeThatIsNoCountOfFloatsIsAUsageErrorThatSaysWhy) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  asgd_test::expect_one_line_error(asgd("bench comm --sizes 0"), 2, "--sizes: size '0': at least 1 float");
  asgd_test::expect_one_line_error(asgd("bench comm --sizes 1Q"), 2, "size '1Q': expected a number of floats");
  asgd_test::expect_one_line_error(asgd("bench comm --sizes 99999999999999999M"), 2, "at most 256M floats");
  // Its bytes wrapped to 0 and the bench died of SIGFPE, leaving its servers running.
  asgd_test::expect_one_line_error(asgd("bench comm --sizes 4611686018427387904"), 2, "at most 256M floats");
  asgd_test::expect_one_line_error(asgd("bench allreduce --sizes 257M"), 2, "at most 256M floats");
}

}  // namespace
