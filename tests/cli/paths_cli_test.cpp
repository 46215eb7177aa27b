// Paths a user gives that cannot be looked at, and a checkpoint folder used
// again: one line and an exit status, never an abort, and never an earlier
// job's model taken for this one's.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli_run.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace {

namespace fs = std::filesystem;

using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;

// A link to itself: every look at it fails (ELOOP), as a folder without
// search permission does for a user who is not root. std::filesystem's
// calls without an error_code threw there, and the uncaught
// filesystem_error ended asgd with SIGABRT (exit 134).
TEST(PathsCli, APathThatCannotBeLookedAtIsOneLineNotAnAbort) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path loop = dir / "loop";
  fs::create_symlink(loop, loop);
  const std::string why = "Too many levels of symbolic links";
  expect_one_line_error(asgd("train --epochs 1 --data-dir " + loop.string()), 2,
                        "data directory " + loop.string() + " cannot be read (" + why + ")");
  expect_one_line_error(asgd("cluster --epochs 1 --data-dir " + loop.string()), 2,
                        "data directory " + loop.string() + " cannot be read (" + why + ")");
  expect_one_line_error(asgd("train --config " + loop.string()), 2, "config file " + loop.string() + " cannot be read: " + why);
  expect_one_line_error(asgd("train --resume " + loop.string()), 2, "--resume " + loop.string() + ": cannot read");
  expect_one_line_error(asgd("export --checkpoint " + loop.string() + " --out " + (dir / "m.safetensors").string()), 2,
                        "no checkpoint at " + loop.string());
  const fs::path file = dir / "a-file";
  std::ofstream(file) << "not a folder";
  expect_one_line_error(asgd("train --epochs 1 --data-dir " + file.string()), 2,
                        "data directory " + file.string() + " is not a folder");
  // A folder under a file "did not exist".
  expect_one_line_error(asgd("train --epochs 1 --data-dir " + (file / "sub").string()), 2,
                        "data directory " + (file / "sub").string() + " cannot be: " + file.string() + " is a file");
}

// A new job in a folder that holds an earlier job's model.ckpt: the earlier
// model goes when the new job replaces the folder's settings, so a new job
// that does not finish leaves no model to export, not the earlier one
// under the new settings.
TEST(PathsCli, ANewJobInACheckpointFolderRemovesTheEarlierJobsModel) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const std::string ck = (dir / "ck").string(), data = " --data-dir " + mnist.string() + " --log-level warn";
  const CliRun first = asgd("train --epochs 1 --validation-size 1000 --checkpoint-dir " + ck + data);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(fs::exists(fs::path(ck) / "model.ckpt"));
  const CliRun diverged = asgd("train --epochs 1 --lr 1e6 --checkpoint-dir " + ck + data);
  EXPECT_EQ(diverged.exit_code, 1) << diverged.err;
  EXPECT_NE(diverged.err.find("removed the earlier job's trained model"), std::string::npos) << diverged.err;
  EXPECT_FALSE(fs::exists(fs::path(ck) / "model.ckpt"));
  expect_one_line_error(asgd("export --checkpoint " + ck + " --out " + (dir / "m.safetensors").string()), 2,
                        "no checkpoint at " + ck + "/model.ckpt");
}

// A metrics file that is one of the checkpoint folder's files (job.toml
// was replaced by the metrics and every --resume then refused; model.ckpt
// overwrote the metrics at the end), the log file as well (the log was
// lost), or in a folder that does not exist: refused before the job starts.
TEST(PathsCli, AMetricsFileInPlaceOfTheJobsOwnFilesOrItsLogIsRefusedBeforeTheJob) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const std::string job = "train --epochs 1 --data-dir " + mnist.string() + " ";
  for (const char* file : {"job.toml", "model.ckpt", "shard-0.ckpt", "shard-0.ckpt.claim"})
    expect_one_line_error(asgd(job + "--checkpoint-dir ck --metrics-out ck/" + file, dir.path()), 2,
                          "--metrics-out ck/" + std::string(file) + ": is a file of the job's checkpoint folder ck");
  expect_one_line_error(asgd(job + "--metrics-out run.jsonl --log-file ./run.jsonl", dir.path()), 2,
                        "--log-file ./run.jsonl: is the --metrics-out file too");
  const CliRun missing = asgd(job + "--metrics-out nowhere/run.jsonl", dir.path());
  expect_one_line_error(missing, 2, "--metrics-out nowhere/run.jsonl: its folder nowhere does not exist");
  EXPECT_TRUE(missing.out.empty()) << "refused before the job: " << missing.out;
  EXPECT_FALSE(fs::exists(dir / "ck")) << "nothing written";
}

}  // namespace
