// `asgd cluster` at the end of a job whose shard is slow to write its last
// checkpoint: the supervisor gives a shard the time the shard itself gives
// that write (kShardStopWait) before it kills it.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "actors/checkpoint.hpp"
#include "cli/cli_run.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace {

using asgd_test::asgd;

// A named pipe where shard 0 writes its checkpoint before renaming it: the
// first write blocks in open() for good (nobody reads the pipe), as on a
// disk that stopped answering, and the shard's last checkpoint waits behind
// it. The shard gives up on it kShardStopWait after it was told to stop,
// and says so; the supervisor, which tells it to stop 10 s after the
// coordinator ended and killed it 5 s later before, must leave it that
// long.
TEST(ClusterStopCli, AShardWritingItsLastCheckpointIsGivenTheTimeItTakesNotKilled) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  const asgd_test::TempDir dir;
  const std::filesystem::path ck = dir.path() / "ck";
  std::filesystem::create_directories(ck);
  ASSERT_EQ(::mkfifo((ck / "shard-0.ckpt.1.tmp").c_str(), 0600), 0);  // its first claim's
  const auto start = std::chrono::steady_clock::now();
  const auto r = asgd("cluster --workers 1 --epochs 1 --batch 128 --validation-size 1000 --log-level info --data-dir '" +
                      data.string() + "' --checkpoint-dir '" + ck.string() + "' --checkpoint-every 0.5");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("stopping without the checkpoint of its last state"), std::string::npos) << all;
  EXPECT_NE(all.find("a shard told to stop may take up to"), std::string::npos) << all;
  EXPECT_EQ(all.find("(SIGKILL)"), std::string::npos) << all;
  // The supervisor's 10 s and the shard's own wait, plus the job itself (slower under a sanitizer).
  EXPECT_LT(took, 10 + asgd::kShardStopWait.count() + 20 * asgd_test::kSanitizerSlowdown) << all;
}

}  // namespace
