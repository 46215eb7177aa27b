// `asgd bench compute` as bench/torch_compute.py meets it: JSON lines with
// the fields it reads, and plain exit-2 errors for a wrong model or device.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compute/device.hpp"
#include "cli/cli_run.hpp"
#include "test_data.hpp"

namespace {

namespace fs = std::filesystem;

using asgd_test::asgd;
using asgd_test::CliRun;

// Built with -DASGD_BUILD_BENCH=OFF there is no asgd-bench for the command to run.
bool has_bench_compute() { return asgd("bench compute --help").exit_code == 0; }

void expect_refused(const CliRun& r, int code, const std::string& needle) {
  asgd_test::expect_one_line_error(r, code, needle);
  EXPECT_TRUE(r.out.empty()) << "nothing should be measured: " << r.out;
}

TEST(BenchComputeCli, PrintsOneJsonObjectPerBatchWithTheFieldsTheTorchScriptReads) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  const CliRun r = asgd("bench compute --models mlp --batches 8,16 --seconds 0.2 --warmup 0.05 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    ASSERT_NO_THROW(rows.push_back(nlohmann::json::parse(line))) << "not JSON: " << line;
  }
  ASSERT_EQ(rows.size(), 2u) << r.out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row.at("model"), "mlp");
    EXPECT_EQ(row.at("batch"), i == 0 ? 8 : 16);
    EXPECT_EQ(row.at("device"), "cpu");
    EXPECT_EQ(row.at("threads"), 1);
    EXPECT_EQ(row.at("params"), 235146);
    const double median = row.at("samples_per_s");
    EXPECT_GT(median, 0.0);
    EXPECT_LE(row.at("min_samples_per_s").get<double>(), median);
    EXPECT_GE(row.at("max_samples_per_s").get<double>(), median);
    EXPECT_GE(row.at("spread").get<double>(), 0.0);
    EXPECT_EQ(row.at("windows").size(), 5u);
    EXPECT_GE(row.at("steps").get<int>(), 5);
    EXPECT_TRUE(row.at("blas_core").is_string());
    EXPECT_TRUE(std::isfinite(row.at("loss").get<double>()));
  }
}

TEST(BenchComputeCli, RejectsAnUnknownModelWithExitCode2BeforeMeasuring) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  expect_refused(asgd("bench compute --models mlp,vgg16 --seconds 0.2 --json"), 2, "vgg16");
}

TEST(BenchComputeCli, RejectsAnUnknownDeviceWithExitCode2) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  expect_refused(asgd("bench compute --models mlp --device gpu --seconds 0.2"), 2, "gpu");
  expect_refused(asgd("bench compute --models mlp --device cuda:x --seconds 0.2"), 2, "cuda:x");
}

TEST(BenchComputeCli, SaysPlainlyWhenCudaCannotBeUsed) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  if (asgd::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is usable here";
  const CliRun r = asgd("bench compute --models mlp --device cuda --seconds 0.2");
  asgd_test::expect_one_line_error(r, 2, "--device cuda");  // as asgd train says it
}

TEST(BenchComputeCli, RejectsZeroThreadsAndANonPositiveBatch) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  expect_refused(asgd("bench compute --models mlp --threads 0"), 2, "--threads");
  expect_refused(asgd("bench compute --models mlp --batches 0"), 2, "--batches");
  expect_refused(asgd("bench compute --models mlp --batches 1048576"), 2, "--batches");  // bad_alloc, SIGABRT
}

// A list with an empty item ran the items left ("1M,,64K" measured 1M and
// 64K), and a list flag given twice ran both lists: refused, as every other
// flag given twice is.
TEST(BenchComputeCli, AListWithAnEmptyItemOrGivenTwiceIsRefused) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  expect_refused(asgd("bench compute --models mlp,,lenet"), 2, "--models: 'mlp,,lenet': an empty item");
  expect_refused(asgd("bench compute --models mlp --batches 64,"), 2, "--batches: '64,': an empty item");
  expect_refused(asgd("bench compute --models mlp --batches 8 --batches 16"), 2, "--batches given 2 times");
  expect_refused(asgd("bench compute --models mlp --models lenet"), 2, "--models given 2 times");
  expect_refused(asgd("bench comm --sizes ,1M"), 2, "--sizes: ',1M': an empty item");
  expect_refused(asgd("bench allreduce --sizes 1M --sizes 4M"), 2, "--sizes given 2 times");
}

// inf ran for ever; nan was taken.
TEST(BenchComputeCli, RefusesSecondsThatAreNoFiniteNumber) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  expect_refused(asgd("bench compute --models mlp --seconds inf"), 2, "--seconds: expected a number above 0");
  expect_refused(asgd("bench compute --models mlp --warmup nan"), 2, "--warmup: expected a number of 0 or more");
  expect_refused(asgd("bench load --seconds inf"), 2, "--seconds: expected a number above 0");
  expect_refused(asgd("bench load --settle nan"), 2, "--settle");
}

// The job said it of "--workers" after the data was loaded, exit 1.
TEST(BenchComputeCli, BenchRuntimeRefusesABatchLargerThanItsTrainingData) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  ASGD_REQUIRE_DATASET(data, "mnist");
  expect_refused(asgd("bench runtime --batch 55001 --data-dir '" + data.string() + "'"), 2,
                 "--batch 55001: more than the 55000 training samples of mnist");
}

// Refused before minutes of measuring, not after them; an empty path is
// no path, as in every asgd command.
TEST(BenchComputeCli, ABenchWithAFileItCannotWriteOrAnEmptyPathIsRefusedAtOnce) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  expect_refused(asgd("bench load --seconds 600 --json /nonexistent-folder/load.json"), 2,
                 "--json /nonexistent-folder/load.json: its folder /nonexistent-folder does not exist");
  expect_refused(asgd("bench load --json ''"), 2, "--json: an empty path");
  expect_refused(asgd("bench runtime --data-dir ''"), 2, "--data-dir: an empty path");
}

// A mistyped flag of a benchmark is named with the nearest one, as in
// every other command (it was CLI11's "The following arguments were not
// expected: 64 --batchs"); a missing benchmark lists those a user runs.
TEST(BenchComputeCli, AMistypedFlagOrAMissingBenchmarkSaysWhatToType) {
  if (!has_bench_compute()) GTEST_SKIP() << "asgd built without benchmarks";
  const CliRun typo = asgd("bench compute --batchs 64");
  expect_refused(typo, 2, "unknown flag --batchs; did you mean --batches? (asgd bench compute --help lists them)");
  const CliRun none = asgd("bench");
  expect_refused(none, 2, "the commands: runtime, comm, compute, load, allreduce (asgd bench --help says what each does)");
  expect_refused(asgd("bench frob"), 2, "unknown benchmark frob; the benchmarks: runtime, comm, compute, load, allreduce");
}

}  // namespace
