#pragma once
// Reader for CIFAR-10's binary version (Krizhevsky 2009): files of records of
// 3073 bytes, a label byte (0..9) and then 1024 red, 1024 green and 1024 blue
// bytes, each plane 32x32 row-major. The training set is data_batch_1.bin to
// data_batch_5.bin (10000 records each), the test set test_batch.bin.
//
// Files are read as the IDX reader reads them (read_gz_file: plain or gzip,
// bounded). Validated like the IDX reader: a file that is not a whole number of
// records (truncated), an empty one, or a label outside 0..9 gives
// StatusCode::corruption with a message that starts with the file's path.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "asgd/status.hpp"
#include "dataset/idx.hpp"

namespace asgd::data {

inline constexpr std::size_t kCifarSide = 32;
inline constexpr std::size_t kCifarChannels = 3;
inline constexpr std::size_t kCifarRecordBytes = 1 + kCifarChannels * kCifarSide * kCifarSide;
/// The binary version's archive, as its authors publish it (asgd data fetch
/// downloads and unpacks it).
inline constexpr const char* kCifar10Archive = "cifar-10-binary.tar.gz";

/// The training files, in order, and the test file.
const std::vector<std::string>& cifar10_train_files();
const std::string& cifar10_test_file();

/// The folder holding the batches: `dir` itself, or under it
/// cifar-10-batches-bin/ (as the archive unpacks), cifar10/ or
/// cifar10/cifar-10-batches-bin/ (the datasets' parent folder). Errors:
/// not_found naming dir/data_batch_1.bin and how to get it.
Result<std::filesystem::path> find_cifar10_folder(const std::filesystem::path& dir);

/// The records of `files` (in `dir`), one after another: images with 3
/// channels of 32x32 and their labels. Errors: not_found, io_error,
/// corruption.
struct CifarImages {
  IdxImages images;
  std::vector<std::uint8_t> labels;
};
Result<CifarImages> read_cifar10_batches(const std::filesystem::path& dir, const std::vector<std::string>& files);

}  // namespace asgd::data
