#include "dataset/dataset.hpp"

#include <gtest/gtest.h>

#include "dataset/idx_files.hpp"
#include "temp_dir.hpp"
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/test_data.hpp"

namespace asgd::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using asgd_test::write_gz;
using asgd_test::write_raw;
using asgd_test::put_be32;
using asgd_test::TempDir;

constexpr std::array<int, 10> kMnistTrainClassCounts = {5923, 6742, 5958, 6131, 5842,
                                                        5421, 5918, 6265, 5851, 5949};
constexpr std::array<int, 10> kMnistTestClassCounts = {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009};

// Image i is 4x4; its first two pixels hold i (low byte, high byte), so a
// test can tell which original image ended up where.
constexpr std::uint32_t kSide = 4;

Bytes tiny_images(std::uint32_t count, std::uint32_t side = kSide) {
  Bytes b;
  put_be32(b, 0x00000803);
  put_be32(b, count);
  put_be32(b, side);
  put_be32(b, side);
  for (std::uint32_t i = 0; i < count; ++i) {
    for (std::uint32_t p = 0; p < side * side; ++p) {
      const std::uint32_t v = p == 0 ? i % 256 : p == 1 ? i / 256 : (i * 31 + p * 17) % 256;
      b.push_back(static_cast<std::uint8_t>(v));
    }
  }
  return b;
}

Bytes tiny_labels(std::uint32_t count) {
  Bytes b;
  put_be32(b, 0x00000801);
  put_be32(b, count);
  for (std::uint32_t i = 0; i < count; ++i) b.push_back(static_cast<std::uint8_t>(i % 10));
  return b;
}

// The four official files of a tiny dataset, gzipped.
void write_tiny_dataset(const fs::path& dir, std::uint32_t train, std::uint32_t test) {
  write_gz(dir / "train-images-idx3-ubyte.gz", tiny_images(train));
  write_gz(dir / "train-labels-idx1-ubyte.gz", tiny_labels(train));
  write_gz(dir / "t10k-images-idx3-ubyte.gz", tiny_images(test));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", tiny_labels(test));
}

// Undoes the normalisation of one pixel back to its byte value.
int raw_pixel(const DatasetSplits& d, float x) {
  return static_cast<int>(std::lround((x * d.normalization.stddev.at(0) + d.normalization.mean.at(0)) * 255.0));
}

// The original training index of each sample in `split`, read back from its
// first two pixels.
std::vector<std::size_t> original_indices(const DatasetSplits& d, const LabeledImages& split) {
  std::vector<std::size_t> out;
  const std::vector<float> pixels = split.samples(0, split.count);
  for (std::size_t k = 0; k < split.count; ++k) {
    const float* px = pixels.data() + k * split.sample_size();
    out.push_back(static_cast<std::size_t>(raw_pixel(d, px[0]) + 256 * raw_pixel(d, px[1])));
  }
  return out;
}

std::array<int, 10> class_counts(const LabeledImages& split) {
  std::array<int, 10> counts{};
  for (auto l : split.labels) ++counts.at(static_cast<std::size_t>(l));
  return counts;
}

void expect_error(const Status& s, StatusCode code, const std::string& what) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(what), std::string::npos) << "expected \"" << what << "\" in: " << s.message();
}

TEST(LoadDataset, RealMnistSplitsInto55000Train5000ValidationAnd10000Test) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  auto d = load_dataset("mnist", dir, 5000, 1);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->name, "mnist");
  EXPECT_EQ(d->num_classes, 10u);
  for (const LabeledImages* split : {&d->train, &d->validation, &d->test}) {
    EXPECT_EQ(split->channels, 1u);
    EXPECT_EQ(split->rows, 28u);
    EXPECT_EQ(split->cols, 28u);
    EXPECT_EQ(split->bytes.size(), split->count * 784);
    EXPECT_EQ(split->labels.size(), split->count);
  }
  EXPECT_EQ(d->train.count, 55000u);
  EXPECT_EQ(d->validation.count, 5000u);
  EXPECT_EQ(d->test.count, 10000u);

  EXPECT_EQ(class_counts(d->test), kMnistTestClassCounts);
  // Together, train and validation are exactly the official training set.
  std::array<int, 10> train_counts = class_counts(d->train);
  const std::array<int, 10> validation_counts = class_counts(d->validation);
  for (std::size_t c = 0; c < 10; ++c) train_counts[c] += validation_counts[c];
  EXPECT_EQ(train_counts, kMnistTrainClassCounts);
}

TEST(LoadDataset, TheDatasetsParentFolderIsTakenWhenItHoldsTheDatasetsFolder) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const auto parent = dir.parent_path();  // ../shared/data, as --data-dir users give it
  auto from_parent = load_dataset("mnist", parent, 5000, 1);
  ASSERT_TRUE(from_parent.ok()) << from_parent.status().to_string();
  auto direct = load_dataset("mnist", dir, 5000, 1);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(from_parent->train.count, direct->train.count);
  EXPECT_EQ(from_parent->test.labels, direct->test.labels);
}

TEST(LoadDataset, RealMnistTrainingPixelsAreNormalisedToMeanZeroAndStddevOne) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  auto d = load_dataset("mnist", dir, 5000, 7);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  double sum = 0.0;
  double sum_sq = 0.0;
  const std::vector<float> pixels = d->train.samples(0, d->train.count);
  for (float x : pixels) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(pixels.size());
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 1.0, 1e-4);
  // The well-known MNIST statistics, measured here on the training split only.
  EXPECT_NEAR(d->normalization.mean.at(0), 0.1307, 2e-3);
  EXPECT_NEAR(d->normalization.stddev.at(0), 0.3081, 2e-3);
}

TEST(LoadDataset, RealFashionMnistLoadsWithSixThousandImagesPerClass) {
  ASGD_REQUIRE_DATASET(dir, "fashion-mnist");
  auto d = load_dataset("fashion-mnist", dir, 10000, 3);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->name, "fashion-mnist");
  EXPECT_EQ(d->train.count, 50000u);
  EXPECT_EQ(d->validation.count, 10000u);
  EXPECT_EQ(d->test.count, 10000u);
  std::array<int, 10> all = class_counts(d->train);
  const std::array<int, 10> validation_counts = class_counts(d->validation);
  for (std::size_t c = 0; c < 10; ++c) all[c] += validation_counts[c];
  std::array<int, 10> six_thousand{};
  six_thousand.fill(6000);
  EXPECT_EQ(all, six_thousand);
  std::array<int, 10> one_thousand{};
  one_thousand.fill(1000);
  EXPECT_EQ(class_counts(d->test), one_thousand);
}

TEST(LoadDataset, TrainAndValidationPartitionTheTrainingSetInAscendingOrder) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 300, 20);
  auto d = load_dataset("mnist", tmp.path(), 70, 11);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_EQ(d->train.count, 230u);
  ASSERT_EQ(d->validation.count, 70u);
  const auto train = original_indices(*d, d->train);
  const auto validation = original_indices(*d, d->validation);
  EXPECT_TRUE(std::is_sorted(train.begin(), train.end()));
  EXPECT_TRUE(std::is_sorted(validation.begin(), validation.end()));
  std::set<std::size_t> all(train.begin(), train.end());
  all.insert(validation.begin(), validation.end());
  EXPECT_EQ(all.size(), 300u);
  EXPECT_EQ(*all.rbegin(), 299u);
  // Labels travel with their images.
  for (std::size_t k = 0; k < train.size(); ++k) EXPECT_EQ(d->train.labels[k], static_cast<int>(train[k] % 10));
  // The test set is untouched and in file order.
  const auto test = original_indices(*d, d->test);
  for (std::size_t k = 0; k < test.size(); ++k) EXPECT_EQ(test[k], k);
}

TEST(LoadDataset, TheSameSeedGivesTheSameSplitAndADifferentSeedAnother) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 300, 20);
  auto a = load_dataset("mnist", tmp.path(), 50, 42);
  auto b = load_dataset("mnist", tmp.path(), 50, 42);
  auto c = load_dataset("mnist", tmp.path(), 50, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->validation.samples(0, a->validation.count), b->validation.samples(0, b->validation.count));
  EXPECT_EQ(a->train.samples(0, a->train.count), b->train.samples(0, b->train.count));
  EXPECT_EQ(a->train.labels, b->train.labels);
  EXPECT_NE(original_indices(*a, a->validation), original_indices(*c, c->validation));
}

TEST(LoadDataset, NormalisationIsMeasuredOnTheTrainingSplitOnly) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 300, 20);
  auto d = load_dataset("mnist", tmp.path(), 100, 5);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  // Recompute the statistics of the raw training-split bytes directly.
  const Bytes file = tiny_images(300);
  double sum = 0.0;
  double sum_sq = 0.0;
  std::size_t n = 0;
  for (std::size_t i : original_indices(*d, d->train)) {
    for (std::size_t p = 0; p < kSide * kSide; ++p) {
      const double x = file[16 + i * kSide * kSide + p] / 255.0;
      sum += x;
      sum_sq += x * x;
      ++n;
    }
  }
  const double mean = sum / static_cast<double>(n);
  const double stddev = std::sqrt(sum_sq / static_cast<double>(n) - mean * mean);
  EXPECT_NEAR(d->normalization.mean.at(0), mean, 1e-6);
  EXPECT_NEAR(d->normalization.stddev.at(0), stddev, 1e-6);
  // Validation and test are normalised with the same numbers.
  const std::size_t v0 = original_indices(*d, d->validation)[0];
  const float expected = static_cast<float>((file[16 + v0 * kSide * kSide + 5] / 255.0 - mean) / stddev);
  EXPECT_NEAR(d->validation.samples(0, 1)[5], expected, 1e-5);
}

TEST(LoadDataset, AcceptsUncompressedFilesAndPrefersGzWhenBothExist) {
  TempDir tmp;
  write_raw(tmp.path() / "train-images-idx3-ubyte", tiny_images(30));
  write_raw(tmp.path() / "train-labels-idx1-ubyte", tiny_labels(30));
  write_raw(tmp.path() / "t10k-images-idx3-ubyte", tiny_images(10));
  write_raw(tmp.path() / "t10k-labels-idx1-ubyte", tiny_labels(10));
  auto plain = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->train.count, 25u);

  write_gz(tmp.path() / "t10k-images-idx3-ubyte.gz", tiny_images(12));
  write_gz(tmp.path() / "t10k-labels-idx1-ubyte.gz", tiny_labels(12));
  auto both = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_EQ(both->test.count, 12u);
}

TEST(LoadDataset, ReportsMismatchedImageAndLabelCountsNamingBothFiles) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 30, 10);
  write_gz(tmp.path() / "train-labels-idx1-ubyte.gz", tiny_labels(29));
  auto d = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::corruption, (tmp.path() / "train-images-idx3-ubyte.gz").string());
  expect_error(d.status(), StatusCode::corruption, (tmp.path() / "train-labels-idx1-ubyte.gz").string());
  expect_error(d.status(), StatusCode::corruption, "30 images but");
}

// A training file of no images is damaged data, not a --validation-size
// to lower (it said "validation_size 5 must be smaller than the 0
// training images").
TEST(LoadDataset, ReportsAnEmptyTrainingSetAsCorruptNamingTheFile) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 0, 10);
  auto d = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::corruption,
               (tmp.path() / "train-images-idx3-ubyte.gz").string() + ": the training set is empty");
}

TEST(LoadDataset, ReportsTrainAndTestImagesOfDifferentSizes) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 30, 10);
  write_gz(tmp.path() / "t10k-images-idx3-ubyte.gz", tiny_images(10, 5));
  auto d = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::corruption, (tmp.path() / "t10k-images-idx3-ubyte.gz").string());
  expect_error(d.status(), StatusCode::corruption, "5x5");
}

TEST(LoadDataset, PassesOnTheErrorOfACorruptFile) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 30, 10);
  Bytes labels = tiny_labels(10);
  labels[8 + 3] = 200;
  write_gz(tmp.path() / "t10k-labels-idx1-ubyte.gz", labels);
  auto d = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_FALSE(d.ok());
  const std::string path = (tmp.path() / "t10k-labels-idx1-ubyte.gz").string();
  expect_error(d.status(), StatusCode::corruption, path + ": label 200 at index 3");
}

TEST(LoadDataset, ReportsAMissingFileByItsGzPath) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 30, 10);
  fs::remove(tmp.path() / "t10k-images-idx3-ubyte.gz");
  auto d = load_dataset("mnist", tmp.path(), 5, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::not_found, (tmp.path() / "t10k-images-idx3-ubyte.gz").string());
}

TEST(LoadDataset, ReportsAMissingDirectory) {
  TempDir tmp;
  const auto missing = tmp.path() / "no-such-dir";
  auto d = load_dataset("mnist", missing, 5, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::not_found, "data directory " + missing.string() + " does not exist");
}

TEST(LoadDataset, RejectsAValidationSetAsLargeAsTheTrainingSet) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 30, 10);
  auto d = load_dataset("mnist", tmp.path(), 30, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::invalid_argument, "--validation-size 30: must be smaller than the");
  EXPECT_TRUE(load_dataset("mnist", tmp.path(), 29, 1).ok());
}

TEST(LoadDataset, RejectsAnUnknownNameListingTheKnownOnes) {
  auto d = load_dataset("imagenet", "/nonexistent", 0, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::invalid_argument, "imagenet");
  expect_error(d.status(), StatusCode::invalid_argument, "mnist, fashion-mnist");
  EXPECT_TRUE(is_known_dataset("mnist"));
  EXPECT_TRUE(is_known_dataset("fashion-mnist"));
  EXPECT_FALSE(is_known_dataset("imagenet"));
}

TEST(LoadDataset, KnowsCifar10AndSaysWhereItsMissingFolderShouldBe) {
  auto d = load_dataset("cifar10", "/nonexistent", 0, 1);
  ASSERT_FALSE(d.ok());
  expect_error(d.status(), StatusCode::not_found, "/nonexistent");
  EXPECT_TRUE(is_known_dataset("cifar10"));
}

TEST(ShuffledOrder, IsAPermutation) {
  for (std::size_t n : {0u, 1u, 2u, 17u, 1000u}) {
    auto order = shuffled_order(n, 9, 2, 3);
    ASSERT_EQ(order.size(), n);
    std::sort(order.begin(), order.end());
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(order[i], i);
  }
}

TEST(ShuffledOrder, TheSameSeedStreamAndEpochGiveTheSameOrder) {
  EXPECT_EQ(shuffled_order(5000, 123, 4, 7), shuffled_order(5000, 123, 4, 7));
}

TEST(ShuffledOrder, ADifferentEpochStreamOrSeedGivesADifferentOrder) {
  const auto base = shuffled_order(5000, 123, 4, 7);
  EXPECT_NE(base, shuffled_order(5000, 123, 4, 8));
  EXPECT_NE(base, shuffled_order(5000, 123, 5, 7));
  EXPECT_NE(base, shuffled_order(5000, 124, 4, 7));
}

TEST(ShuffledOrder, IsPinnedForAFixedSeed) {
  // Fisher-Yates over Rng::below, checked against an independent Python
  // reimplementation. If this changes, saved runs stop being reproducible.
  EXPECT_EQ(shuffled_order(10, 1, 2, 3), (std::vector<std::size_t>{5, 3, 2, 8, 6, 9, 4, 0, 7, 1}));
}

TEST(PartitionFor, CoversEveryIndexExactlyOnceWithSizesWithinOne) {
  const std::vector<std::pair<std::size_t, std::size_t>> cases = {
      {0, 1}, {0, 3}, {1, 1}, {1, 4}, {10, 3}, {10, 10}, {55000, 7}, {55000, 8}, {7, 16}};
  for (const auto& [n, count] : cases) {
    std::size_t next = 0;
    std::size_t smallest = n;
    std::size_t largest = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const Partition p = partition_for(n, i, count);
      EXPECT_EQ(p.begin, next) << "n=" << n << " count=" << count << " index=" << i;
      EXPECT_LE(p.begin, p.end);
      next = p.end;
      smallest = std::min(smallest, p.size());
      largest = std::max(largest, p.size());
    }
    EXPECT_EQ(next, n) << "n=" << n << " count=" << count;
    EXPECT_LE(largest - smallest, 1u) << "n=" << n << " count=" << count;
  }
}

LabeledImages numbered_images(std::size_t count) {
  LabeledImages images;
  images.count = count;
  images.rows = 2;
  images.cols = 3;
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t p = 0; p < 6; ++p) images.pixels.push_back(static_cast<float>(i * 10 + p));
    images.labels.push_back(static_cast<std::int32_t>(i % 10));
  }
  return images;
}

TEST(GatherBatch, CopiesTheRowsAndLabelsAtTheIndices) {
  const LabeledImages images = numbered_images(8);
  Batch batch;
  const std::vector<std::size_t> indices = {5, 0, 7};
  gather_batch(images, indices, batch);
  ASSERT_EQ(batch.size, 3u);
  ASSERT_EQ(batch.x.size(), 3u * 6);
  EXPECT_EQ(batch.y, (std::vector<std::int32_t>{5, 0, 7}));
  for (std::size_t k = 0; k < indices.size(); ++k) {
    for (std::size_t p = 0; p < 6; ++p) EXPECT_EQ(batch.x[k * 6 + p], static_cast<float>(indices[k] * 10 + p));
  }
}

// Two channels of 2x3 bytes per image, each channel with its own table.
TEST(GatherBatch, DecodesImagesHeldAsBytesThroughTheirChannelsTables) {
  LabeledImages images;
  images.count = 4;
  images.channels = 2;
  images.rows = 2;
  images.cols = 3;
  images.decode.resize(2);
  for (std::size_t v = 0; v < 256; ++v) {
    images.decode[0][v] = static_cast<float>(v) * 0.5f;
    images.decode[1][v] = -static_cast<float>(v);
  }
  for (std::size_t i = 0; i < images.count; ++i) {
    for (std::size_t p = 0; p < 12; ++p) images.bytes.push_back(static_cast<std::uint8_t>(i * 20 + p));
    images.labels.push_back(static_cast<std::int32_t>(i));
  }
  Batch batch;
  const std::vector<std::size_t> indices = {3, 1};
  gather_batch(images, indices, batch);
  ASSERT_EQ(batch.x.size(), 2u * 12);
  EXPECT_EQ(batch.y, (std::vector<std::int32_t>{3, 1}));
  for (std::size_t k = 0; k < indices.size(); ++k) {
    for (std::size_t p = 0; p < 12; ++p) {
      const float byte = static_cast<float>(indices[k] * 20 + p);
      EXPECT_EQ(batch.x[k * 12 + p], p < 6 ? byte * 0.5f : -byte) << "sample " << k << " value " << p;
    }
  }
  // samples() decodes a run of them the same way.
  const std::vector<float> run = images.samples(1, 3);
  ASSERT_EQ(run.size(), 3u * 12);
  EXPECT_TRUE(std::equal(batch.x.begin() + 12, batch.x.end(), run.begin()));
}

TEST(LoadDataset, KeepsEachSplitsPixelsAsTheFilesBytesAQuarterOfFloats) {
  TempDir tmp;
  write_tiny_dataset(tmp.path(), 300, 20);
  auto d = load_dataset("mnist", tmp.path(), 50, 3);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const Bytes file = tiny_images(300);
  const std::size_t ss = kSide * kSide;
  for (const LabeledImages* split : {&d->train, &d->validation, &d->test}) {
    EXPECT_TRUE(split->pixels.empty());
    ASSERT_EQ(split->bytes.size(), split->count * ss);
    ASSERT_EQ(split->decode.size(), 1u);
  }
  // The train split's bytes are the file's, in the order the split takes them.
  const std::vector<std::size_t> originals = original_indices(*d, d->train);
  for (std::size_t k : {std::size_t{0}, d->train.count - 1}) {
    EXPECT_TRUE(std::equal(d->train.bytes.begin() + static_cast<std::ptrdiff_t>(k * ss),
                           d->train.bytes.begin() + static_cast<std::ptrdiff_t>((k + 1) * ss),
                           file.begin() + static_cast<std::ptrdiff_t>(16 + originals[k] * ss)));
  }
}

TEST(GatherBatch, ReusesTheBatchStorage) {
  const LabeledImages images = numbered_images(8);
  Batch batch;
  const std::vector<std::size_t> big = {0, 1, 2, 3, 4, 5, 6, 7};
  gather_batch(images, big, batch);
  const float* x = batch.x.data();
  const std::int32_t* y = batch.y.data();
  const std::vector<std::size_t> small = {3, 1};
  gather_batch(images, small, batch);
  EXPECT_EQ(batch.size, 2u);
  EXPECT_EQ(batch.x.size(), 12u);
  EXPECT_EQ(batch.x.data(), x);
  EXPECT_EQ(batch.y.data(), y);
  EXPECT_EQ(batch.x[0], 30.0f);
  EXPECT_EQ(batch.y[1], 1);
}

}  // namespace
}  // namespace asgd::data
