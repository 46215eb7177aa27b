#pragma once
// Where tests find the real datasets: $ASGD_DATA_DIR (CI sets it to
// ../shared/data). A test that needs data and cannot find it fails loudly
// instead of passing silently.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace asgd_test {

inline std::filesystem::path data_root() {
  const char* env = std::getenv("ASGD_DATA_DIR");
  return env ? std::filesystem::path(env) : std::filesystem::path();
}

/// The folder of one dataset ("mnist", "fashion-mnist"); empty and a test
/// failure when ASGD_DATA_DIR is unset or lacks it.
inline std::filesystem::path dataset_dir(const std::string& name) {
  const auto root = data_root();
  if (root.empty()) {
    ADD_FAILURE() << "ASGD_DATA_DIR is not set: point it at the datasets (../shared/data)";
    return {};
  }
  auto dir = root / name;
  if (!std::filesystem::is_directory(dir)) {
    ADD_FAILURE() << "dataset folder " << dir << " does not exist (ASGD_DATA_DIR=" << root << ")";
    return {};
  }
  return dir;
}

}  // namespace asgd_test

/// Skips the rest of a test body when the dataset is missing (after the
/// failure above has been recorded).
#define ASGD_REQUIRE_DATASET(var, name)          \
  const auto var = ::asgd_test::dataset_dir(name); \
  if (var.empty()) return
