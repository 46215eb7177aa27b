#include "dataset/idx.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/test_data.hpp"

namespace asgd::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using asgd_test::put_be32;
using asgd_test::TempDir;

Bytes idx3(std::uint32_t count, std::uint32_t rows, std::uint32_t cols, std::size_t pixel_bytes) {
  Bytes b;
  put_be32(b, 0x00000803);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  for (std::size_t i = 0; i < pixel_bytes; ++i) b.push_back(static_cast<std::uint8_t>((i * 7 + i / 784) % 256));
  return b;
}

// The tiny valid image file most tests start from: 3 images of 28x28.
Bytes three_images() { return idx3(3, 28, 28, 3 * 28 * 28); }

Bytes idx1(const Bytes& labels) {
  Bytes b;
  put_be32(b, 0x00000801);
  put_be32(b, static_cast<std::uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void write_raw(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gz(const fs::path& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The status message starts with the path, is one line, and mentions `what`.
void expect_error(const Status& s, StatusCode code, const fs::path& path, const std::string& what) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_EQ(s.message().rfind(path.string(), 0), 0u) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(what), std::string::npos) << "expected \"" << what << "\" in: " << s.message();
}

TEST(GzReader, ReadsAGzipFileBackToItsOriginalBytes) {
  TempDir dir;
  const auto path = dir.path() / "a.gz";
  const Bytes original = three_images();
  write_gz(path, original);
  auto got = read_gz_file(path);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, original);
}

TEST(GzReader, ReadsAnUncompressedFileAsIs) {
  TempDir dir;
  const auto path = dir.path() / "a";
  const Bytes original = three_images();
  write_raw(path, original);
  auto got = read_gz_file(path);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, original);
}

TEST(GzReader, ReadsConcatenatedGzipMembersAsOneFile) {
  TempDir dir;
  const Bytes first = {1, 2, 3};
  const Bytes second = {4, 5};
  write_gz(dir.path() / "1.gz", first);
  write_gz(dir.path() / "2.gz", second);
  Bytes both = read_raw(dir.path() / "1.gz");
  const Bytes tail = read_raw(dir.path() / "2.gz");
  both.insert(both.end(), tail.begin(), tail.end());
  write_raw(dir.path() / "both.gz", both);
  auto got = read_gz_file(dir.path() / "both.gz");
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, (Bytes{1, 2, 3, 4, 5}));
}

TEST(GzReader, ReportsAMissingFileAsNotFound) {
  TempDir dir;
  const auto path = dir.path() / "nope.gz";
  auto got = read_gz_file(path);
  ASSERT_FALSE(got.ok());
  expect_error(got.status(), StatusCode::not_found, path, "no such file");
}

TEST(GzReader, ReportsATruncatedGzipStream) {
  TempDir dir;
  const auto path = dir.path() / "cut.gz";
  write_gz(path, three_images());
  Bytes gz = read_raw(path);
  gz.resize(gz.size() / 2);
  write_raw(path, gz);
  auto got = read_gz_file(path);
  ASSERT_FALSE(got.ok());
  expect_error(got.status(), StatusCode::corruption, path, "truncated gzip stream (unexpected end of file)");
}

TEST(GzReader, ReportsAGzipStreamCutInsideItsTrailer) {
  TempDir dir;
  const auto path = dir.path() / "cut.gz";
  write_gz(path, three_images());
  Bytes gz = read_raw(path);
  gz.resize(gz.size() - 3);
  write_raw(path, gz);
  auto got = read_gz_file(path);
  ASSERT_FALSE(got.ok());
  expect_error(got.status(), StatusCode::corruption, path, "truncated gzip stream");
}

TEST(GzReader, ReportsACrcMismatch) {
  TempDir dir;
  const auto path = dir.path() / "crc.gz";
  write_gz(path, three_images());
  Bytes gz = read_raw(path);
  gz[gz.size() - 8] ^= 0x01;  // first byte of the CRC-32 in the trailer
  write_raw(path, gz);
  auto got = read_gz_file(path);
  ASSERT_FALSE(got.ok());
  expect_error(got.status(), StatusCode::corruption, path, "incorrect data check");
}

TEST(GzReader, ReportsACorruptByteInTheCompressedData) {
  TempDir dir;
  const auto path = dir.path() / "bad.gz";
  write_gz(path, three_images());
  Bytes gz = read_raw(path);
  // Past the 10-byte header, well before the 8-byte trailer: either the
  // decoder rejects the deflate data or the CRC catches the changed output.
  gz[10 + (gz.size() - 18) / 2] ^= 0xff;
  write_raw(path, gz);
  auto got = read_gz_file(path);
  ASSERT_FALSE(got.ok());
  expect_error(got.status(), StatusCode::corruption, path, "corrupt gzip stream");
}

TEST(GzReader, ReportsGarbageAfterTheGzipStream) {
  TempDir dir;
  const auto path = dir.path() / "tail.gz";
  write_gz(path, three_images());
  Bytes gz = read_raw(path);
  gz.insert(gz.end(), {'j', 'u', 'n', 'k'});
  write_raw(path, gz);
  auto got = read_gz_file(path);
  ASSERT_FALSE(got.ok());
  expect_error(got.status(), StatusCode::corruption, path, "4 bytes of trailing garbage");
}

TEST(IdxReader, ReadsATinyImageFile) {
  TempDir dir;
  const auto path = dir.path() / "images.gz";
  const Bytes file = three_images();
  write_gz(path, file);
  auto images = read_idx_images(path);
  ASSERT_TRUE(images.ok()) << images.status().to_string();
  EXPECT_EQ(images->count, 3u);
  EXPECT_EQ(images->rows, 28u);
  EXPECT_EQ(images->cols, 28u);
  EXPECT_EQ(images->pixels, Bytes(file.begin() + 16, file.end()));
}

TEST(IdxReader, ReadsATinyLabelFile) {
  TempDir dir;
  const auto path = dir.path() / "labels";
  write_raw(path, idx1({0, 9, 4}));
  auto labels = read_idx_labels(path, 10);
  ASSERT_TRUE(labels.ok()) << labels.status().to_string();
  EXPECT_EQ(*labels, (Bytes{0, 9, 4}));
}

TEST(IdxReader, ReportsAWrongMagicNumberWithWhatWasFoundAndExpected) {
  TempDir dir;
  const auto path = dir.path() / "labels-not-images.gz";
  write_gz(path, idx1({1, 2, 3}));
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "bad magic number 0x00000801, expected 0x00000803");

  auto labels = read_idx_labels(path, 10);
  ASSERT_TRUE(labels.ok()) << labels.status().to_string();
  const auto images_path = dir.path() / "images-not-labels.gz";
  write_gz(images_path, three_images());
  auto wrong = read_idx_labels(images_path, 10);
  ASSERT_FALSE(wrong.ok());
  expect_error(wrong.status(), StatusCode::corruption, images_path,
               "bad magic number 0x00000803, expected 0x00000801");
}

TEST(IdxReader, ReportsATruncatedUncompressedImageFile) {
  TempDir dir;
  const auto path = dir.path() / "images";
  Bytes file = three_images();
  file.resize(2000);
  write_raw(path, file);
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "truncated: expected 2368 bytes");
  expect_error(images.status(), StatusCode::corruption, path, "got 2000");
}

TEST(IdxReader, ReportsAFileShorterThanItsHeader) {
  TempDir dir;
  const auto path = dir.path() / "images";
  write_raw(path, Bytes{0, 0, 8, 3, 0, 0});
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "truncated");
}

TEST(IdxReader, ReportsAnEmptyFile) {
  TempDir dir;
  const auto path = dir.path() / "labels";
  write_raw(path, Bytes{});
  auto labels = read_idx_labels(path, 10);
  ASSERT_FALSE(labels.ok());
  expect_error(labels.status(), StatusCode::corruption, path, "truncated");
}

TEST(IdxReader, ReportsTrailingBytesAfterTheDeclaredImages) {
  TempDir dir;
  const auto path = dir.path() / "images.gz";
  Bytes file = three_images();
  file.insert(file.end(), 5, 0);
  write_gz(path, file);
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "5 trailing bytes");
}

TEST(IdxReader, ReportsTrailingBytesAfterTheDeclaredLabels) {
  TempDir dir;
  const auto path = dir.path() / "labels";
  Bytes file = idx1({1, 2, 3});
  file.push_back(0);
  write_raw(path, file);
  auto labels = read_idx_labels(path, 10);
  ASSERT_FALSE(labels.ok());
  expect_error(labels.status(), StatusCode::corruption, path, "1 trailing bytes");
}

TEST(IdxReader, ReportsAnOutOfRangeLabelWithItsIndexAndValue) {
  TempDir dir;
  const auto path = dir.path() / "labels.gz";
  write_gz(path, idx1({3, 1, 4, 1, 5, 10, 2}));
  auto labels = read_idx_labels(path, 10);
  ASSERT_FALSE(labels.ok());
  expect_error(labels.status(), StatusCode::corruption, path, "label 10 at index 5 is out of range");
}

TEST(IdxReader, RejectsImagesWithZeroRowsOrCols) {
  TempDir dir;
  const auto path = dir.path() / "images";
  write_raw(path, idx3(3, 0, 28, 0));
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "3 images of 0x28");
}

TEST(IdxReader, RejectsAHeaderWhoseSizeWouldOverflowBeforeAllocating) {
  TempDir dir;
  const auto path = dir.path() / "images";
  write_raw(path, idx3(0xffffffffu, 0xffffu, 0xffffu, 0));
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "more than the IDX size limit");
}

TEST(IdxReader, ReportsATruncatedRealImageFileByName) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir dir;
  const auto path = dir.path() / "t10k-images-idx3-ubyte.gz";
  Bytes gz = read_raw(mnist / "t10k-images-idx3-ubyte.gz");
  ASSERT_GT(gz.size(), 1000u);
  gz.resize(gz.size() - 1000);
  write_raw(path, gz);
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "truncated gzip stream (unexpected end of file)");
}

TEST(IdxReader, ReadsTheRealMnistTestFiles) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  auto images = read_idx_images(mnist / "t10k-images-idx3-ubyte.gz");
  ASSERT_TRUE(images.ok()) << images.status().to_string();
  EXPECT_EQ(images->count, 10000u);
  EXPECT_EQ(images->rows, 28u);
  EXPECT_EQ(images->cols, 28u);
  EXPECT_EQ(images->pixels.size(), 10000u * 28 * 28);

  auto labels = read_idx_labels(mnist / "t10k-labels-idx1-ubyte.gz", 10);
  ASSERT_TRUE(labels.ok()) << labels.status().to_string();
  std::array<int, 10> counts{};
  for (auto l : *labels) ++counts[l];
  EXPECT_EQ(counts, (std::array<int, 10>{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009}));
}

}  // namespace
}  // namespace asgd::data
