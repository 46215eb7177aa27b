#pragma once
// Writing IDX test files: the bytes as they are, or gzip-compressed (as the
// official files come). The IDX bytes themselves come from each test
// (asgd_test::put_be32 in temp_dir.hpp for the headers).

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

namespace asgd_test {

inline void write_raw(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// `mode` "wb0" stores the bytes uncompressed: the file's size then
// depends on their number only.
inline void write_gz(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes,
                     const char* mode = "wb") {
  gzFile f = gzopen(path.c_str(), mode);
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

}  // namespace asgd_test
