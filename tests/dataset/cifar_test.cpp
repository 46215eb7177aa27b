// The CIFAR-10 reader on files the tests write: shapes, labels, per-channel
// normalisation, where it finds the batches, and named errors for a
// truncated file, a bad label or a missing batch.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "dataset/cifar.hpp"
#include "dataset/cifar_files.hpp"
#include "dataset/dataset.hpp"
#include "temp_dir.hpp"

namespace asgd::data {
namespace {

namespace fs = std::filesystem;
using asgd_test::TempDir;

TEST(Cifar10, LoadsTheBatchesAsThreeChannelImagesNormalisedPerChannel) {
  TempDir tmp;
  asgd_test::write_cifar10(tmp.path(), 20);
  auto d = load_dataset("cifar10", tmp.path(), 10, 7);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->train.count, 90u);
  EXPECT_EQ(d->validation.count, 10u);
  EXPECT_EQ(d->test.count, 20u);
  EXPECT_EQ(d->train.channels, 3u);
  EXPECT_EQ(d->train.rows, 32u);
  EXPECT_EQ(d->train.cols, 32u);
  ASSERT_EQ(d->normalization.mean.size(), 3u);
  ASSERT_EQ(d->normalization.stddev.size(), 3u);
  // Per channel, the training split is centred and scaled to unit spread.
  const std::vector<float> pixels = d->train.samples(0, d->train.count);
  for (std::size_t c = 0; c < 3; ++c) {
    double sum = 0, sq = 0;
    std::size_t n = 0;
    for (std::size_t i = 0; i < d->train.count; ++i)
      for (std::size_t p = 0; p < 1024; ++p) {
        const double v = pixels[i * 3072 + c * 1024 + p];
        sum += v;
        sq += v * v;
        ++n;
      }
    EXPECT_NEAR(sum / n, 0.0, 1e-4) << "channel " << c;
    EXPECT_NEAR(std::sqrt(sq / n - (sum / n) * (sum / n)), 1.0, 1e-3) << "channel " << c;
  }
  // The test set is in file order: record r has label r % 10, and its first
  // red pixel maps back to the byte written.
  std::uint32_t state = 1;
  for (int batch = 0; batch < 5; ++batch)
    for (int r = 0; r < 20; ++r) asgd_test::cifar_record(static_cast<std::uint8_t>(r % 10), state);
  const auto first = asgd_test::cifar_record(0, state);
  EXPECT_EQ(d->test.labels[3], 3);
  const float x = d->test.samples(0, 1)[0];
  EXPECT_EQ(std::lround((x * d->normalization.stddev[0] + d->normalization.mean[0]) * 255.0), first[1]);
}

TEST(Cifar10, FindsTheBatchesInTheFolderTheArchiveUnpacksOrUnderTheDatasetsFolder) {
  TempDir tmp;
  asgd_test::write_cifar10(tmp / "cifar10" / "cifar-10-batches-bin", 10);
  EXPECT_TRUE(load_dataset("cifar10", tmp.path(), 10, 1).ok());
  EXPECT_TRUE(load_dataset("cifar10", tmp / "cifar10", 10, 1).ok());
  const auto none = load_dataset("cifar10", tmp / "cifar10" / "cifar-10-batches-bin" / "..", 10, 1);
  EXPECT_TRUE(none.ok());
  const auto missing = find_cifar10_folder(tmp / "elsewhere");
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
  EXPECT_NE(missing.status().message().find("asgd data fetch cifar10"), std::string::npos);
}

TEST(Cifar10, ATruncatedFileABadLabelOrAMissingBatchIsNamed) {
  TempDir tmp;
  asgd_test::write_cifar10(tmp.path(), 10);
  fs::resize_file(tmp / "data_batch_3.bin", 3073 * 10 - 5);
  auto cut = load_dataset("cifar10", tmp.path(), 5, 1);
  EXPECT_EQ(cut.status().code(), StatusCode::corruption);
  EXPECT_NE(cut.status().message().find("data_batch_3.bin: 30725 bytes is not a whole number of 3073-byte records"),
            std::string::npos)
      << cut.status().message();

  asgd_test::write_cifar10(tmp.path(), 10);
  {
    std::fstream f(tmp / "test_batch.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3073 * 4);
    f.put(static_cast<char>(12));
  }
  auto label = load_dataset("cifar10", tmp.path(), 5, 1);
  EXPECT_EQ(label.status().code(), StatusCode::corruption);
  EXPECT_NE(label.status().message().find("test_batch.bin: record 4 has label 12, outside 0..9"), std::string::npos)
      << label.status().message();

  asgd_test::write_cifar10(tmp.path(), 10);
  fs::remove(tmp / "data_batch_5.bin");
  auto missing = load_dataset("cifar10", tmp.path(), 5, 1);
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
  EXPECT_NE(missing.status().message().find("data_batch_5.bin: no such file"), std::string::npos);
}

// Only the archive in the folder: the message said to download it, when
// the fetch would check and unpack the one here. A --validation-size too
// large named data_batch_1.bin for a training set of five files.
TEST(Cifar10, OnlyTheArchiveHereSaysTheFetchUnpacksItAndTheTrainingSetIsNamedByItsFolder) {
  TempDir tmp;
  fs::create_directories(tmp / "only");
  std::ofstream(tmp / "only" / kCifar10Archive) << "an archive";
  const auto only = find_cifar10_folder(tmp / "only");
  EXPECT_EQ(only.status().code(), StatusCode::not_found);
  EXPECT_NE(only.status().message().find(std::string(kCifar10Archive) + " is: asgd data fetch cifar10 --data-dir"),
            std::string::npos)
      << only.status().message();
  asgd_test::write_cifar10(tmp / "batches", 10);  // 50 training images
  const auto big = load_dataset("cifar10", tmp / "batches", 50, 1);
  EXPECT_EQ(big.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(big.status().message().find("the 50 training images in " + (tmp / "batches").string()), std::string::npos)
      << big.status().message();
  EXPECT_EQ(big.status().message().find("data_batch_1.bin"), std::string::npos) << big.status().message();
}

}  // namespace
}  // namespace asgd::data
