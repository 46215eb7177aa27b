// extract_tar_gz on archives that tar(1) writes: the members asked for, under
// their base names; a member missing, a truncated archive.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "dataset/archive.hpp"
#include "temp_dir.hpp"

namespace asgd::data {
namespace {

namespace fs = std::filesystem;
using asgd_test::TempDir;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// tmp/archive.tar.gz holding folder/a.bin (100000 bytes), folder/b.bin and
// folder/notes.txt, as tar czf writes them.
fs::path make_archive(const TempDir& tmp) {
  fs::create_directories(tmp / "src" / "folder");
  std::string a(100000, '\0');
  std::uint32_t x = 1;  // incompressible: a.bin is most of the archive
  for (char& c : a) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  std::ofstream(tmp / "src" / "folder" / "a.bin", std::ios::binary) << a;
  std::ofstream(tmp / "src" / "folder" / "b.bin", std::ios::binary) << "bee";
  std::ofstream(tmp / "src" / "folder" / "notes.txt") << "not wanted";
  const std::string cmd = "tar czf " + (tmp / "archive.tar.gz").string() + " -C " + (tmp / "src").string() + " folder";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return tmp / "archive.tar.gz";
}

TEST(ExtractTarGz, WritesTheMembersAskedForUnderTheirBaseNames) {
  TempDir tmp;
  const fs::path archive = make_archive(tmp);
  fs::create_directories(tmp / "out");
  ASSERT_TRUE(extract_tar_gz(archive, tmp / "out", {"a.bin", "b.bin"}).ok());
  EXPECT_EQ(read(tmp / "out" / "a.bin"), read(tmp / "src" / "folder" / "a.bin"));
  EXPECT_EQ(read(tmp / "out" / "b.bin"), "bee");
  EXPECT_FALSE(fs::exists(tmp / "out" / "notes.txt"));
  EXPECT_FALSE(fs::exists(tmp / "out" / "a.bin.part"));
}

TEST(ExtractTarGz, AMissingMemberOrATruncatedArchiveIsNamed) {
  TempDir tmp;
  const fs::path archive = make_archive(tmp);
  fs::create_directories(tmp / "out");
  const Status missing = extract_tar_gz(archive, tmp / "out", {"a.bin", "c.bin"});
  EXPECT_EQ(missing.code(), StatusCode::not_found);
  EXPECT_NE(missing.message().find("has no member named c.bin"), std::string::npos) << missing.message();
  // Cut inside a.bin's data: the stream ends early.
  const std::string whole = read(archive);
  std::ofstream(tmp / "cut.tar.gz", std::ios::binary) << whole.substr(0, whole.size() / 2);
  fs::create_directories(tmp / "out2");
  const Status cut = extract_tar_gz(tmp / "cut.tar.gz", tmp / "out2", {"a.bin"});
  EXPECT_EQ(cut.code(), StatusCode::corruption) << cut.message();
  EXPECT_FALSE(fs::exists(tmp / "out2" / "a.bin"));
  EXPECT_FALSE(fs::exists(tmp / "out2" / "a.bin.part"));
  EXPECT_EQ(extract_tar_gz(tmp / "none.tar.gz", tmp / "out", {"a.bin"}).code(), StatusCode::not_found);
}

// A stream damaged inside a member whose tar header is intact inflated
// without an error until zlib's CRC at the end, which was never read once
// the last wanted member was out: the damaged member was kept under its
// final name, and a bad trailer passed. Nothing is kept now.
TEST(ExtractTarGz, AStreamWhoseCrcFailsKeepsNoMember) {
  TempDir tmp;
  make_archive(tmp);
  // The wanted members first, then 2 MB that is not wanted: they are out
  // long before the stream's end (zlib reads 256 KiB ahead).
  std::string tail(2 << 20, '\0');
  std::uint32_t x = 7;
  for (char& c : tail) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  std::ofstream(tmp / "src" / "folder" / "tail.bin", std::ios::binary) << tail;
  const fs::path archive = tmp / "ordered.tar.gz";
  const std::string cmd = "tar czf " + archive.string() + " -C " + (tmp / "src").string() +
                          " folder/a.bin folder/b.bin folder/tail.bin";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string bytes = read(archive);
  bytes[bytes.size() - 8] = static_cast<char>(bytes[bytes.size() - 8] ^ 0xff);  // the gzip trailer's CRC-32
  std::ofstream(tmp / "crc.tar.gz", std::ios::binary) << bytes;
  fs::create_directories(tmp / "out");
  const Status bad = extract_tar_gz(tmp / "crc.tar.gz", tmp / "out", {"a.bin", "b.bin"});
  EXPECT_EQ(bad.code(), StatusCode::corruption) << bad.message();
  EXPECT_NE(bad.message().find("is damaged ("), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("incorrect data check"), std::string::npos) << bad.message();
  for (const char* name : {"a.bin", "b.bin", "a.bin.part", "b.bin.part"})
    EXPECT_FALSE(fs::exists(tmp / "out" / name)) << name;
}

}  // namespace
}  // namespace asgd::data
