// Paths a user gives that cannot be looked at, and a checkpoint folder used
// again: one line and an exit status, never an abort, and never an earlier
// job's model taken for this one's.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/cli_run.hpp"
#include "http_client.hpp"
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

std::string contents(const fs::path& file) {
  std::stringstream text;
  text << std::ifstream(file).rdbuf();
  return text.str();
}

// A job refused before it began (exit 2) leaves an earlier metrics file as
// it found it, as the user guide says: a checkpoint folder that cannot be
// written emptied it (it was emptied when opened, before that check). A
// metrics or log file that is the --config file is refused: the config
// was overwritten with JSON lines, exit 0.
TEST(PathsCli, ARefusedJobLeavesTheMetricsFileAndNothingWritesOverTheConfigFile) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const std::string earlier = "{\"event\":\"summary\"}\n";
  std::ofstream(dir / "m.jsonl") << earlier;
  const std::string job = " --epochs 1 --data-dir " + mnist.string() + " --metrics-out m.jsonl --checkpoint-dir ";
  for (const char* command : {"train", "cluster"}) {
    const CliRun r = asgd(command + job + "/proc/no-such-folder", dir.path());
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_NE(r.err.find("/proc/no-such-folder"), std::string::npos) << r.err;
    EXPECT_EQ(contents(dir / "m.jsonl"), earlier) << command;
  }
  {  // refused inside the job, after it opened the file: a status port another holds
    asgd_test::HeldPort held;
    ASSERT_NE(held.port, 0);
    const std::string port = std::to_string(held.port);
    expect_one_line_error(asgd("train --epochs 1 --data-dir " + mnist.string() + " --metrics-out m.jsonl --status-port " +
                                   port, dir.path()),
                          2, "--status-port " + port + ": cannot listen");
    held.release();
    EXPECT_EQ(contents(dir / "m.jsonl"), earlier);
  }
  const std::string settings = "epochs = 1\nmetrics-out = \"c.toml\"\n";
  std::ofstream(dir / "c.toml") << settings;
  expect_one_line_error(asgd("train --config c.toml --data-dir " + mnist.string(), dir.path()), 2,
                        "--metrics-out c.toml: is the --config file; give another file");
  expect_one_line_error(asgd("train --config ./c.toml --metrics-out m.jsonl --log-file c.toml --data-dir " +
                                 mnist.string(), dir.path()),
                        2, "--log-file c.toml: is the --config file; give another file");
  EXPECT_EQ(contents(dir / "c.toml"), settings);
}

}  // namespace
