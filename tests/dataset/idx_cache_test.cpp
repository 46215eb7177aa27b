// dataset/idx_cache.hpp: decompressed copies of gzip'd IDX image files,
// checked against the CRC-32C in their names; real files in a temporary
// folder.

#include "dataset/idx_cache.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "captured_log.hpp"
#include "dataset/idx_files.hpp"
#include "temp_dir.hpp"
#include "tests/test_data.hpp"

namespace asgd::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using asgd_test::write_gz;
using asgd_test::write_raw;

// An idx3 file of `count` 32x32 images whose pixels depend on `seed`: 1,000
// images are 1,024,000 bytes, about the smallest the cache keeps.
Bytes images_file(std::uint32_t count, std::uint32_t seed) {
  Bytes b;
  asgd_test::put_be32(b, 0x00000803);
  asgd_test::put_be32(b, count);
  asgd_test::put_be32(b, 32);
  asgd_test::put_be32(b, 32);
  for (std::uint32_t i = 0; i < count * 1024; ++i) b.push_back(static_cast<std::uint8_t>((i * 2654435761u + seed) >> 13));
  return b;
}

// The copies in `dir` (not the ".source" beside each, nor a temporary file).
std::vector<fs::path> copies(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".idx" && !e.path().filename().string().starts_with(".")) out.push_back(e.path());
  return out;
}

std::size_t entries(const fs::path& dir) {
  std::error_code ec;
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir, ec), fs::directory_iterator{}));
}

void age(const fs::path& p, std::chrono::minutes by) { fs::last_write_time(p, fs::last_write_time(p) - by); }

struct IdxCache : ::testing::Test {
  asgd_test::TempDir tmp;
  fs::path source = tmp.path() / "train-images-idx3-ubyte.gz";
  fs::path cache = tmp.path() / "cache";
};

TEST_F(IdxCache, TheSecondReadComesFromTheCopyBitForBit) {
  write_gz(source, images_file(1100, 1));
  const auto direct = read_idx_images(source);
  ASSERT_TRUE(direct.ok()) << direct.status().to_string();
  CacheUse use = CacheUse::none;
  auto first = read_idx_images_cached(source, cache, &use);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(use, CacheUse::written);
  const auto kept = copies(cache);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].filename().string().rfind("train-images-idx3-ubyte-", 0), 0u) << kept[0];
  EXPECT_EQ(fs::file_size(kept[0]), 16u + 1100u * 1024u) << "a plain IDX file";
  std::ifstream named(kept[0].string() + ".source");
  std::string source_line;
  ASSERT_TRUE(std::getline(named, source_line));
  EXPECT_EQ(source_line, fs::canonical(source).string());
  EXPECT_EQ(entries(cache), 2u) << "the copy and its .source, nothing else";
  auto second = read_idx_images_cached(source, cache, &use);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(use, CacheUse::hit);
  for (const auto* read : {&*first, &*second}) {
    EXPECT_EQ(read->count, 1100u);
    EXPECT_EQ(read->rows, 32u);
    EXPECT_EQ(read->cols, 32u);
    EXPECT_EQ(read->pixels, direct->pixels);
  }
}

TEST_F(IdxCache, ADamagedOrTruncatedCopyIsReportedRemovedAndWrittenAgain) {
  write_gz(source, images_file(1100, 2));
  const auto direct = read_idx_images(source);
  ASSERT_TRUE(direct.ok());
  ASSERT_TRUE(read_idx_images_cached(source, cache).ok());
  const fs::path copy = copies(cache).at(0);
  for (const bool truncate : {false, true}) {
    if (truncate) {
      fs::resize_file(copy, fs::file_size(copy) - 100);
    } else {
      std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(5000);
      f.put('\x7f');  // one pixel changed
    }
    const asgd_test::CapturedLog log;
    CacheUse use = CacheUse::none;
    auto read = read_idx_images_cached(source, cache, &use);
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(read->pixels, direct->pixels) << "nothing read from the damaged copy";
    EXPECT_EQ(use, CacheUse::written);
    EXPECT_EQ(log.count("the dataset cache's copy of " + source.string() + " is damaged"), 1u);
    EXPECT_EQ(log.count(truncate ? "truncated" : "CRC-32C of the images"), 1u);
    ASSERT_EQ(copies(cache).size(), 1u);
    auto again = read_idx_images_cached(source, cache, &use);
    EXPECT_EQ(use, CacheUse::hit) << "the copy was written again";
    EXPECT_EQ(again->pixels, direct->pixels);
  }
}

TEST_F(IdxCache, ACopyWhoseHeaderWasChangedIsDamagedNotTheSource) {
  write_gz(source, images_file(1100, 6));
  const auto direct = read_idx_images(source);
  ASSERT_TRUE(read_idx_images_cached(source, cache).ok());
  const fs::path copy = copies(cache).at(0);
  {  // 550 images of 64x32: the same bytes after the header
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    const char head[8] = {0, 0, 0x02, 0x26, 0, 0, 0, 64};
    f.seekp(4);
    f.write(head, sizeof head);
  }
  const asgd_test::CapturedLog log;
  CacheUse use = CacheUse::none;
  auto read = read_idx_images_cached(source, cache, &use);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(use, CacheUse::written);
  EXPECT_EQ(read->count, 1100u);
  EXPECT_EQ(read->rows, 32u);
  EXPECT_EQ(read->pixels, direct->pixels);
  EXPECT_EQ(log.count("the dataset cache's copy of " + source.string() + " is damaged"), 1u);
}

TEST_F(IdxCache, ASourceReplacedWithItsSizeAndTimesKeptGetsACopyOfItsOwn) {
  // `cp -p` or `tar x` of another download over it: the same size,
  // modification time and inode; only the change time differs.
  write_gz(source, images_file(1100, 7), "wb0");
  const auto mtime = fs::last_write_time(source);
  ASSERT_TRUE(read_idx_images_cached(source, cache).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const fs::path other = tmp.path() / "other.gz";
  write_gz(other, images_file(1100, 8), "wb0");
  ASSERT_EQ(fs::file_size(other), fs::file_size(source));
  {
    std::ifstream in(other, std::ios::binary);
    std::ofstream out(source, std::ios::binary | std::ios::trunc);  // the same inode
    out << in.rdbuf();
  }
  fs::last_write_time(source, mtime);
  CacheUse use = CacheUse::none;
  auto read = read_idx_images_cached(source, cache, &use);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(use, CacheUse::written);
  EXPECT_EQ(read->pixels, read_idx_images(other)->pixels) << "not the replaced file's images";
}

TEST_F(IdxCache, WritingACopyRemovesTheCopiesOfSourcesThatAreGoneAndWhatDeadWritesLeft) {
  const fs::path gone_dir = tmp.path() / "deleted";
  fs::create_directories(gone_dir);
  write_gz(gone_dir / "train-images-idx3-ubyte.gz", images_file(1100, 9));
  ASSERT_TRUE(read_idx_images_cached(gone_dir / "train-images-idx3-ubyte.gz", cache).ok());
  const fs::path gone_copy = copies(cache).at(0);
  fs::remove_all(gone_dir);
  // What a killed write left, an old copy without a .source, and a write
  // under way in another process (young).
  const fs::path dead_tmp = cache / ".tmp-999999-0-x.idx";
  const fs::path legacy = cache / "t10k-images-idx3-ubyte-01234567-89abcdef-01234567.idx";
  const fs::path young_tmp = cache / ".tmp-999998-0-y.idx";
  for (const auto& p : {dead_tmp, legacy, young_tmp}) write_raw(p, images_file(2, 1));
  age(dead_tmp, std::chrono::minutes(61));
  age(legacy, std::chrono::minutes(61));

  write_gz(source, images_file(1100, 10));
  CacheUse use = CacheUse::none;
  ASSERT_TRUE(read_idx_images_cached(source, cache, &use).ok());
  EXPECT_EQ(use, CacheUse::written);
  for (const auto& p : {gone_copy, fs::path(gone_copy.string() + ".source"), dead_tmp, legacy})
    EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(young_tmp));
  EXPECT_EQ(copies(cache).size(), 1u);
  EXPECT_EQ(entries(cache), 3u) << "the new copy, its .source and the young temporary file";
}

TEST_F(IdxCache, ANamedPipeIsRefusedWithoutWaitingForAWriter) {
  ASSERT_EQ(::mkfifo(source.c_str(), 0600), 0);
  for (const fs::path& with : {cache, fs::path{}}) {
    auto read = read_idx_images_cached(source, with);  // would block in open() for ever
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().to_string(),
              "I/O error: " + source.string() + ": not a regular file (a named pipe, a device or a socket)");
  }
}

TEST_F(IdxCache, AnEditedSourceGetsACopyOfItsOwnAndTheOldOneGoes) {
  write_gz(source, images_file(1100, 3));
  ASSERT_TRUE(read_idx_images_cached(source, cache).ok());
  const fs::path old = copies(cache).at(0);
  // Another file of the same size under the same name (a newer download).
  write_gz(source, images_file(1100, 4));
  fs::last_write_time(source, fs::last_write_time(source) + std::chrono::seconds(2));
  const auto direct = read_idx_images(source);
  CacheUse use = CacheUse::none;
  auto read = read_idx_images_cached(source, cache, &use);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(use, CacheUse::written);
  EXPECT_EQ(read->pixels, direct->pixels);
  const auto kept = copies(cache);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_NE(kept[0], old);
  // Another source file (another folder) keeps its own copy beside it.
  const fs::path elsewhere = tmp.path() / "b";
  fs::create_directories(elsewhere);
  write_gz(elsewhere / "train-images-idx3-ubyte.gz", images_file(1100, 3));
  ASSERT_TRUE(read_idx_images_cached(elsewhere / "train-images-idx3-ubyte.gz", cache).ok());
  EXPECT_EQ(copies(cache).size(), 2u);
}

TEST_F(IdxCache, SmallPlainOrUncachedFilesAndAFolderThatCannotBeWrittenLoadAsBefore) {
  CacheUse use = CacheUse::hit;
  write_gz(source, images_file(10, 5));  // 10 KiB
  ASSERT_TRUE(read_idx_images_cached(source, cache, &use).ok());
  EXPECT_EQ(use, CacheUse::none);
  EXPECT_TRUE(copies(cache).empty());

  const fs::path plain = tmp.path() / "plain-idx3-ubyte";
  const Bytes bytes = images_file(1100, 5);
  write_raw(plain, bytes);
  ASSERT_TRUE(read_idx_images_cached(plain, cache, &use).ok());
  EXPECT_EQ(use, CacheUse::none) << "nothing to inflate";

  write_gz(source, bytes);
  ASSERT_TRUE(read_idx_images_cached(source, {}, &use).ok());
  EXPECT_EQ(use, CacheUse::none);

  // A "folder" under a regular file cannot be made (root or not).
  auto read = read_idx_images_cached(source, plain / "cache", &use);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(use, CacheUse::unwritten);
  EXPECT_EQ(read->count, 1100u);

  // A damaged source is the same error as without the cache.
  std::ofstream(tmp.path() / "bad.gz", std::ios::binary) << "\x1f\x8b not really gzip";
  auto bad = read_idx_images_cached(tmp.path() / "bad.gz", cache, &use);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().to_string(), read_idx_images(tmp.path() / "bad.gz").status().to_string());
}

}  // namespace
}  // namespace asgd::data
