#include "actors/checkpoint.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compute/model.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;

Checkpoint resnet_checkpoint() {
  auto built = Model::build("resnet-mini", {1, 28, 28}, 10);
  EXPECT_TRUE(built.ok());
  built->init_params(3);
  Checkpoint c = Checkpoint::of(*built);
  c.sample_shape = {1, 28, 28};
  c.classes = 10;
  c.dataset = "fashion-mnist";
  c.input_mean = {0.286f};
  c.input_stddev = {0.353f};
  c.updates = 860;
  c.test_accuracy = 0.85;
  c.buffers.front().values[0] = 0.25f;  // something a reader must not lose
  return c;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

TEST(Checkpoint, RoundTripsEveryTensorAndField) {
  const asgd_test::TempDir dir;
  const Checkpoint c = resnet_checkpoint();
  ASSERT_TRUE(write_checkpoint(dir.path().string(), c).ok());
  EXPECT_FALSE(fs::exists(dir.path() / "model.ckpt.tmp"));
  auto back = read_checkpoint(dir.path().string());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->model, "resnet-mini");
  EXPECT_EQ(back->sample_shape, c.sample_shape);
  EXPECT_EQ(back->classes, 10u);
  EXPECT_EQ(back->dataset, "fashion-mnist");
  EXPECT_FLOAT_EQ(back->input_mean.at(0), 0.286f);
  EXPECT_FLOAT_EQ(back->input_stddev.at(0), 0.353f);
  EXPECT_EQ(back->updates, 860u);
  EXPECT_DOUBLE_EQ(back->test_accuracy, 0.85);
  ASSERT_EQ(back->params.size(), c.params.size());
  ASSERT_EQ(back->buffers.size(), c.buffers.size());
  for (std::size_t i = 0; i < c.params.size(); ++i) {
    EXPECT_EQ(back->params[i].name, c.params[i].name);
    EXPECT_EQ(back->params[i].shape, c.params[i].shape);
    EXPECT_EQ(back->params[i].values, c.params[i].values) << c.params[i].name;
  }
  for (std::size_t i = 0; i < c.buffers.size(); ++i) {
    EXPECT_EQ(back->buffers[i].name, c.buffers[i].name);
    EXPECT_EQ(back->buffers[i].values, c.buffers[i].values) << c.buffers[i].name;
  }
}

TEST(Checkpoint, ADamagedTruncatedOrForeignFileIsCorruptionNamingIt) {
  const asgd_test::TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path().string(), resnet_checkpoint()).ok());
  const fs::path file = dir.path() / "model.ckpt";
  const std::string good = slurp(file);
  auto expect_corrupt = [&](const std::string& bytes, const std::string& needle) {
    spit(file, bytes);
    auto r = read_checkpoint(file.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::corruption);
    EXPECT_NE(r.status().message().find(file.string()), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  expect_corrupt(flipped, "checksum");
  expect_corrupt(good.substr(0, good.size() - 100), "checksum");
  expect_corrupt(good.substr(0, 10), "not an asgd checkpoint");
  expect_corrupt("GGUF" + good.substr(4), "not an asgd checkpoint");
  std::string future = good;
  future[8] = 9;  // version
  expect_corrupt(future, "version 9");
}

// A shape whose element count wraps around (2^32 x 2^32 is 0 in 64 bits)
// read as an empty tensor, and the checkpoint loaded.
TEST(Checkpoint, AShapeWhoseSizeOverflowsIsCorruption) {
  const asgd_test::TempDir dir;
  Checkpoint c = resnet_checkpoint();
  c.params.front().shape = {std::size_t{1} << 32, std::size_t{1} << 32};
  c.params.front().values.clear();
  ASSERT_TRUE(write_checkpoint(dir.path().string(), c).ok());
  auto back = read_checkpoint(dir.path().string());
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), StatusCode::corruption);
  EXPECT_NE(back.status().message().find("runs past the end"), std::string::npos) << back.status().message();
}

TEST(Checkpoint, AMissingCheckpointIsNotFound) {
  const asgd_test::TempDir dir;
  auto r = read_checkpoint((dir.path() / "nothing").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
}

TEST(Checkpoint, SafetensorsHasAlignedContiguousTensorsUnderTorchNames) {
  const asgd_test::TempDir dir;
  const Checkpoint c = resnet_checkpoint();
  const fs::path file = dir.path() / "m.safetensors";
  const auto written = write_safetensors(file.string(), c);
  ASSERT_TRUE(written.ok());
  const std::string bytes = slurp(file);
  EXPECT_EQ(written->bytes, bytes.size());
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["model"], "resnet-mini");
  header.erase("__metadata__");
  // params + buffers + one num_batches_tracked per BatchNorm (7 of them)
  EXPECT_EQ(header.size(), c.params.size() + c.buffers.size() + 7);
  EXPECT_EQ(written->tensors, header.size());  // what asgd export says it wrote
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  for (const auto& [name, t] : header.items()) spans.emplace_back(t["data_offsets"][0], t["data_offsets"][1]);
  std::sort(spans.begin(), spans.end());
  std::size_t at = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(8 + n + at, bytes.size());
  EXPECT_EQ(header["0.weight"]["dtype"], "F32");
  EXPECT_EQ(header["0.weight"]["shape"], nlohmann::json::array({16, 1, 3, 3}));
  EXPECT_EQ(header["3.main.1.num_batches_tracked"]["dtype"], "I64");
  EXPECT_TRUE(header["3.main.1.num_batches_tracked"]["shape"].empty());
  const auto& bn = header["1.running_mean"];
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + n + bn["data_offsets"][0].get<std::size_t>(), 4);
  EXPECT_EQ(first, 0.25f);
}

}  // namespace
}  // namespace asgd
