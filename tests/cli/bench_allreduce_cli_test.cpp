// `asgd bench allreduce`: our collective's ranks and Open MPI's under a real
// mpirun, measured in one run; the JSON fields issue 28 names.

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"
#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

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

// From the benchmark audit (2026-11-29): without mpirun on PATH the bench
// said "mpirun over btl self,tcp failed (exit -1)" and exited 0; the JSON
// lacked the times the table printed; the table cut figures (0.8996 read
// 0.89 beside a 0.9 target).
TEST(BenchAllreduceCli, WithoutMpirunItSaysSoAndFailsAndTheJsonCarriesTheTimes) {
  if (!has_bench() || !has_mpirun()) GTEST_SKIP() << "asgd built without benchmarks, or no mpirun";
  const CliRun r = asgd("bench allreduce --processes 2 --sizes 4K --iterations 2 --json", {}, "env PATH=/nonexistent");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("mpirun is not on PATH"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Open MPI's side did not run"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["iterations"], 2);
  EXPECT_GT(j["sizes"][0]["ours_ms"].get<double>(), 0.0) << j.dump();
  EXPECT_TRUE(j["sizes"][0]["mpi_ms"].is_null()) << j.dump();
  EXPECT_TRUE(j["sizes"][0]["ratio"].is_null()) << j.dump();
  const CliRun table = asgd("bench allreduce --processes 2 --sizes 4K --iterations 2");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  std::istringstream lines(table.out);
  std::string line, transport;
  double floats = 0, ours = 0, mpi = 0, ratio = 0, ms = 0;
  bool found = false;
  while (!found && std::getline(lines, line)) {
    std::istringstream fields(line);
    found = fields >> floats >> transport >> ours >> mpi >> ratio >> ms && floats == 4096 && transport == "tcp";
  }
  ASSERT_TRUE(found) << table.out;
  EXPECT_NEAR(ratio, ours / mpi, 0.01) << "the ratio, rounded to 2 decimals";
  EXPECT_GT(ms, 0.0);
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

// Whether process `pid` is gone (not even a zombie) within 10 s.
bool gone(pid_t pid) {
  return asgd_test::eventually([&] { return !std::filesystem::exists("/proc/" + std::to_string(pid)); });
}

// Stopped (SIGTERM, as Ctrl-C would) while its ranks run, it ends them and
// removes its scratch folder; killed outright, its ranks and comm servers
// end with it (they kept running, and its folder stayed in /tmp).
TEST(BenchAllreduceCli, InterruptedOrKilledItLeavesNoProcessOrFolderBehind) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const asgd_test::TempDir scratch;
  const pid_t bench = asgd_test::start_asgd({"bench", "allreduce", "--sizes", "16M", "--iterations", "1000"},
                                            scratch / "allreduce.log");
  ASSERT_GT(bench, 0);
  std::optional<pid_t> rank;
  ASSERT_TRUE(asgd_test::eventually([&] { return (rank = asgd_test::child_with_args(bench, {"allreduce-rank"})).has_value(); },
                                    std::chrono::seconds(30)));
  ASSERT_EQ(::kill(bench, SIGTERM), 0);
  const auto code = asgd_test::wait_exit(bench, std::chrono::seconds(30));
  ASSERT_TRUE(code) << asgd_test::read_file(scratch / "allreduce.log");
  EXPECT_EQ(*code, 1);
  EXPECT_NE(asgd_test::read_file(scratch / "allreduce.log").find("bench allreduce: interrupted"), std::string::npos);
  EXPECT_TRUE(gone(*rank)) << "rank " << *rank << " outlived the bench";
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::temp_directory_path() /
                                       ("asgd-bench-allreduce-" + std::to_string(bench))));

  const pid_t comm = asgd_test::start_asgd({"bench", "comm", "--sizes", "16M", "--repeats", "1000"}, scratch / "comm.log");
  ASSERT_GT(comm, 0);
  std::optional<pid_t> server;
  ASSERT_TRUE(asgd_test::eventually([&] { return (server = asgd_test::child_with_args(comm, {"comm-server"})).has_value(); },
                                    std::chrono::seconds(30)));
  ASSERT_EQ(::kill(comm, SIGKILL), 0);
  ASSERT_TRUE(asgd_test::wait_exit(comm, std::chrono::seconds(30)));
  EXPECT_TRUE(gone(*server)) << "comm server " << *server << " outlived the bench";
}

// A rank killed mid-run: the bench stops at once naming it and how it
// ended (the others waited a minute for its part, then blamed each other).
TEST(BenchAllreduceCli, ARankThatDiesStopsTheBenchAtOnceNamingIt) {
  if (!has_bench()) GTEST_SKIP() << "asgd built without benchmarks";
  const asgd_test::TempDir scratch;
  const pid_t bench = asgd_test::start_asgd(
      {"bench", "allreduce", "--processes", "3", "--sizes", "4M", "--iterations", "1000"}, scratch / "allreduce.log");
  ASSERT_GT(bench, 0);
  std::optional<pid_t> rank;
  ASSERT_TRUE(asgd_test::eventually(
      [&] { return (rank = asgd_test::child_with_args(bench, {"allreduce-rank", "--rank", "2"})).has_value(); },
      std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // (at any moment: the same stop)
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(*rank, SIGKILL), 0);
  const auto code = asgd_test::wait_exit(bench, std::chrono::seconds(60));
  ASSERT_TRUE(code) << asgd_test::read_file(scratch / "allreduce.log");
  EXPECT_EQ(*code, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(20)) << "it waited for the dead rank";
  EXPECT_NE(asgd_test::read_file(scratch / "allreduce.log")
                .find("our rank 2 was killed by signal 9 (KILL); the other ranks were stopped"),
            std::string::npos)
      << asgd_test::read_file(scratch / "allreduce.log");
}

}  // namespace
