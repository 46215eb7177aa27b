// `--compress fp16` across processes: it halves the steps' traffic (pushes,
// replies, the all-reduce's chunks over the ring) and nothing else. The
// parameters a job starts from, the parameters its workers publish under
// allreduce and gossip, and the model the coordinator evaluates,
// checkpoints and exports go exact.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace {

namespace fs = std::filesystem;
using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::read_jsonl;
using asgd_test::slurp;

// The float32 values of a safetensors file (every tensor asgd exports is F32).
std::vector<float> exported_values(const fs::path& file) {
  const std::string bytes = slurp(file);
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof header);
  const std::size_t begin = sizeof header + header;
  std::vector<float> values((bytes.size() - begin) / sizeof(float));
  std::memcpy(values.data(), bytes.data() + begin, values.size() * sizeof(float));
  return values;
}

// A value float16 holds exactly (a normal one: its 13 low mantissa bits
// zero); a float32 that training produced is one in 8192 by chance.
bool fits_float16(float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x1FFFu) == 0;
}

// What a run's metrics file says it trained: each epoch's loss and
// validation accuracy, then the test accuracy.
std::vector<double> trained(const fs::path& metrics) {
  std::vector<double> out;
  for (const auto& j : read_jsonl(metrics)) {
    if (j.at("event") == "epoch") {
      out.push_back(j.at("train_loss").get<double>());
      out.push_back(j.at("val_accuracy").get<double>());
    } else if (j.at("event") == "summary") {
      out.push_back(j.at("final_test_accuracy").get<double>());
    }
  }
  return out;
}

// Under averaging too, whose pushes are the parameters the shards average
// and keep (99.7% of its model's values fit float16): they go exact, and
// the job says fp16 changes nothing there.
TEST(CompressCli, Fp16LeavesTheCheckpointedModelExact) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  for (const std::string policy : {"bsp", "averaging"}) {
    const asgd_test::TempDir dir;
    const CliRun r = asgd("cluster --policy " + policy + " --epochs 1 --validation-size 1000 --compress fp16 "
                          "--log-level warn --data-dir " + mnist.string() + " --checkpoint-dir " +
                          (dir / "ck").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("--compress fp16 changes nothing") != std::string::npos, policy == "averaging") << r.out;
    const CliRun e = asgd("export --checkpoint " + (dir / "ck").string() + " --out " + (dir / "m.safetensors").string());
    ASSERT_EQ(e.exit_code, 0) << e.err;
    const std::vector<float> values = exported_values(dir / "m.safetensors");
    ASSERT_GT(values.size(), 200000u);
    std::size_t rounded = 0;
    for (float v : values) rounded += fits_float16(v);
    EXPECT_LT(rounded, values.size() / 100) << policy << ": the checkpointed model came through float16: " << rounded
                                            << " of " << values.size() << " values fit it";
  }
}

// Through shared memory the all-reduce has nothing to round, and the
// initial parameters and publishes go exact: the same run bit for bit.
TEST(CompressCli, Fp16ChangesNothingInAnAllreduceThroughSharedMemory) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const std::string job = "cluster --policy allreduce --epochs 1 --validation-size 1000 --log-level warn --data-dir " +
                          mnist.string();
  const CliRun plain = asgd(job + " --metrics-out " + (dir / "plain.jsonl").string());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const CliRun half = asgd(job + " --compress fp16 --metrics-out " + (dir / "half.jsonl").string());
  ASSERT_EQ(half.exit_code, 0) << half.err;
  const std::vector<double> a = trained(dir / "plain.jsonl");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(trained(dir / "half.jsonl"), a);
}

}  // namespace
