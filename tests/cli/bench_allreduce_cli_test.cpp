// `asgd bench allreduce`: our collective's ranks and Open MPI's under a real
// mpirun, measured in one run; the JSON fields issue 28 names.

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"

namespace {

using asgd_test::asgd;
using asgd_test::CliRun;

bool has_bench() { return asgd("bench allreduce --help").exit_code == 0; }
bool has_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

TEST(BenchAllreduceCli, MeasuresOursAndOpenMpisBusBandwidthPerSizeAndTransport) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const CliRun r = asgd("bench allreduce --processes 3 --sizes 64K,100003 --iterations 2 --rounds 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j["processes"], 3);
  EXPECT_EQ(j["rounds"], 2);
  ASSERT_EQ(j["sizes"].size(), 4u) << j.dump();  // tcp and shm for each size
  for (const auto& row : j["sizes"]) {
    for (const char* field : {"floats", "transport", "ours_gbps", "mpi_gbps", "ratio"})
      EXPECT_TRUE(row.contains(field)) << field << " missing: " << row.dump();
    EXPECT_GT(row["ours_gbps"].get<double>(), 0.0) << "ours over tcp and through shared memory: " << row.dump();
    if (has_mpirun()) {
      EXPECT_GT(row["mpi_gbps"].get<double>(), 0.0) << row.dump() << "\n" << r.err;
      EXPECT_NEAR(row["ratio"].get<double>(), row["ours_gbps"].get<double>() / row["mpi_gbps"].get<double>(), 1e-9);
    }
  }
  EXPECT_EQ(j["sizes"][0]["transport"], "tcp");
  EXPECT_EQ(j["sizes"][1]["transport"], "shm");
  EXPECT_EQ(j["sizes"][2]["floats"], 100003);
}

TEST(BenchAllreduceCli, OursCanSendFloat16AndTheOutputSaysSo) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const CliRun r = asgd("bench allreduce --processes 2 --sizes 64K --iterations 1 --compress fp16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["compress"], "fp16");
  EXPECT_GT(j["sizes"][0]["ours_gbps"].get<double>(), 0.0) << j.dump();
  asgd_test::expect_one_line_error(asgd("bench allreduce --compress zip"), 2, "--compress zip");
}

TEST(BenchAllreduceCli, ABadSizeOrProcessCountIsAUsageError) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  asgd_test::expect_one_line_error(asgd("bench allreduce --sizes 4Q"), 2, "--sizes: size '4Q'");
  asgd_test::expect_one_line_error(asgd("bench allreduce --sizes 1M,0"), 2, "--sizes: size '0': at least 1 float");
  EXPECT_EQ(asgd("bench allreduce --processes 1").exit_code, 2);
  EXPECT_EQ(asgd("bench allreduce --rounds 0").exit_code, 2);
}

}  // namespace
