#include "dataset/idx.hpp"

#include <gtest/gtest.h>

#include "dataset/idx_files.hpp"
#include "temp_dir.hpp"
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
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

Bytes read_raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `head` followed by `zeros` zero bytes as one gzip stream, deflated
// chunk by chunk so the test never holds the uncompressed data: a gzip bomb
// when `zeros` is large (1 GiB becomes about 1 MB).
void write_gz_with_zeros(const fs::path& path, const Bytes& head, std::size_t zeros) {
  z_stream zs{};
  // 15 + 16: gzip wrapper. Run-length matching is as fast as level 1 and
  // shrinks zeros about 1000:1.
  ASSERT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 9, Z_RLE), Z_OK);
  std::ofstream out(path, std::ios::binary);
  Bytes compressed(std::size_t{1} << 16);
  auto feed = [&](const std::uint8_t* data, std::size_t n, int flush) {
    zs.next_in = const_cast<Bytef*>(data);  // zlib's API is not const-correct
    zs.avail_in = static_cast<uInt>(n);
    do {
      zs.next_out = compressed.data();
      zs.avail_out = static_cast<uInt>(compressed.size());
      EXPECT_NE(deflate(&zs, flush), Z_STREAM_ERROR);
      out.write(reinterpret_cast<const char*>(compressed.data()),
                static_cast<std::streamsize>(compressed.size() - zs.avail_out));
    } while (zs.avail_out == 0);
  };
  feed(head.data(), head.size(), Z_NO_FLUSH);
  const Bytes zero_chunk(std::size_t{1} << 20, 0);
  for (std::size_t left = zeros; left > 0;) {
    const std::size_t n = std::min(left, zero_chunk.size());
    feed(zero_chunk.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  feed(nullptr, 0, Z_FINISH);
  deflateEnd(&zs);
  ASSERT_TRUE(out.good()) << path;
}

// Reading a file whose header declares at most 47 MB may raise the peak by
// this much; inflating a whole gzip bomb raised it by 2 GB.
constexpr long kMaxPeakGrowthKb = 200 * 1024;

// Resident memory says nothing under a sanitizer (shadow memory, quarantined
// frees); there only the errors are checked, which still say where reading
// stopped.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRssIsMeaningful = false;
#else
constexpr bool kRssIsMeaningful = true;
#endif

long max_rss_kb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;  // kilobytes on Linux
}

// What reading a file did in a forked child process: its status, and how far
// its peak resident memory rose above where it started, so the figure is the
// read's own and not the test binary's.
struct ChildRead {
  StatusCode code = StatusCode::ok;
  std::string message;
  long peak_growth_kb = -1;
};

// `read` returns a Status; it runs in the child only.
template <class Read>
ChildRead read_in_child(Read read) {
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return {};
  }
  if (pid == 0) {
    close(fds[0]);
    // A forked child's peak starts at the parent's resident size.
    const long before = max_rss_kb();
    const Status s = read();
    const std::string report = std::to_string(max_rss_kb() - before) + " " +
                               std::to_string(static_cast<int>(s.code())) + " " + s.message();
    for (std::size_t sent = 0; sent < report.size();) {
      const ssize_t n = write(fds[1], report.data() + sent, report.size() - sent);
      if (n <= 0) _exit(1);
      sent += static_cast<std::size_t>(n);
    }
    _exit(0);  // not exit(): the parent's gtest state must not run twice
  }
  close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child ended with wait status " << wstatus;
  ChildRead got;
  std::istringstream in(report);
  int code = 0;
  in >> got.peak_growth_kb >> code;
  in.get();
  std::getline(in, got.message);
  got.code = static_cast<StatusCode>(code);
  return got;
}

// The status message starts with the path, is one line, and mentions `what`.
void expect_error(StatusCode got_code, const std::string& message, StatusCode code, const fs::path& path,
                  const std::string& what) {
  EXPECT_EQ(got_code, code) << message;
  EXPECT_EQ(message.rfind(path.string(), 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << "expected \"" << what << "\" in: " << message;
}

void expect_error(const Status& s, StatusCode code, const fs::path& path, const std::string& what) {
  expect_error(s.code(), s.message(), code, path, what);
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
  expect_error(images.status(), StatusCode::corruption, path,
               "trailing bytes after 3 images of 28x28: the file holds more than the 2368 bytes its header declares");
}

TEST(IdxReader, ReportsTrailingBytesAfterTheDeclaredLabels) {
  TempDir dir;
  const auto path = dir.path() / "labels";
  Bytes file = idx1({1, 2, 3});
  file.push_back(0);
  write_raw(path, file);
  auto labels = read_idx_labels(path, 10);
  ASSERT_FALSE(labels.ok());
  expect_error(labels.status(), StatusCode::corruption, path,
               "trailing bytes after 3 labels: the file holds more than the 11 bytes its header declares");
}

// Before, the whole stream was inflated first: reading this 1 MB file raised
// the peak resident memory by 2.0 GiB before the 1 GiB limit refused it.
TEST(IdxReader, RefusesAGzipBombNamingTheFileWithoutInflatingMoreThanItsHeaderDeclares) {
  TempDir dir;
  const auto path = dir.path() / "bomb-images-idx3-ubyte.gz";
  // 60000 images of 28x28 (47 MB) declared, 1 GiB of zeros behind them.
  write_gz_with_zeros(path, idx3(60000, 28, 28, 0), kMaxIdxBytes);
  ASSERT_LT(fs::file_size(path), std::uintmax_t{8} << 20);

  const ChildRead got = read_in_child([&] { return read_idx_images(path).status(); });
  expect_error(got.code, got.message, StatusCode::corruption, path,
               "trailing bytes after 60000 images of 28x28: the file holds more than the 47040016 bytes");
  // The declared 47 MB and the compressed file, with room for the allocator.
  RecordProperty("peak_growth_kb", std::to_string(got.peak_growth_kb));
  if (kRssIsMeaningful) {
    EXPECT_LT(got.peak_growth_kb, kMaxPeakGrowthKb) << "peak resident memory grew by " << got.peak_growth_kb
                                                    << " kB";
  }
}

TEST(IdxReader, RefusesAHugeCountOverATinyFileAsTruncatedWithoutAllocatingTheDeclaredSize) {
  TempDir dir;
  // 1,000,000 images of 28x28 declared (784 MB), 1 kB of pixels given.
  const Bytes file = idx3(1000000, 28, 28, 1024);
  const auto gz_path = dir.path() / "images.gz";
  write_gz(gz_path, file);
  const auto plain_path = dir.path() / "images";
  write_raw(plain_path, file);

  for (const auto& path : {gz_path, plain_path}) {
    const ChildRead got = read_in_child([&] { return read_idx_images(path).status(); });
    expect_error(got.code, got.message, StatusCode::corruption, path,
                 "truncated: expected 784000016 bytes for 1000000 images of 28x28, got 1040");
    RecordProperty(path.filename().string() + "_peak_growth_kb", std::to_string(got.peak_growth_kb));
    if (kRssIsMeaningful) {
      EXPECT_LT(got.peak_growth_kb, kMaxPeakGrowthKb) << path << ": peak resident memory grew by "
                                                      << got.peak_growth_kb << " kB";
    }
  }
}

TEST(IdxReader, RejectsALabelCountBeyondTheSizeLimitBeforeAllocating) {
  TempDir dir;
  const auto path = dir.path() / "labels";
  Bytes file;
  put_be32(file, 0x00000801);
  put_be32(file, 0xffffffffu);
  write_raw(path, file);
  auto labels = read_idx_labels(path, 10);
  ASSERT_FALSE(labels.ok());
  expect_error(labels.status(), StatusCode::corruption, path, "4294967295 labels, more than the IDX size limit");
}

// The reader stops reading pixels at the declared size; the gzip trailer
// after them must still be checked.
TEST(IdxReader, ReportsACrcMismatchInAFileOfExactlyTheDeclaredSize) {
  TempDir dir;
  const auto path = dir.path() / "images.gz";
  write_gz(path, three_images());
  Bytes gz = read_raw(path);
  gz[gz.size() - 8] ^= 0x01;  // first byte of the CRC-32 in the trailer
  write_raw(path, gz);
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "incorrect data check");
}

// A damaged stream that inflates to more than its header declares (as a
// flipped byte inside the deflate data can) is reported as damaged, which
// its checksum at the end shows, not as a file too long.
TEST(IdxReader, ADamagedStreamThatInflatesPastItsDeclaredSizeIsReportedAsDamaged) {
  TempDir dir;
  const auto path = dir.path() / "images.gz";
  Bytes file = three_images();
  file.insert(file.end(), 5, 0);
  write_gz(path, file);
  Bytes gz = read_raw(path);
  gz[gz.size() - 8] ^= 0x01;  // the CRC-32 in the trailer
  write_raw(path, gz);
  auto images = read_idx_images(path);
  ASSERT_FALSE(images.ok());
  expect_error(images.status(), StatusCode::corruption, path, "incorrect data check");
}

TEST(IdxReader, ReadsAnImageFileWhoseHeaderAndPixelsSpanSeveralGzipMembers) {
  TempDir dir;
  const Bytes file = three_images();
  // The first member ends inside the header, the second inside the pixels.
  write_gz(dir.path() / "1.gz", Bytes(file.begin(), file.begin() + 10));
  write_gz(dir.path() / "2.gz", Bytes(file.begin() + 10, file.begin() + 1000));
  write_gz(dir.path() / "3.gz", Bytes(file.begin() + 1000, file.end()));
  Bytes all;
  for (const char* part : {"1.gz", "2.gz", "3.gz"}) {
    const Bytes member = read_raw(dir.path() / part);
    all.insert(all.end(), member.begin(), member.end());
  }
  const auto path = dir.path() / "images.gz";
  write_raw(path, all);
  auto images = read_idx_images(path);
  ASSERT_TRUE(images.ok()) << images.status().to_string();
  EXPECT_EQ(images->pixels, Bytes(file.begin() + 16, file.end()));
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
