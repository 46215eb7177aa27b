// `asgd train --resume` as an operator meets it: from another working
// directory, twice in a row, and with damaged or odd checkpoint folders.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"
#include "http_client.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace {

namespace fs = std::filesystem;

using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;
using asgd_test::read_jsonl;
using asgd_test::slurp;

// Small and quick: one epoch is a few hundred steps.
const std::string kJob = " --workers 2 --batch 64 --validation-size 1000 --checkpoint-every 0.2 --log-level warn";

std::vector<std::uint32_t> epochs_in(const std::vector<nlohmann::json>& lines) {
  std::vector<std::uint32_t> out;
  for (const auto& j : lines)
    if (j["event"] == "epoch") out.push_back(j["epoch"].get<std::uint32_t>());
  return out;
}

// The first run, from folder `run`, names its checkpoint folder and metrics
// file relative to it; both resumes run from `elsewhere` and name neither:
// they must keep writing into run/ck and run/m.jsonl.
TEST(ResumeCli, AResumeFromAnotherFolderWritesIntoTheResumedFolderAndASecondContinuesFromTheLatestEpoch) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path run = scratch / "run";
  const fs::path elsewhere = scratch / "elsewhere";
  fs::create_directories(run);
  fs::create_directories(elsewhere);

  CliRun first = asgd("train --epochs 1 --data-dir " + mnist.string() + " --checkpoint-dir ck --metrics-out m.jsonl" + kJob,
                      run);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const fs::path ck = run / "ck";
  ASSERT_TRUE(fs::exists(ck / "shard-0.ckpt"));
  const auto written = fs::last_write_time(ck / "shard-0.ckpt");

  CliRun second = asgd("train --resume " + ck.string() + " --epochs 2", elsewhere);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_FALSE(fs::exists(elsewhere / "ck")) << "the resume checkpointed into its working directory";
  EXPECT_FALSE(fs::exists(elsewhere / "m.jsonl")) << "the resume wrote its metrics into its working directory";
  EXPECT_GT(fs::last_write_time(ck / "shard-0.ckpt"), written) << "the resumed folder was not written";

  // The third resumes through a config file's `resume`, as the flag does:
  // the checkpointed job's settings (its metrics file among them) first.
  std::ofstream(elsewhere / "more.toml") << "resume = \"" << ck.string() << "\"\nepochs = 3\n";
  CliRun third = asgd("train --config more.toml", elsewhere);
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_NE(third.out.find("epoch 3/3"), std::string::npos) << third.out;
  EXPECT_EQ(third.out.find("epoch 2/3"), std::string::npos) << "epoch 2 was trained again:\n" << third.out;

  // One metrics file holds the three runs, each epoch once, in order.
  const auto lines = read_jsonl(run / "m.jsonl");
  EXPECT_EQ(epochs_in(lines), (std::vector<std::uint32_t>{1, 2, 3}));
  std::size_t resumes = 0;
  for (const auto& j : lines) resumes += j["event"] == "resume";
  EXPECT_EQ(resumes, 2u);
  EXPECT_EQ(lines.back()["event"], "summary");
}

// A damaged shard checkpoint is the user's to fix (exit 2, naming the file),
// and the failed resume leaves the old job's metrics file as it was.
TEST(ResumeCli, ADamagedShardCheckpointIsAUsageErrorAndLeavesTheMetricsFileAlone) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  const fs::path metrics = scratch / "m.jsonl";
  ASSERT_EQ(asgd("train --epochs 1 --data-dir " + mnist.string() + " --checkpoint-dir " + ck.string() +
                 " --metrics-out " + metrics.string() + kJob)
                .exit_code,
            0);
  const std::string before = slurp(metrics);
  const std::string settings = slurp(ck / "job.toml");
  {  // one flipped byte among the values
    std::fstream f(ck / "shard-0.ckpt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-20, std::ios::end);
    f.put('\x7f');
  }
  const CliRun r = asgd("train --resume " + ck.string() + " --epochs 2 --log-level off");
  expect_one_line_error(r, 2, "shard-0.ckpt");
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(metrics), before) << "a failed resume wrote to the old job's metrics file";
  EXPECT_EQ(slurp(ck / "job.toml"), settings) << "a refused resume replaced the checkpointed job's settings";
}

// One epoch of kJob checkpointed into `ck`.
void train_one_epoch_into(const fs::path& mnist, const fs::path& ck) {
  ASSERT_EQ(asgd("train --epochs 1 --data-dir " + mnist.string() + " --checkpoint-dir " + ck.string() + kJob)
                .exit_code,
            0);
}

// A folder where a checkpoint file should be is refused by name, not with
// an internal error or an abort.
TEST(ResumeCli, AFolderInPlaceOfACheckpointFileIsRefusedByName) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  ASSERT_TRUE(fs::exists(ck / "model.ckpt"));

  // The job's other files are no model to export, nor a place to write one.
  for (const char* other : {"shard-0.ckpt", "job.toml", "shard-0.ckpt.claim"}) {
    expect_one_line_error(asgd("export --checkpoint " + (ck / other).string() + " --out " + (scratch / "x.st").string()),
                          2, std::string(other) + " is a file of the checkpointed job, not its trained model");
    expect_one_line_error(asgd("export --checkpoint " + ck.string() + " --out " + (ck / other).string()), 2,
                          std::string(other) + " is the name of a checkpointed job's own file");
  }

  fs::remove(ck / "model.ckpt");
  fs::create_directories(ck / "model.ckpt");
  expect_one_line_error(asgd("export --checkpoint " + ck.string() + " --out " + (scratch / "x.safetensors").string()),
                        1, "model.ckpt: is a folder");

  fs::remove(ck / "model.ckpt");  // (a folder there is refused before training, ClusterCli.AnUnwritableOutput...)
  fs::remove(ck / "shard-0.ckpt");
  fs::create_directories(ck / "shard-0.ckpt");
  expect_one_line_error(asgd("train --resume " + ck.string() + " --epochs 2 --log-level off"), 2,
                        "shard-0.ckpt: is a folder");
}

// The checkpoints count each worker's steps: a resume with another batch
// (or batch weights) would skip epochs or repeat them, and a job.toml cut
// short would silently lose settings. Both are refused by name.
TEST(ResumeCli, AChangedBatchOrASettingsFileCutShortIsRefused) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  const std::string resume = "train --resume " + ck.string() + " --epochs 2 --log-level off";
  expect_one_line_error(asgd(resume + " --batch 32"), 2, "the checkpointed job's --batch (64) cannot change");
  expect_one_line_error(asgd(resume + " --worker-weights 1,2"), 2,
                        "the checkpointed job's --worker-weights (equal) cannot change");
  const std::string whole = slurp(ck / "job.toml");
  std::ofstream(ck / "job.toml") << whole.substr(0, whole.find("epochs ="));
  expect_one_line_error(asgd(resume), 2, "job.toml is cut short");
}

// The policy may change on resume (docs/user-guide.md): the old policy's
// settings go with it unless given again. async's --push-every refused a
// resume under bsp ("applies to --policy async only").
TEST(ResumeCli, AnotherPolicyDropsTheOldPolicysSettings) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_EQ(asgd("train --epochs 1 --policy async --push-every 2 --staleness-aware-lr true --data-dir " +
                 mnist.string() + " --checkpoint-dir " + ck.string() + kJob)
                .exit_code,
            0);
  const CliRun bsp = asgd("train --resume " + ck.string() + " --epochs 2 --policy bsp --log-level warn");
  EXPECT_EQ(bsp.exit_code, 0) << bsp.err;
  // More epochs spread the cosine schedule anew: said, not silent.
  EXPECT_NE(bsp.err.find("--epochs 2 where the checkpointed job had 1: the cosine schedule"), std::string::npos)
      << bsp.err;
  // bsp's workers keep no optimizer of their own: nothing of theirs is lost.
  EXPECT_EQ(bsp.err.find("not the workers' own"), std::string::npos) << bsp.err;
  // gossip's do, and their momentum is not in the shards' checkpoints:
  // said (the resumed run's first steps differ from an uninterrupted one's).
  const CliRun gossip = asgd("train --resume " + ck.string() + " --epochs 3 --policy gossip:2 --log-level warn");
  EXPECT_EQ(gossip.exit_code, 0) << gossip.err;
  EXPECT_NE(gossip.err.find("the checkpoints hold the shards' state, not the workers' own: under gossip:2 each "
                            "worker's momentum state starts again from zero"),
            std::string::npos)
      << gossip.err;
  const std::string settings = slurp(ck / "job.toml");
  EXPECT_EQ(settings.find("push-every"), std::string::npos) << settings;
  EXPECT_EQ(settings.find("staleness-aware-lr"), std::string::npos) << settings;
  // Given again, a setting the new policy does not take is still refused.
  expect_one_line_error(asgd("train --resume " + ck.string() + " --epochs 3 --policy bsp --fetch-every 2"), 2,
                        "--fetch-every applies to --policy async only");
}

// A job.toml of an asgd that took what this one refuses (--momentum with
// adam, --staleness-aware-lr with bsp, a --prefetch over 256) still
// resumes: those settings are dropped with a word (the resume was refused,
// with no flag to clear them). A --log-file named like one of the folder's
// files is refused (DIR/job.toml was emptied as logging started).
TEST(ResumeCli, SettingsAnEarlierAsgdTookAreDroppedAndTheLogCannotBeAFoldersFile) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_EQ(asgd("train --epochs 1 --policy bsp --optimizer adam --data-dir " + mnist.string() + " --checkpoint-dir " +
                 ck.string() + kJob)
                .exit_code,
            0);
  std::string settings = slurp(ck / "job.toml");
  ASSERT_NE(settings.find("\nprefetch = 4\n"), std::string::npos) << settings;
  settings.replace(settings.find("\nprefetch = 4\n"), 14, "\nprefetch = 1000\n");
  settings.insert(settings.find("# end of the settings"), "momentum = 0.9\nstaleness-aware-lr = false\n");
  std::ofstream(ck / "job.toml") << settings;
  expect_one_line_error(asgd("train --resume " + ck.string() + " --epochs 2 --log-file " + (ck / "job.toml").string()), 2,
                        "job.toml is the name of a checkpoint folder's file");
  EXPECT_EQ(slurp(ck / "job.toml"), settings);
  const CliRun r = asgd("train --resume " + ck.string() + " --epochs 2 --log-level warn");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* dropped : {"--momentum 0.9, which --optimizer adam has no use for: dropped",
                              "--staleness-aware-lr, which --policy bsp has no use for: dropped",
                              "--prefetch 1000, more than the 256 taken now: 256"})
    EXPECT_NE(r.err.find(dropped), std::string::npos) << dropped << " in " << r.err;
}

// The checkpoints hold the model's parameters cut into --shards pieces:
// another model or shard count is refused by name, by the command line
// when a flag changes it, by the job itself when the settings file does
// (as a library user's JobConfig would). A resume refused leaves the
// folder's settings as they were, so the right command still resumes it
// (a refused resume used to write its own settings there first).
TEST(ResumeCli, AnotherModelOrShardCountIsRefusedAndARefusedResumeLeavesTheSettingsAlone) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  const std::string resume = "train --resume " + ck.string() + " --epochs 2 --log-level off";
  const std::string settings = slurp(ck / "job.toml");
  expect_one_line_error(asgd(resume + " --model lenet"), 2, "the checkpointed job's --model (mlp) cannot change");
  expect_one_line_error(asgd(resume + " --shards 2"), 2, "the checkpointed job's --shards (1) cannot change");
  // Before any process starts (asgd cluster said it once every process had).
  expect_one_line_error(asgd(resume + " --workers 3"), 2, "the checkpointed job's --workers (2) cannot change");
  // Its shards hold the momentum optimizer's state; its epochs are MNIST's
  // training set less 1000 samples (another dataset trained on MNIST
  // under the new name: job.toml keeps the data folder).
  expect_one_line_error(asgd(resume + " --optimizer adam"), 2,
                        "holds the state of the momentum optimizer, this job's is adam");
  expect_one_line_error(asgd(resume + " --dataset fashion-mnist"), 2,
                        "the checkpointed job's --dataset (mnist) cannot change");
  expect_one_line_error(asgd(resume + " --validation-size 2000"), 2,
                        "the checkpointed job's --validation-size (1000) cannot change");
  // Under a launcher with the wrong number of ranks, the advice keeps what a resume keeps.
  expect_one_line_error(asgd("cluster --resume " + ck.string() + " --epochs 2 --rendezvous " + (scratch / "rv").string(),
                             {}, "env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3"),
                        2, "3 rank(s), but the resumed job keeps its 1 shard(s) and 2 worker(s): start 4 ranks");
  EXPECT_EQ(slurp(ck / "job.toml"), settings) << "a refused resume replaced the checkpointed job's settings";

  auto edited = [&](const std::string& key, const std::string& value) {
    std::string text = settings;
    const auto at = text.find("\n" + key + " = ") + 1;
    text.replace(at, text.find('\n', at) - at, key + " = \"" + value + "\"");
    std::ofstream(ck / "job.toml") << text;
  };
  edited("shards", "2");
  expect_one_line_error(asgd(resume), 2,
                        "it holds the checkpoints of 1 shard(s), this job has 2: the shard count cannot change");
  edited("model", "lenet");
  expect_one_line_error(asgd(resume), 2, "this job's shard 0 has");
  edited("workers", "3");  // the checkpoints say it too (a library user's JobConfig)
  expect_one_line_error(asgd(resume), 2, "shard-0.ckpt is of a job with 2 workers, not 3");
  std::ofstream(ck / "job.toml") << settings;
  const CliRun resumed = asgd(resume);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(slurp(ck / "job.toml").find("\nepochs = 2\n"), std::string::npos) << "the resumed job's settings";
}

// asgd cluster resumes its own checkpoints: the coordinator checks them and
// tells each shard process to reload its own (the folder is on one host
// here) at the workers' clocks, and the worker processes start at the
// epoch not every worker had finished. Where a job was trained does not
// matter: the same checkpoints then go on in one process.
TEST(ResumeCli, AClusterJobResumesAsAClusterAndThenInOneProcess) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  const fs::path metrics = scratch / "m.jsonl";
  const std::string job = " --shards 2 --data-dir " + mnist.string() + kJob;
  const CliRun first = asgd("cluster --epochs 1 --checkpoint-dir " + ck.string() + " --metrics-out " +
                            metrics.string() + job);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::uint64_t one_epoch = read_jsonl(metrics).back()["updates_applied"].get<std::uint64_t>();

  const CliRun second = asgd("cluster --resume " + ck.string() + " --epochs 2 --log-level info");
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  const std::string said = second.out + second.err;
  for (const std::string shard : {"shard 0", "shard 1"})
    EXPECT_NE(said.find(shard + ": resumed from " + (ck / ("shard-" + shard.substr(6) + ".ckpt")).string()),
              std::string::npos)
        << said;
  EXPECT_NE(said.find("epoch 2/2"), std::string::npos) << said;
  EXPECT_EQ(said.find("epoch 1/2"), std::string::npos) << "epoch 1 was trained again:\n" << said;
  auto lines = read_jsonl(metrics);
  EXPECT_EQ(epochs_in(lines), (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(lines.back()["updates_applied"].get<std::uint64_t>(), 2 * one_epoch) << "the resumed shards lost or redid updates";

  const CliRun third = asgd("train --resume " + ck.string() + " --epochs 3");
  ASSERT_EQ(third.exit_code, 0) << third.err;
  lines = read_jsonl(metrics);
  EXPECT_EQ(epochs_in(lines), (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_GE(lines.back()["final_test_accuracy"].get<double>(), 0.95);

  // The last shard's file lost: named, not taken for another shard count.
  fs::remove(ck / "shard-1.ckpt");
  expect_one_line_error(asgd("train --resume " + ck.string() + " --epochs 4 --log-level off"), 2,
                        "no checkpoint of shard 1 (" + (ck / "shard-1.ckpt").string() + ")");
}

// A resume refused across processes is a usage error on every process, not
// only the coordinator's: under a launcher the exit status mpirun or Slurm
// reports is whichever rank ends first (the others used to exit 1).
TEST(ResumeCli, AResumeRefusedAcrossProcessesEndsEveryProcessWithStatus2) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir scratch;
  const fs::path ck = scratch / "ck";
  ASSERT_NO_FATAL_FAILURE(train_one_epoch_into(mnist, ck));
  const int port = asgd_test::free_port();
  ASSERT_GT(port, 0);
  const std::string at = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator = std::async(std::launch::async, [&] {
    return asgd("coordinator --resume " + ck.string() + " --join-timeout 20 --listen " + at);  // every epoch trained
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<std::future<CliRun>> others;
  for (const char* role : {"shard", "worker", "worker"})
    others.push_back(std::async(std::launch::async, [&, role] { return asgd(std::string(role) + " --coordinator " + at); }));
  const CliRun refused = coordinator.get();
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("had trained 1 epoch, all of --epochs 1"), std::string::npos) << refused.err;
  for (auto& other : others) {
    const CliRun r = other.get();
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("had trained 1 epoch, all of --epochs 1"), std::string::npos) << r.err;
  }
}

}  // namespace
