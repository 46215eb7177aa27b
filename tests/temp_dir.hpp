#pragma once
// A fresh scratch folder per test, named after it, removed afterwards.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace asgd_test {

class TempDir {
 public:
  /// `tag` tells apart several folders alive in one test.
  explicit TempDir(const std::string& tag = "") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // A parameterized test's names hold '/' ("Prefix/Suite", "Name/0"):
    // one folder all the same, or removing it would leave its parents.
    std::string name = "asgd_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
                       info->name() + tag;
    std::replace(name.begin(), name.end(), '/', '_');
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Appends a big-endian u32, as IDX headers store them.
inline void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

}  // namespace asgd_test
