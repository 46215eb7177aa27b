// The asgd binary as a user meets it: exit codes and one-line errors.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <dlfcn.h>
#include <sys/wait.h>
#include <zlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "compute/device.hpp"
#include "cli/cli_run.hpp"
#include "http_client.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace {

namespace fs = std::filesystem;

using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;
using asgd_test::slurp;

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

// A copy of MNIST in a scratch folder, for damaging one file.
fs::path copy_of_mnist(const fs::path& mnist, const asgd_test::TempDir& scratch) {
  const fs::path dir = scratch / "mnist";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(mnist))
    fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  return dir;
}

TEST(TrainCli, RejectsAnInvalidFlagValueWithExitCode2NamingIt) {
  expect_one_line_error(asgd("train --workers abc"), 2, "--workers");
  expect_one_line_error(asgd("train --workers 0"), 2, "--workers 0");
  expect_one_line_error(asgd("train --policy petuum"), 2, "--policy petuum");
  expect_one_line_error(asgd("train --lr -3"), 2, "--lr");
  expect_one_line_error(asgd("train --dataset imagenet"), 2, "--dataset imagenet");
  // A number, but past a double: said so ("expected a number").
  expect_one_line_error(asgd("train --lr 1e400"), 2, "--lr 1e400: a number past what a double holds");
}

TEST(TrainCli, RejectsAnUnknownModelOrDeviceWithExitCode2) {
  expect_one_line_error(asgd("train --model vgg"), 2, "--model vgg");
  expect_one_line_error(asgd("train --device tpu"), 2, "--device tpu");
  expect_one_line_error(asgd("train --device cuda:x"), 2, "--device cuda:x");
}

TEST(TrainCli, RefusesCudaWithoutAUsableGpuSayingWhy) {
  if (asgd::cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  expect_one_line_error(asgd("train --device cuda"), 2, "no usable CUDA device");
  // Why, in plain words: a build without the backend (the sanitizer builds)
  // says so; with it, no driver here means no GPU.
  std::string why;
  (void)asgd::cuda_device_count(&why);
  std::error_code ec;
  if (why.find("no CUDA backend") != std::string::npos)
    expect_one_line_error(asgd("train --device cuda"), 2, "this build of asgd has no CUDA backend");
  else if (!std::filesystem::exists("/dev/nvidiactl", ec))
    expect_one_line_error(asgd("train --device cuda"), 2, "no NVIDIA GPU found");
}

// The CUDA backend is a plugin (compute/cuda_backend.hpp) that asgd loads
// only when a job asks for a GPU: the CLI links none of CUDA's libraries,
// and a plugin that cannot be used is no GPU, with what went wrong named.
TEST(TrainCli, LinksNoCudaLibraryAndAPluginThatCannotBeUsedIsNoGpuSayingWhy) {
#ifndef ASGD_CUDA_BACKEND
  GTEST_SKIP() << "this build has no CUDA backend";
#endif
  const asgd_test::TempDir tmp("plugin");
  const auto listed = tmp.path() / "ldd";
  ASSERT_EQ(std::system(("ldd " + std::string(asgd_test::asgd_cli_path()) + " >" + listed.string()).c_str()), 0);
  const std::string ldd = asgd_test::slurp(listed);
  for (const char* lib : {"libcudart", "libcublas", "libcudnn"})
    EXPECT_EQ(ldd.find(lib), std::string::npos) << "asgd links " << lib << ":\n" << ldd;
  const std::string missing = (tmp.path() / "libasgd_cuda.so").string();
  expect_one_line_error(asgd("train --device cuda", {}, "env ASGD_CUDA_BACKEND=" + missing), 2,
                        "the CUDA backend (libasgd_cuda.so) could not be loaded: " + missing);
  // A library that is not asgd's backend: zlib's, which this process has.
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&zlibVersion), &info), 0);
  expect_one_line_error(asgd("train --device cuda", {}, std::string("env ASGD_CUDA_BACKEND=") + info.dli_fname), 2,
                        std::string(info.dli_fname) + " has no asgd_cuda_backend");
  // Another build's plugin is refused before anything in it is called (the
  // fake's entry point aborts).
  const std::string fake = asgd_test::built_test_library(ASGD_FAKE_CUDA_BACKEND_PATH, "libfake_cuda_backend.so");
  expect_one_line_error(asgd("train --device cuda", {}, "env ASGD_CUDA_BACKEND=" + fake), 2,
                        fake + " is the CUDA backend of another build of asgd (build another-build");
}

// A job of one shard and one worker as three processes started by hand:
// the coordinator's and the worker's runs.
struct ByHand {
  CliRun coordinator, worker;
};
ByHand run_by_hand(const std::string& coordinator_flags, const std::string& worker_flags) {
  const std::string mnist = asgd_test::dataset_dir("mnist").string();
  const int port = asgd_test::free_port();
  EXPECT_GT(port, 0);
  const std::string at = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator = std::async(std::launch::async, [&] {
    return asgd("coordinator " + coordinator_flags + " --workers 1 --shards 1 --join-timeout 30 --listen " + at +
                " --data-dir " + mnist);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto shard = std::async(std::launch::async, [&] { return asgd("shard --coordinator " + at); });
  ByHand runs;
  runs.worker = asgd("worker " + worker_flags + " --coordinator " + at + " --data-dir " + mnist);
  runs.coordinator = coordinator.get();
  shard.get();
  return runs;
}

// Issue 20: the coordinator's host need not have the workers' GPU. A
// coordinator for --device cuda starts here without one; the worker that
// lacks the GPU refuses, naming its host, and the job ends with that.
TEST(ClusterCli, TheDeviceIsCheckedWhereTheWorkerRunsNotOnTheCoordinatorsHost) {
  if (asgd::cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const ByHand r = run_by_hand("--device cuda", "");
  EXPECT_EQ(r.worker.exit_code, 2) << r.worker.err;
  EXPECT_EQ(r.coordinator.exit_code, 2) << r.coordinator.err;
  EXPECT_NE(r.coordinator.err.find("worker 0: --device cuda: no usable CUDA device"), std::string::npos)
      << r.coordinator.err;
  EXPECT_NE(r.coordinator.err.find("(on "), std::string::npos) << "the worker's host is not named: " << r.coordinator.err;
}

// `asgd worker --device D` computes on D whatever the job's --device
// says for its index: here on the CPU of a job meant for GPUs, which then
// finishes on any machine.
TEST(ClusterCli, AWorkersDeviceFlagReplacesTheJobsItemForIt) {
  expect_one_line_error(asgd("worker --coordinator tcp://127.0.0.1:1 --device gpu"), 2,
                        "--device: unknown device 'gpu' (expected cpu, cuda or cuda:K)");
  // A GPU this host lacks, said before joining (it waited out --join-timeout
  // when no coordinator answered, then said "timeout").
  if (asgd::cuda_device_count() == 0) {
    const auto asked = std::chrono::steady_clock::now();
    expect_one_line_error(asgd("worker --coordinator tcp://127.0.0.1:1 --device cuda:0"), 2,
                          "--device cuda:0: no usable CUDA device");
    EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(10));
  }
  const ByHand r = run_by_hand("--device cuda:7 --epochs 1", "--device cpu");
  EXPECT_EQ(r.worker.exit_code, 0) << r.worker.err;
  ASSERT_EQ(r.coordinator.exit_code, 0) << r.coordinator.err;
  EXPECT_NE(r.coordinator.out.find("done: test accuracy"), std::string::npos) << r.coordinator.out;
}

// An --index past the job's processes, or one another process holds, is
// refused by name (it used to become another index without a word).
TEST(ClusterCli, AnIndexOutOfRangeOrTakenIsRefusedByName) {
  const std::string mnist = asgd_test::dataset_dir("mnist").string();
  const int port = asgd_test::free_port();
  ASSERT_GT(port, 0);
  const std::string at = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator = std::async(std::launch::async, [&] {
    return asgd("coordinator --workers 2 --shards 1 --join-timeout 8 --listen " + at + " --data-dir " + mnist);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto shard = std::async(std::launch::async, [&] { return asgd("shard --coordinator " + at + " --index 0"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  expect_one_line_error(asgd("worker --coordinator " + at + " --index 5"), 2,
                        "--index 5: the job has 2 worker process(es), 0 to 1");
  expect_one_line_error(asgd("shard --coordinator " + at + " --index 0"), 2, "--index 0: shard 0 is taken (pid ");
  // Under a launcher the index is the rank's: a refusal names the rank.
  auto worker = std::async(std::launch::async, [&] { return asgd("worker --coordinator " + at + " --index 0"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const CliRun twin = asgd("cluster --shards 1 --workers 2", {},
                           "env ASGD_RANK=2 ASGD_WORLD_SIZE=4 ASGD_COORDINATOR=" + at);
  EXPECT_EQ(twin.exit_code, 2) << twin.err;
  EXPECT_NE(twin.err.find("rank 2 (ASGD_RANK): worker 0 is taken (pid "), std::string::npos) << twin.err;
  coordinator.get();  // (the second worker never came: it gives up at --join-timeout)
  shard.get();
  worker.get();
}

// During the job, a second process for a live shard is refused at once
// when the job writes no checkpoints (it used to be told the shard 'cannot
// be restarted', as if it were dead), with exit status 2 like every
// refusal of the process's own doing (the shutdown's refused flag).
TEST(ClusterCli, ASecondProcessForALiveShardDuringTheJobIsRefusedAsAUsageError) {
  const std::string mnist = asgd_test::dataset_dir("mnist").string();
  const int port = asgd_test::free_port();
  ASSERT_GT(port, 0);
  const std::string at = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator = std::async(std::launch::async, [&] {
    return asgd("coordinator --workers 1 --shards 1 --epochs 6 --join-timeout 20 --listen " + at + " --data-dir " +
                mnist);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto shard = std::async(std::launch::async, [&] { return asgd("shard --coordinator " + at); });
  auto worker = std::async(std::launch::async, [&] { return asgd("worker --coordinator " + at); });
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // training
  expect_one_line_error(asgd("shard --coordinator " + at + " --index 0"), 2, "shard 0 is alive (pid ");
  EXPECT_EQ(coordinator.get().exit_code, 0);
  EXPECT_EQ(shard.get().exit_code, 0);
  EXPECT_EQ(worker.get().exit_code, 0);
}

TEST(TrainCli, RefusesAJobWhoseWorkersGetLessThanABatchEachWithAdvice) {
  const CliRun r = asgd("train --data-dir " + asgd_test::dataset_dir("mnist").string() + " --workers 64 --batch 4096");
  // (After the data has loaded: its size decides.)
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("asgd: error: --workers 64 with --batch 4096: worker 0's share of the 55000 training samples "
                       "is 860, less than its batch of 4096"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("use fewer workers or a --batch of at most 859"), std::string::npos) << r.err;
}

TEST(ExportCli, ATrainedLenetLoadsIntoTorchWithTheSameTestAccuracy) {
  const fs::path mnist = asgd_test::dataset_dir("mnist");
  const asgd_test::TempDir dir;
  const fs::path metrics = dir.path() / "m.jsonl";
  const CliRun train = asgd("train --data-dir " + mnist.string() + " --model lenet --epochs 1 --checkpoint-dir " +
                            dir.path().string() + " --metrics-out " + metrics.string());
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const fs::path out = dir.path() / "lenet.safetensors";
  const CliRun exported = asgd("export --checkpoint " + dir.path().string() + " --out " + out.string());
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_NE(exported.out.find("8 tensors"), std::string::npos) << exported.out;

  const std::string script = std::string(ASGD_SOURCE_DIR) + "/tests/runtime/load_safetensors.py";
  const fs::path result = dir.path() / "torch.json";
  const int status = std::system(("/usr/bin/python3 " + script + " " + out.string() + " " + mnist.string() + " >" +
                                  result.string() + " 2>" + (dir.path() / "py.err").string())
                                     .c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77) GTEST_SKIP() << slurp(dir.path() / "py.err");
  ASSERT_EQ(code, 0) << slurp(dir.path() / "py.err");
  const double torch_accuracy = nlohmann::json::parse(slurp(result))["accuracy"].get<double>();
  const std::string last = [&] {
    std::istringstream lines_in(slurp(metrics));
    std::string line, previous;
    while (std::getline(lines_in, line)) previous = line;
    return previous;
  }();
  const double ours = nlohmann::json::parse(last)["final_test_accuracy"].get<double>();
  EXPECT_GT(ours, 0.9);
  EXPECT_NEAR(torch_accuracy, ours, 0.001);  // within 0.1 percentage points
}

TEST(ExportCli, AMissingCheckpointIsExitCode2AndADamagedOneExitCode1) {
  const asgd_test::TempDir dir;
  expect_one_line_error(asgd("export --checkpoint " + (dir.path() / "none").string() + " --out x.safetensors"), 2,
                        "no checkpoint");
  std::ofstream(dir.path() / "model.ckpt") << "ASGDCKPT but not really";
  expect_one_line_error(asgd("export --checkpoint " + dir.path().string() + " --out x.safetensors"), 1,
                        "model.ckpt");
  expect_one_line_error(asgd("export --out x.safetensors"), 2, "--checkpoint");
}

// --out is checked before anything is read or written: a folder, a pipe
// or device (which the write's rename would replace), the checkpoint being
// exported, or a file in a folder that does not exist is a usage error,
// and nothing is created or replaced.
TEST(ExportCli, RefusesAnOutputThatIsNotANewOrRegularFileOrIsTheCheckpointItself) {
  const asgd_test::TempDir dir;
  const std::string d = dir.path().string();
  std::ofstream(dir.path() / "model.ckpt") << "ASGDCKPT but not really";
  ASSERT_EQ(mkfifo((dir.path() / "pipe").c_str(), 0600), 0);
  const std::string from = "export --checkpoint " + d + " --out ";
  expect_one_line_error(asgd(from + d), 2, "is not a regular file (a folder)");
  expect_one_line_error(asgd(from + d + "/pipe"), 2, "is not a regular file (a device, pipe or socket)");
  expect_one_line_error(asgd(from + d + "/model.ckpt"), 2, "is the checkpoint being exported");
  expect_one_line_error(asgd(from + d + "/missing/x.safetensors"), 2, "the folder " + d + "/missing does not exist");
  // The files a --resume reads beside it (a shard's was overwritten).
  std::ofstream(dir.path() / "shard-0.ckpt") << "shard";
  expect_one_line_error(asgd(from + d + "/shard-0.ckpt"), 2, "shard-0.ckpt is the name of a checkpointed job's own file (asgd export, --resume or its shards read it)");
  EXPECT_EQ(slurp(dir.path() / "shard-0.ckpt"), "shard");
  fs::remove(dir.path() / "shard-0.ckpt");
  EXPECT_FALSE(fs::exists(dir.path() / "missing"));
  EXPECT_TRUE(fs::is_fifo(dir.path() / "pipe"));
  EXPECT_EQ(slurp(dir.path() / "model.ckpt"), "ASGDCKPT but not really");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2) << "litter left behind";
}

TEST(TrainCli, RejectsAnUnwritableMetricsFileWithExitCode2) {
  expect_one_line_error(asgd("train --metrics-out /nonexistent/dir/m.jsonl"), 2, "/nonexistent/dir/m.jsonl");
}

// A value out of range in a config file names the file, as a value of the
// wrong type does; the same value as a flag does not.
TEST(TrainCli, AConfigFilesValueOutOfRangeNamesTheFile) {
  const asgd_test::TempDir dir;
  const std::string file = (dir / "c.toml").string();
  std::ofstream(file) << "lr = -0.5\n";
  expect_one_line_error(asgd("train --config " + file), 2, "config file " + file + ": --lr -0.5: must be a positive");
  const std::string easgd = (dir / "easgd.toml").string();
  std::ofstream(easgd) << "policy = \"easgd\"\nmoving-rate = 0.0\n";
  expect_one_line_error(asgd("train --config " + easgd), 2,
                        "config file " + easgd + ": --policy easgd: --moving-rate 0: must be > 0");
  const CliRun flag = asgd("train --config " + file + " --lr -1");
  expect_one_line_error(flag, 2, "--lr -1: must be a positive");
  EXPECT_EQ(flag.err.find("config file"), std::string::npos) << flag.err;
}

// Values past what a clock or a machine can take are refused, naming the
// flag: they used to overflow (an --rpc-timeout of 1e10 s timed out at
// once, a straggler factor of 1e30 slowed nothing) or to harm (a
// --heartbeat-timeout under the 1 s heartbeat killed healthy processes,
// 100000 threads a worker ran 280 times slower).
TEST(TrainCli, RefusesValuesThatWouldOverflowAClockOrHarmTheJob) {
  const std::pair<const char*, const char*> cases[] = {
      {"--heartbeat-timeout 0.5", "--heartbeat-timeout 0.5: must be at least 2 s"},
      {"--rpc-timeout 1e10", "--rpc-timeout 1e+10: must be more than 0 s and at most a week"},
      {"--eval-every 1e300", "--eval-every 1e+300: must be a number of seconds from 0 to a week"},
      {"--threads 100000", "--threads 100000: must be at most 256"},
      {"--prefetch 100000000", "--prefetch 100000000: must be at most 256"},
      {"--straggler 0:1e30", "needs a factor of at least 1 and at most 1000000"},
      {"--straggler pause:0:100:1e10", "needs a pause of more than 0 s and at most 1 day"}};
  for (const auto& [flags, error] : cases) expect_one_line_error(asgd(std::string("train ") + flags), 2, error);
  expect_one_line_error(asgd("cluster --join-timeout -1"), 2, "--join-timeout: expected a number above 0 and at most 604800");
  expect_one_line_error(asgd("worker --coordinator tcp://127.0.0.1:5 --join-timeout 1e30"), 2, "got 1e30");
  // Endpoints: ZeroMQ bound port 99999 as 34463, and an empty host waited out --join-timeout.
  expect_one_line_error(asgd("coordinator --listen tcp://127.0.0.1:99999"), 2,
                        "--listen: tcp://127.0.0.1:99999: expected tcp://HOST:PORT with a port from 1 to 65535 (or 0");
  expect_one_line_error(asgd("worker --coordinator tcp://:5"), 2, "--coordinator: tcp://:5: expected tcp://HOST:PORT");
  // A host name to listen on is its address (ZeroMQ took it for an
  // interface: "No such device", exit 1); one that does not resolve is
  // refused.
  expect_one_line_error(asgd("coordinator --listen tcp://nosuch.invalid:0"), 2,
                        "--listen: nosuch.invalid is no interface here and does not resolve");
  // A coordinator's name that does not resolve is said when the wait ends
  // (ZeroMQ tries again and again without a word).
  expect_one_line_error(asgd("worker --coordinator tcp://nosuch.invalid:5 --join-timeout 1"), 1,
                        "within 1 s (--join-timeout); cannot resolve nosuch.invalid");
  const CliRun named = asgd("coordinator --listen tcp://localhost:0 --workers 1 --join-timeout 1");
  EXPECT_NE(named.out.find("coordinator listening on tcp://127.0.0.1:"), std::string::npos) << named.out << named.err;
}

// An empty path is an unset shell variable, not "none": `--metrics-out
// "$OUT"` trained without a metrics file. Every FILE, DIR or PATH flag of
// every command refuses it.
TEST(TrainCli, AnEmptyPathFlagIsRefusedInEveryCommand) {
  for (const char* command : {"train --metrics-out", "train --config", "train --log-file", "cluster --checkpoint-dir",
                              "train --resume", "data fetch mnist --data-dir",
                              "worker --coordinator tcp://127.0.0.1:5 --data-dir"}) {
    const std::string flag = std::string(command).substr(std::string(command).rfind(" --") + 1);
    expect_one_line_error(asgd(std::string(command) + " ''"), 2, flag + ": an empty path (leave the flag out for none)");
  }
  // A flag that cannot be left out asks for a path instead.
  for (const char* command : {"export --checkpoint", "export --checkpoint ck --out", "compare --policies bsp --out"}) {
    const std::string flag = std::string(command).substr(std::string(command).rfind(" --") + 1);
    expect_one_line_error(asgd(std::string(command) + " ''"), 2, flag + ": an empty path (give one)");
  }
  // Left out unquoted, the path is the next flag: a file named --help was
  // written, and the job ran.
  expect_one_line_error(asgd("train --epochs 1 --metrics-out --help"), 2,
                        "--metrics-out: '--help' is a flag, not a path: was the value left out?");
  expect_one_line_error(asgd("train --log-file -h"), 2, "--log-file: '-h' is a flag, not a path");
}

// Values past what the job can carry: a --seed of 2^63 was taken, then
// refused in its own job.toml (and by asgd cluster's shards); a worker's
// --index of -1 or past 2^32 became another index without a word.
TEST(TrainCli, ASeedOrIndexPastWhatTheJobCarriesIsRefused) {
  expect_one_line_error(asgd("train --seed 9223372036854775808"), 2,
                        "--seed 9223372036854775808: expected an integer from 0 to 9223372036854775806");
  for (const char* index : {"-1", "4294967296"})
    expect_one_line_error(asgd(std::string("worker --coordinator tcp://127.0.0.1:5 --index ") + index), 2,
                          "--index: Value " + std::string(index) + " not in range 0 to 4294967295");
}

// As a launcher prefix for asgd(): mpirun's variables for rank `rank` of 4
// (local rank `local`), and `more` after them.
std::string under_mpirun(int rank, int local, const std::string& more = "") {
  return "env OMPI_COMM_WORLD_RANK=" + std::to_string(rank) +
         " OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=" + std::to_string(local) + " " + more;
}

// Ranks under a launcher (mpirun's variables here) refuse at once what they
// cannot use, and say what they waited for. A --rendezvous path that is a
// folder is refused on every rank, and the folder left alone (rank 0
// crashed at the end removing a full one, and deleted an empty one); one in
// a folder that does not exist is refused by rank 0 at once (it waited out
// --join-timeout); then a stale rendezvous file, a missing GPU in
// --print-layout, an --address not of this host, and the 2 s a rank gives
// rank 0's verdict past --join-timeout.
TEST(ClusterCli, UnderALauncherEachRankRefusesWhatItCannotUseAtOnceAndSaysWhatItWaitedFor) {
  const asgd_test::TempDir dir;
  fs::create_directories(dir.path() / "folder");
  std::ofstream(dir.path() / "folder" / "kept") << "x";
  const std::string job = "cluster --shards 1 --workers 2 --epochs 1 --join-timeout 30 --rendezvous ";
  for (const int rank : {0, 1, 3})
    expect_one_line_error(asgd(job + (dir.path() / "folder").string(), {}, under_mpirun(rank, rank)), 2,
                          "not a regular file");
  EXPECT_TRUE(fs::exists(dir.path() / "folder" / "kept"));
  expect_one_line_error(asgd(job + (dir.path() / "no" / "rv").string(), {}, under_mpirun(0, 0)), 2,
                        "/no does not exist");
  // A folder that passes the check but takes no file (/proc, as root
  // /sys): rank 0 stops at once, where it logged the error and waited out
  // --join-timeout for ranks that could not find it.
  const auto started = std::chrono::steady_clock::now();
  const CliRun unwritable = asgd(job + "/proc/rv", {}, under_mpirun(0, 0));
  EXPECT_EQ(unwritable.exit_code, 2) << unwritable.err;
  EXPECT_NE(unwritable.err.find("asgd: error: --rendezvous /proc/rv: cannot write /proc/rv.tmp"), std::string::npos)
      << unwritable.err;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
  // Where the launcher names rank 0's endpoint (Slurm's first node here),
  // the others dial that: rank 0 listens on every interface, rendezvous
  // file or not (it bound its host name's address, which they never dialed).
  const CliRun given = asgd("cluster --shards 1 --workers 2 --print-layout --rendezvous " + (dir / "rv").string(), {},
                             "env SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_STEP_NODELIST=192.0.2.2 SLURM_JOB_ID=77 "
                             "SLURM_STEP_ID=0");
  EXPECT_EQ(given.exit_code, 0) << given.err;
  EXPECT_NE(given.out.find("listens on: tcp://*:"), std::string::npos) << given.out;
  // A rank given other --shards and --workers than rank 0's asks for
  // another rank's slot: refused at once, saying so (it took the slot, and
  // rank 0 later blamed a rank that had come for the one missing).
  {
    const int port = asgd_test::free_port();
    ASSERT_GT(port, 0);
    const std::string env = "env ASGD_WORLD_SIZE=4 ASGD_COORDINATOR=tcp://127.0.0.1:" + std::to_string(port) + " ";
    auto rank0 = std::async(std::launch::async, [&] {
      return asgd("cluster --shards 1 --workers 2 --epochs 1 --join-timeout 5", {}, env + "ASGD_RANK=0");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const CliRun rank3 = asgd("cluster --shards 2 --workers 1 --epochs 1 --join-timeout 5", {}, env + "ASGD_RANK=3");
    EXPECT_EQ(rank3.exit_code, 2) << rank3.err;
    EXPECT_NE(rank3.err.find("rank 3 (ASGD_RANK) asks for worker 0, which is rank 2's in rank 0's job (1 shard(s), 2 "
                             "worker(s)); give every rank the same --shards and --workers"),
              std::string::npos)
        << rank3.err;
    rank0.get();
  }
  // A shard rank whose rank 0 has a name that does not resolve yet (a
  // Kubernetes pod's before its Service has it) asks again until
  // --join-timeout, as a worker rank waits (it ended at once).
  const auto asked = std::chrono::steady_clock::now();
  const CliRun unresolved = asgd("cluster --shards 1 --workers 2 --epochs 1 --join-timeout 2", {},
                                 "env JOB_COMPLETION_INDEX=1 ASGD_WORLD_SIZE=4 "
                                 "ASGD_COORDINATOR=tcp://asgd-nope.invalid:29500");
  EXPECT_EQ(unresolved.exit_code, 1) << unresolved.err;
  EXPECT_NE(unresolved.err.find("cannot resolve asgd-nope.invalid"), std::string::npos) << unresolved.err;
  EXPECT_NE(unresolved.err.find("asking again until --join-timeout"), std::string::npos) << unresolved.err;
  EXPECT_GE(std::chrono::steady_clock::now() - asked, std::chrono::milliseconds(1500));
  // A rendezvous file left by another run (Open MPI's job id says which) is
  // passed over and named, not read: its endpoint sent a rank to a job that
  // was gone, or to the wrong one.
  std::ofstream(dir.path() / "stale") << "tcp://127.0.0.1:1\nrun OMPI_MCA_ess_base_jobid=111\n";
  const CliRun stale = asgd("cluster --shards 1 --workers 2 --join-timeout 1 --rendezvous " +
                                (dir.path() / "stale").string(),
                            {}, under_mpirun(1, 1, "OMPI_MCA_ess_base_jobid=222"));
  EXPECT_EQ(stale.exit_code, 1) << stale.err;
  EXPECT_NE(stale.err.find("it holds another run's (run OMPI_MCA_ess_base_jobid=111, this one is "
                           "OMPI_MCA_ess_base_jobid=222)"),
            std::string::npos)
      << stale.err;
  // --print-layout checks a worker rank's device as the worker would.
  if (asgd::cuda_device_count() == 0) {
    const CliRun layout = asgd("cluster --shards 1 --workers 2 --device cuda --print-layout --rendezvous " +
                                   (dir.path() / "rv").string(),
                               {}, under_mpirun(2, 0));
    EXPECT_EQ(layout.exit_code, 0) << layout.err;
    EXPECT_NE(layout.out.find("device: cuda (on this host, no usable CUDA device"), std::string::npos) << layout.out;
    EXPECT_NE(layout.out.find("the worker would refuse to start)"), std::string::npos) << layout.out;
  }
  // An --address this host cannot listen on: a usage error naming the flag
  // before anything starts (it was a bind failure, exit 1). 192.0.2.1 is
  // TEST-NET-1, never a local address.
  expect_one_line_error(asgd("cluster --shards 1 --workers 2 --address 192.0.2.1 --rendezvous " +
                                 (dir.path() / "rv").string(),
                             {}, under_mpirun(0, 0)),
                        2, "--address 192.0.2.1: this host cannot listen there");
  // A rank other than 0 waits 2 s past --join-timeout, to hear rank 0's
  // verdict first, and says so (it said "within 4 s (--join-timeout)").
  const auto port = asgd_test::free_port();
  const CliRun late = asgd("cluster --shards 1 --workers 2 --join-timeout 2", {},
                           under_mpirun(2, 2, "ASGD_COORDINATOR=tcp://127.0.0.1:" + std::to_string(port)));
  EXPECT_EQ(late.exit_code, 1) << late.err;
  EXPECT_NE(late.err.find("within 4 s (--join-timeout 2, and 2 s to hear rank 0)"), std::string::npos) << late.err;
}

// A log file that cannot be written (a full disk) is said once on stderr;
// the job goes on (it used to lose the lines silently).
TEST(TrainCli, ALogFileThatCannotBeWrittenIsSaidOnceAndTheJobGoesOn) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const CliRun r = asgd("train --epochs 1 --log-file /dev/full --data-dir " + asgd_test::dataset_dir("mnist").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string said = "asgd: warning: --log-file /dev/full: Failed flush to file /dev/full";
  const auto first = r.err.find(said);
  EXPECT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(said, first + 1), std::string::npos) << "said more than once:\n" << r.err;
}

// Outputs that cannot be written are refused before training, not after
// it: a folder in place of the model's checkpoint (train), a folder for
// the metrics file (cluster: at once, not after waiting for the others).
TEST(ClusterCli, AnUnwritableOutputIsRefusedBeforeTrainingAndAtOnce) {
  const asgd_test::TempDir dir;
  const std::string mnist = asgd_test::dataset_dir("mnist").string();
  fs::create_directories(dir.path() / "ck" / "model.ckpt");
  expect_one_line_error(asgd("train --data-dir " + mnist + " --checkpoint-dir " + (dir.path() / "ck").string()), 2,
                        "model.ckpt is not a regular file");
  const auto start = std::chrono::steady_clock::now();
  const CliRun r = asgd("cluster --epochs 1 --data-dir " + mnist + " --metrics-out " + dir.path().string());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  EXPECT_NE((r.out + r.err).find("--metrics-out " + dir.path().string() + ": a folder, not a file"), std::string::npos)
      << r.out << r.err;
  EXPECT_LT(took, 8.0) << "waited out the others' grace" << r.out;
}

TEST(TrainCli, RejectsAnUnknownFlagWithExitCode2) {
  expect_one_line_error(asgd("train --wrokers 2"), 2, "wrokers");
  // A flag given twice says so (CLI11: "At Most 1 required but received 2").
  expect_one_line_error(asgd("train --epochs 1 --epochs 2"), 2, "--epochs given 2 times; give it once");
  // A switch too (it was taken twice without a word).
  expect_one_line_error(asgd("keys generate --out k --force --force"), 2, "--force given 2 times; give it once");
}

TEST(Cli, AsgdAlonePrintsItsHelpAndHowToTrainTheDefaultJob) {
  const CliRun r = asgd("");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Train the embedded default job: asgd train"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("final_test_accuracy"), std::string::npos) << "it must not train";
}

TEST(TrainCli, AnUnknownFlagGetsTheNearestKnownOneAndWhereTheListIs) {
  expect_one_line_error(asgd("train --worker 2"), 2,
                        "unknown flag --worker; did you mean --workers? (asgd train --help lists them)");
  expect_one_line_error(asgd("train --epoch=2"), 2, "did you mean --epochs?");
  expect_one_line_error(asgd("train --zzzzzzzz"), 2, "unknown flag --zzzzzzzz (asgd train --help lists them)");
  expect_one_line_error(asgd("traim"), 2, "unknown command traim; did you mean train? the commands: train, compare");
  // A required flag misspelt is the unknown flag, not the missing one ("--policies is required").
  expect_one_line_error(asgd("compare --polices async --out x"), 2,
                        "unknown flag --polices; did you mean --policies? (asgd compare --help lists them)");
  expect_one_line_error(asgd("export --out x"), 2, "--checkpoint is required");
}

TEST(TrainCli, ReportsAMissingDataDirectoryWithExitCode2) {
  expect_one_line_error(asgd("train --data-dir /nonexistent/mnist"), 2, "/nonexistent/mnist");
}

TEST(TrainCli, ReportsATruncatedIdxFileByNameWithExitCode1) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path dir = copy_of_mnist(mnist, scratch);
  const fs::path victim = dir / "train-images-idx3-ubyte.gz";
  fs::resize_file(victim, fs::file_size(victim) / 2);
  expect_one_line_error(asgd("train --data-dir " + dir.string()), 1, victim.string());
}

TEST(TrainCli, ReportsACorruptIdxFileByNameWithExitCode1) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path dir = copy_of_mnist(mnist, scratch);
  // An uncompressed label file with a wrong magic number takes precedence
  // only if the .gz is gone.
  fs::remove(dir / "t10k-labels-idx1-ubyte.gz");
  std::ofstream(dir / "t10k-labels-idx1-ubyte", std::ios::binary) << std::string("\x00\x00\x09\x99\x00\x00\x00\x01\x05", 9);
  expect_one_line_error(asgd("train --data-dir " + dir.string()), 1, (dir / "t10k-labels-idx1-ubyte").string());
}

TEST(TrainCli, ReportsABadConfigFileWithExitCode2) {
  const asgd_test::TempDir scratch;
  const fs::path cfg = scratch / "bad.toml";
  std::ofstream(cfg) << "epochs = \"three\"\n";
  expect_one_line_error(asgd("train --config " + cfg.string()), 2, "epochs");
  // (A folder used to read as a huge stream: std::bad_alloc; a device as an endless one.)
  expect_one_line_error(asgd("train --config " + scratch.path().string()), 2, "is not a regular file");
  expect_one_line_error(asgd("train --config /dev/zero"), 2, "config file /dev/zero is not a regular file");
}

TEST(TrainCli, ATomlSyntaxErrorNamesTheFileLineAndColumnInOneLine) {
  const asgd_test::TempDir scratch;
  const fs::path cfg = scratch / "broken.toml";
  std::ofstream(cfg) << "workers = 2\nepochs = = 3\n";
  const CliRun r = asgd("train --config " + cfg.string());
  expect_one_line_error(r, 2, "config file " + cfg.string() + ", line 2, column 10: ");
  EXPECT_NE(r.err.find("(`epochs = = 3`)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("toml::"), std::string::npos) << "no parser internals: " << r.err;
}

TEST(TrainCli, TrainsAndWritesTheSummaryAsTheLastMetricsLine) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path metrics = scratch / "cli.jsonl";
  const fs::path cfg = scratch / "job.toml";
  std::ofstream(cfg) << "epochs = 1\nworkers = 2\nvalidation-size = 1000\n";
  // The flag overrides the file.
  CliRun r = asgd("train --config " + cfg.string() + " --shards 2 --data-dir " + mnist.string() + " --metrics-out " +
               metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("epoch 1/1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 shards"), std::string::npos) << r.out;
  const std::string m = slurp(metrics);
  ASSERT_EQ(lines(m), 2u) << m;
  const std::string last = m.substr(m.rfind('\n', m.size() - 2) + 1);
  EXPECT_NE(last.find("\"event\":\"summary\""), std::string::npos) << last;
  // The settings the job ran with, defaults included: async's two
  // intervals, the default lr and momentum.
  const nlohmann::json summary = nlohmann::json::parse(last);
  EXPECT_EQ(summary.at("policy_options").dump(), R"({"fetch-every":1,"push-every":1})") << last;
  EXPECT_DOUBLE_EQ(summary.at("lr").get<double>(), 0.02);
  EXPECT_DOUBLE_EQ(summary.at("momentum").get<double>(), 0.9);
}

TEST(TrainCli, ResumeFromAFolderWithoutJobSettingsIsAUsageErrorSayingWhatIsMissing) {
  const asgd_test::TempDir scratch;
  expect_one_line_error(asgd("train --resume " + scratch.path().string()), 2, "no job.toml there");
}

// Across processes only: heartbeats are between processes, and asgd train
// --rpc-timeout 5 was refused for the default --heartbeat-timeout 10 it
// never uses (the missing data folder says the settings passed).
TEST(TrainCli, HeartbeatTimeoutMustBeBelowTheRpcTimeoutAcrossProcesses) {
  expect_one_line_error(asgd("cluster --heartbeat-timeout 60 --rpc-timeout 30"), 2,
                        "--heartbeat-timeout 60: must be below --rpc-timeout (30 s)");
  expect_one_line_error(asgd("train --rpc-timeout 5 --data-dir /nonexistent"), 2, "data directory /nonexistent does not exist");
}

// Every page names its values the same way (FILE, DIR, N, S, NAME, ...),
// never with the parser's type names or its validators' descriptions.
TEST(HelpPages, NameValuesInWordsNotInTheParsersTypes) {
  for (const char* page : {"", "train", "compare", "cluster", "coordinator", "shard", "worker", "export", "keys",
                           "keys generate", "bench", "bench runtime", "bench comm", "bench compute", "bench load",
                           "bench allreduce"}) {
    CliRun r = asgd(std::string(page) + " --help");
    EXPECT_EQ(r.exit_code, 0) << page;
    for (const char* parser_word : {" TEXT", " UINT", " INT", " FLOAT", " BOOLEAN", ":POSITIVE", ":NONNEGATIVE",
                                    " in ["})
      EXPECT_EQ(r.out.find(parser_word), std::string::npos) << "asgd " << page << " --help shows '" << parser_word
                                                            << "':\n" << r.out;
  }
}

// One-process commands list the flags that matter only across processes
// under a heading of their own.
TEST(HelpPages, TrainListsTheAcrossProcessFlagsApart) {
  CliRun r = asgd("train --help");
  const auto heading = r.out.find("Across processes");
  ASSERT_NE(heading, std::string::npos) << r.out;
  EXPECT_GT(r.out.find("--heartbeat-timeout"), heading);
  EXPECT_GT(r.out.find("--compress"), heading);
  EXPECT_LT(r.out.find("--rpc-timeout"), heading);
}

TEST(TrainCli, PrintsHelpAndExitsZero) {
  CliRun r = asgd("train --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--workers"), std::string::npos);
  EXPECT_NE(r.out.find("--metrics-out"), std::string::npos);
}

}  // namespace

namespace {

TEST(TrainCli, StopsADivergingJobWithExitCode1SayingSo) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  CliRun r = asgd("train --lr 1000 --epochs 1 --validation-size 1000 --log-level off --data-dir " + mnist.string());
  expect_one_line_error(r, 1, "training diverged");
  EXPECT_NE(r.err.find("--lr"), std::string::npos) << r.err;
}

}  // namespace

namespace {

TEST(ClusterCli, RunsTheJobAsFiveProcessesAndWritesTheSameMetricsFormat) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path metrics = scratch / "cluster.jsonl";
  // --busy-poll-us goes to every shard and worker process (each would
  // refuse a flag it does not take, and the job would fail).
  CliRun r = asgd("cluster --workers 2 --shards 2 --epochs 1 --data-dir " + mnist.string() + " --metrics-out " +
                  metrics.string() + " --log-level warn --busy-poll-us 20");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // The job is named as asgd train names it, before its processes start.
  for (const char* line : {"asgd cluster: mlp on mnist, policy async, 2 workers, 2 shards, 1 epoch, batch 64",
                           "1 coordinator, 2 shard and 2 worker processes", "[coordinator] epoch 1/1",
                           "[coordinator] done"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing in:\n" << r.out;
  const std::string m = slurp(metrics);
  ASSERT_EQ(lines(m), 2u) << m;
  for (const char* key : {"\"event\":\"summary\"", "\"shards\":2", "\"workers\":2", "\"final_test_accuracy\"",
                          "\"staleness_histogram\"", "\"malformed_frames\":0"})
    EXPECT_NE(m.find(key), std::string::npos) << key << " missing in " << m;
}

TEST(ClusterCli, RefusesHogwildAcrossProcessesWithExitCode2) {
  CliRun r = asgd("cluster --workers 2 --shards 1 --policy hogwild --data-dir /tmp");
  expect_one_line_error(r, 2, "cannot share one parameter buffer");
}

}  // namespace
