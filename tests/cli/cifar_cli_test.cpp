// asgd train on CIFAR-10-format files the test writes: colour images through
// the whole pipeline, per-channel normalisation in the exported weights.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"
#include "dataset/cifar_files.hpp"
#include "temp_dir.hpp"

namespace asgd_test {
namespace {

namespace fs = std::filesystem;

TEST(CifarCli, TrainsResnetMiniOnColourImagesAndExportsPerChannelNormalisation) {
  TempDir tmp;
  write_cifar10(tmp / "cifar10", 200);
  const CliRun r = asgd("train --dataset cifar10 --data-dir " + (tmp / "cifar10").string() +
                        " --model resnet-mini --epochs 1 --validation-size 100 --metrics-out " +
                        (tmp / "m.jsonl").string() + " --checkpoint-dir " + (tmp / "ck").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string m = slurp(tmp / "m.jsonl");
  const auto summary = nlohmann::json::parse(m.substr(m.rfind('\n', m.size() - 2) + 1));
  EXPECT_EQ(summary.at("event"), "summary");
  EXPECT_EQ(summary.at("dataset"), "cifar10");
  // Ten classes: chance is 0.1; the generated classes are easy to tell apart.
  EXPECT_GT(summary.at("final_test_accuracy").get<double>(), 0.3) << m;

  const CliRun e = asgd("export --checkpoint " + (tmp / "ck").string() + " --out " + (tmp / "w.safetensors").string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const std::string file = slurp(tmp / "w.safetensors");
  ASSERT_GT(file.size(), 8u);
  std::uint64_t header_bytes = 0;  // safetensors: a little-endian u64, then the JSON header
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes * 256 + static_cast<unsigned char>(file[i]);
  const auto header = nlohmann::json::parse(file.substr(8, header_bytes));
  const std::string mean = header.at("__metadata__").at("input_mean");
  EXPECT_EQ(std::count(mean.begin(), mean.end(), ','), 2) << mean;
  // Each as the float the job used (six decimals were written: a small
  // stddev lost most of its digits).
  const auto used = summary.at("input_mean").get<std::vector<float>>();
  std::stringstream parts(mean);
  std::size_t i = 0;
  for (std::string part; std::getline(parts, part, ','); ++i) {
    ASSERT_LT(i, used.size());
    EXPECT_EQ(std::stof(part), used[i]) << part;
  }
}

// The command on a small generated set: resnet18 with augmentation,
// on the CPU, end to end, in the usual metrics format.
TEST(CifarCli, Resnet18WithAugmentationRunsAnEpochEndToEnd) {
  TempDir tmp;
  write_cifar10(tmp / "cifar10", 16);
  const CliRun r = asgd("train --dataset cifar10 --data-dir " + (tmp / "cifar10").string() +
                        " --model resnet18 --augment crop,flip --epochs 1 --validation-size 16 --batch 16 "
                        "--metrics-out " + (tmp / "m.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string m = slurp(tmp / "m.jsonl");
  std::istringstream lines(m);
  std::vector<std::string> events;
  for (std::string line; std::getline(lines, line);) events.push_back(nlohmann::json::parse(line).at("event"));
  EXPECT_EQ(events, (std::vector<std::string>{"epoch", "summary"})) << m;
  EXPECT_NE(m.find("\"model\":\"resnet18\""), std::string::npos) << m;
}

// bsp's updates do not depend on timing: with the same seed, the same
// augmented batches give the same losses, epoch by epoch.
TEST(CifarCli, TwoRunsWithTheSameSeedAugmentTheSameWay) {
  TempDir tmp;
  write_cifar10(tmp / "cifar10", 100);
  auto run = [&](const std::string& name, const std::string& seed) {
    const CliRun r = asgd("train --dataset cifar10 --data-dir " + (tmp / "cifar10").string() +
                          " --model lenet --policy bsp --epochs 2 --validation-size 50 --augment crop,flip --seed " +
                          seed + " --metrics-out " + (tmp / name).string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("augment crop,flip"), std::string::npos) << r.out;
    std::vector<double> losses;
    std::istringstream lines(slurp(tmp / name));
    for (std::string line; std::getline(lines, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("event") == "epoch") losses.push_back(j.at("train_loss").get<double>());
    }
    EXPECT_EQ(losses.size(), 2u);
    return losses;
  };
  const auto first = run("a.jsonl", "3");
  EXPECT_EQ(first, run("b.jsonl", "3"));
  EXPECT_NE(first, run("c.jsonl", "4"));
}

}  // namespace
}  // namespace asgd_test
