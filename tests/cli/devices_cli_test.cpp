// --device with one device per worker (issue 20): mixed lists train, and a
// device a worker cannot use stops the job naming the worker.

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/cpus.hpp"
#include "cli/cli_run.hpp"
#include "compute/device.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace asgd_test {
namespace {

double final_accuracy(const std::string& metrics) {
  const auto summary = nlohmann::json::parse(metrics.substr(metrics.rfind('\n', metrics.size() - 2) + 1));
  return summary.at("final_test_accuracy").get<double>();
}

// `asgd devices` says what a job can compute on here: the usable CPUs, and
// each GPU with a model started on it, or why there is none.
TEST(DevicesCli, ListsTheUsableCpusAndEachGpuOrWhyThereIsNone) {
  const CliRun r = asgd("devices");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("cpu: " + std::to_string(asgd::usable_cpus()) + " usable CPU(s), OpenBLAS ", 0), 0u) << r.out;
  std::string why;
  const int gpus = asgd::cuda_device_count(&why);
  if (gpus == 0) {
    EXPECT_NE(r.out.find("\ncuda: none: " + why + "\n"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.out.find("\ncuda: " + std::to_string(gpus) + " device(s)"), std::string::npos) << r.out;
    for (int i = 0; i < gpus; ++i)
      EXPECT_NE(r.out.find("cuda:" + std::to_string(i)), std::string::npos) << r.out;
  }
#ifdef ASGD_CUDA_BACKEND
  // A backend that cannot be loaded is no GPU, with the loader's reason.
  const CliRun missing = asgd("devices", {}, "env ASGD_CUDA_BACKEND=/nonexistent/libasgd_cuda.so");
  EXPECT_EQ(missing.exit_code, 0) << missing.err;
  EXPECT_NE(missing.out.find("cuda: none: the CUDA backend (libasgd_cuda.so) could not be loaded: "
                             "/nonexistent/libasgd_cuda.so"),
            std::string::npos)
      << missing.out;
#endif
}

TEST(DevicesCli, AListNeedsOneDevicePerWorkerEachOneKnown) {
  expect_one_line_error(asgd("train --workers 2 --device cpu,cpu,cpu"), 2,
                        "--device cpu,cpu,cpu: 3 devices for 2 workers: give one for all of them, or one per worker");
  expect_one_line_error(asgd("train --workers 2 --device cpu,tpu"), 2, "--device cpu,tpu: worker 1's unknown device 'tpu'");
  // An index past any int was "unknown device"; an empty value read "--device : unknown device ''".
  expect_one_line_error(asgd("train --device cuda:99999999999"), 2,
                        "--device cuda:99999999999: GPU index 99999999999 is past any GPU's");
  expect_one_line_error(asgd("train --device ''"), 2, "--device: an empty value (give cpu, cuda or cuda:K)");
}

TEST(DevicesCli, AGpuMissingHereStopsTheJobNamingTheWorker) {
  if (asgd::cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  expect_one_line_error(asgd("train --workers 2 --device cuda,cpu"), 2,
                        "--device cuda,cpu: worker 0's cuda: no usable CUDA device");
  expect_one_line_error(asgd("cluster --workers 2 --device cpu,cuda:1"), 2,
                        "--device cpu,cuda:1: worker 1's cuda:1: no usable CUDA device");
}

// Async training is not deterministic, and CI's loaded cores skew the measured
// weights: the default job's >= 0.97 is a figure measured over seeds in
// docs/policies.md; here 0.96 (far above chance, 0.1) says the weighted job
// trained. One CI run ended at 0.9696.
constexpr double kTrained = 0.96;

TEST(DevicesCli, OneDevicePerWorkerWithMeasuredWeightsTrainsInOneProcessAndAsProcesses) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir tmp;
  const CliRun one = asgd("train --workers 2 --device cpu,cpu --worker-weights auto --data-dir " + mnist.string() +
                          " --metrics-out " + (tmp / "one.jsonl").string());
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_GE(final_accuracy(slurp(tmp / "one.jsonl")), kTrained);
  // Across processes each worker process measures itself on its own device
  // before the coordinator sizes the shares.
  const CliRun procs = asgd("cluster --workers 2 --device cpu,cpu --worker-weights auto --data-dir " + mnist.string() +
                            " --metrics-out " + (tmp / "procs.jsonl").string());
  ASSERT_EQ(procs.exit_code, 0) << procs.err;
  EXPECT_GE(final_accuracy(slurp(tmp / "procs.jsonl")), kTrained);
  // asgd cluster prints every process's log on stdout, each line tagged.
  for (const char* w : {"[worker 0]", "[worker 1]"})
    EXPECT_NE(procs.out.find(std::string(w) + " "), std::string::npos) << procs.out;
  for (const char* line : {"worker 0: ", "worker 1: "}) {
    EXPECT_NE(procs.out.find(std::string("[coordinator] ")), std::string::npos) << procs.out;
    const auto at = procs.out.find(std::string(line) + "samples [");
    EXPECT_NE(at, std::string::npos) << procs.out;  // the share it was given after calibrating
  }
  // Each process measures its own step cost; the coordinator sizes batches by them.
  EXPECT_NE(procs.out.find("us on cpu in calibration"), std::string::npos) << procs.out;
  EXPECT_NE(procs.out.find("in calibration ("), std::string::npos) << procs.out;
}

}  // namespace
}  // namespace asgd_test
