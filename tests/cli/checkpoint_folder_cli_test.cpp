// A checkpoint folder's files as jobs, resumes and `asgd export` leave them:
// a new job does not inherit an earlier one's, a resume keeps what the
// checkpoints were made with, and export neither writes over a folder's
// files nor turns a checkpoint that does not fit its model into a file
// torch would load wrongly.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "actors/checkpoint.hpp"
#include "cli/cli_run.hpp"
#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace {

namespace fs = std::filesystem;

using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;
using asgd_test::slurp;

const std::string kQuiet = " --validation-size 1000 --log-level warn";

// One epoch of MNIST checkpointed into `ck` (shard checkpoints every 0.2 s
// unless `flags` say otherwise).
void train_one_epoch_into(const fs::path& mnist, const fs::path& ck, const std::string& flags = "") {
  const CliRun r = asgd("train --epochs 1 --checkpoint-every 0.2 --data-dir " + mnist.string() + " --checkpoint-dir " +
                        ck.string() + kQuiet + " " + flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// A new job in a folder that holds an earlier job's shard checkpoints,
// killed before it wrote its own: a --resume went on from the earlier
// job's parameters and clocks ("resuming at epoch 2 of 3: 860 updates
// restored") though the new job had trained nothing.
TEST(CheckpointFolderCli, ANewJobRemovesTheEarlierJobsShardCheckpoints) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  ASSERT_TRUE(fs::exists(ck / "shard-0.ckpt"));
  ASSERT_TRUE(fs::exists(ck / "shard-0.ckpt.claim"));
  std::ofstream(ck / "shard-3.ckpt.7.tmp") << "a write an earlier job's process was killed in";
  std::ofstream(ck / "model.ckpt.tmp") << "and one of its trained model";

  const fs::path log = scratch / "new.log";
  const pid_t pid = asgd_test::start_asgd({"train", "--epochs", "50", "--checkpoint-every", "600", "--data-dir",
                                           mnist.string(), "--checkpoint-dir", ck.string(), "--seed", "5"},
                                          log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(asgd_test::eventually([&] { return asgd_test::read_file(log).find("epoch 1/50") != std::string::npos; },
                                    std::chrono::seconds(60)))
      << asgd_test::read_file(log);
  ::kill(pid, SIGKILL);
  ASSERT_TRUE(asgd_test::wait_exit(pid, std::chrono::seconds(30)));
  EXPECT_FALSE(fs::exists(ck / "shard-0.ckpt")) << asgd_test::read_file(log);
  EXPECT_FALSE(fs::exists(ck / "shard-3.ckpt.7.tmp"));
  EXPECT_FALSE(fs::exists(ck / "model.ckpt.tmp")) << "(it stayed for ever)";
  // Its claim stays (a review saw an earlier job's shard, stopped, wake and
  // write its checkpoint over the new job's: the claims began again at 1).
  EXPECT_TRUE(fs::exists(ck / "shard-0.ckpt.claim"));
  expect_one_line_error(asgd("train --resume " + ck.string() + " --log-level off"), 2, "no checkpoint of shard 0");
  // A first write that never ended is named (it asked whether the job ran
  // with --checkpoint-dir, beside the unfinished file).
  std::ofstream(ck / "shard-0.ckpt.1.tmp") << "half a checkpoint";
  expect_one_line_error(asgd("train --resume " + ck.string() + " --log-level off"), 2,
                        "only shard-0.ckpt.1.tmp is there, a write that never ended");
}

// The batch the job took by default (256 / 8 workers under async) is the
// one its checkpoints count steps of: a resume with --lr, which makes the
// default 64, took steps of 64 where the checkpoints counted steps of 32. The seed
// drew the validation split, and the data is the data: a resume with
// either changed trained on other images than the job had.
TEST(CheckpointFolderCli, AResumeKeepsTheBatchTakenAndRefusesAnotherSeedOrOtherData) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  ASGD_REQUIRE_DATASET(fashion, "fashion-mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck, "--workers 8"));
  EXPECT_NE(slurp(ck / "job.toml").find("\nbatch = 32\n"), std::string::npos) << slurp(ck / "job.toml");

  const std::string resume = "train --resume " + ck.string() + " --epochs 2 --log-level off";
  expect_one_line_error(asgd(resume + " --batch 64"), 2, "the checkpointed job's --batch (32) cannot change");
  expect_one_line_error(asgd(resume + " --seed 2"), 2,
                        "the checkpointed job's --seed (1) cannot change: it chose the 1000 training images held "
                        "out for validation");
  expect_one_line_error(asgd(resume + " --data-dir " + fashion.string()), 2, "was trained on other data than this job's");
  const CliRun resumed = asgd("train --resume " + ck.string() + " --epochs 2 --lr 0.01");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("batch 32"), std::string::npos) << resumed.out;
}

// Checkpoint files of a resumed job that it could not write: a claim file
// with no number in it left the whole resumed job without a checkpoint
// (exit 0, a warning per write); a folder where model.ckpt's temporary goes
// failed the job at its end, its training lost. Both are refused first, as
// is a damaged shard checkpoint by asgd cluster.
TEST(CheckpointFolderCli, AFolderFileTheJobCouldNotWriteIsRefusedBeforeTraining) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  std::ofstream(ck / "shard-0.ckpt.claim") << "xyz\n";
  expect_one_line_error(asgd("train --resume " + ck.string() + " --epochs 2 --log-level off"), 2,
                        "shard-0.ckpt.claim: holds no claim number");
  // asgd cluster says so once, before any process starts (each of its
  // processes said it, with its exit status).
  expect_one_line_error(asgd("cluster --resume " + ck.string() + " --epochs 2 --log-level off"), 2,
                        "shard-0.ckpt.claim: holds no claim number");
  fs::remove(ck / "shard-0.ckpt.claim");
  std::string damaged = slurp(ck / "shard-0.ckpt");
  const std::string intact = damaged;
  damaged[damaged.size() / 2] ^= 0x5a;
  std::ofstream(ck / "shard-0.ckpt", std::ios::binary) << damaged;
  expect_one_line_error(asgd("cluster --resume " + ck.string() + " --epochs 2 --log-level off"), 2,
                        "--resume " + ck.string() + ": " + (ck / "shard-0.ckpt").string() + ": checksum mismatch");
  std::ofstream(ck / "shard-0.ckpt", std::ios::binary) << intact;
  fs::create_directories(ck / "model.ckpt.tmp");
  expect_one_line_error(asgd("train --resume " + ck.string() + " --epochs 2 --log-level off"), 2,
                        "model.ckpt.tmp is not a regular file, so the job could not write its trained model there");
}

// `asgd export --out` with the name of a checkpoint folder's file replaced
// another job's model.ckpt or job.toml (exit 0); a checkpoint whose
// tensors do not fit the model it names, or hold NaN, exported as a file
// torch refuses or loads as a broken model; a pipe in model.ckpt's place
// was read for ever.
TEST(CheckpointFolderCli, ExportRefusesAFoldersFileNamesAndACheckpointThatDoesNotFitItsModel) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck", other = scratch / "other";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  fs::create_directories(other);
  for (const char* name : {"model.ckpt", "job.toml", "shard-7.ckpt"})
    expect_one_line_error(asgd("export --checkpoint " + ck.string() + " --out " + (other / name).string()), 2,
                          std::string(name) + " is the name of a checkpointed job's own file");
  EXPECT_TRUE(fs::is_empty(other));

  auto exported = [&](const asgd::Checkpoint& c) {
    fs::remove_all(other);
    fs::create_directories(other);
    EXPECT_TRUE(asgd::write_checkpoint(other.string(), c).ok());
    return asgd("export --checkpoint " + other.string() + " --out " + (scratch / "m.safetensors").string());
  };
  auto good = asgd::read_checkpoint(ck.string());
  ASSERT_TRUE(good.ok()) << good.status().message();
  asgd::Checkpoint swapped = *good;
  std::swap(swapped.params[0].shape[0], swapped.params[0].shape[1]);
  expect_one_line_error(exported(swapped), 1, "parameter 0.weight (784, 256) does not match mlp's 0.weight (256, 784)");
  asgd::Checkpoint renamed = *good;
  renamed.model = "lenet";
  expect_one_line_error(exported(renamed), 1, "parameter tensors, lenet has");
  asgd::Checkpoint diverged = *good;
  diverged.params[1].values[3] = std::numeric_limits<float>::quiet_NaN();
  expect_one_line_error(exported(diverged), 1, "parameter 0.bias is not finite");
  EXPECT_FALSE(fs::exists(scratch / "m.safetensors"));
  EXPECT_EQ(exported(*good).exit_code, 0);

  // A shard's checkpoint copied in the model's place said only "not an
  // asgd checkpoint (expected ASGDCKPT)".
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, scratch / "ck2"));
  fs::remove_all(other);
  fs::create_directories(other);
  fs::copy_file(scratch / "ck2" / "shard-0.ckpt", other / "model.ckpt");
  expect_one_line_error(asgd("export --checkpoint " + other.string() + " --out " + (scratch / "s.safetensors").string()),
                        1, "a shard checkpoint, not a trained model");

  fs::remove_all(other);
  fs::create_directories(other);
  ASSERT_EQ(::mkfifo((other / "model.ckpt").c_str(), 0644), 0);
  expect_one_line_error(asgd("export --checkpoint " + other.string() + " --out " + (scratch / "p.safetensors").string()),
                        1, "model.ckpt: is not a regular file");
}

// An interval with no folder to write in was taken without a word, and a
// --resume of a path that is not there, or is a file, said "no job.toml
// there".
TEST(CheckpointFolderCli, AnIntervalWithoutAFolderAndAResumeOfNoFolderAreRefusedPlainly) {
  const asgd_test::TempDir scratch;
  expect_one_line_error(asgd("train --checkpoint-every 5"), 2, "--checkpoint-every: applies with --checkpoint-dir");
  expect_one_line_error(asgd("cluster --checkpoint-every 5"), 2, "--checkpoint-every: applies with --checkpoint-dir");
  const fs::path file = scratch / "a-file";
  std::ofstream(file) << "x";
  expect_one_line_error(asgd("train --resume " + (scratch / "none").string()), 2, "none: does not exist");
  expect_one_line_error(asgd("train --resume " + file.string()), 2, "a-file: not a folder");
}

}  // namespace
