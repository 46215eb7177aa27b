#pragma once
// Reader for the IDX format of MNIST and Fashion-MNIST (big-endian u32
// header, then unsigned bytes), gzip-compressed or plain; zlib reads both.
//
// Every function validates before it trusts: magic number, dimension count,
// declared sizes against the decompressed length (exact), and label range.
// The IDX readers inflate the header first and then at most one byte past the
// size it declares, so a gzip bomb costs about its compressed size plus the
// declared size in memory, never what the stream would inflate to.
// A bad file gives StatusCode::corruption (or not_found / io_error) with a
// one-line message that starts with the file's path.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "asgd/status.hpp"

namespace asgd::data {

/// Pixels of an idx3 file: count images of rows x cols bytes, row-major.
/// (The CIFAR-10 reader, dataset/cifar.hpp, gives its colour images in
/// this form too, with 3 channels.)
struct IdxImages {
  std::size_t count = 0;
  std::size_t channels = 1;          // an IDX file's images have one
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> pixels;  // (count, channels, rows, cols)

  std::size_t sample_size() const { return channels * rows * cols; }
};

/// Largest decompressed file the reader accepts (guards against a hostile
/// header): 1 GiB.
inline constexpr std::size_t kMaxIdxBytes = std::size_t{1} << 30;

/// Decompresses `path` (gzip or plain) into memory, at most kMaxIdxBytes.
/// Knowing nothing of IDX headers, it inflates a gzip bomb until that limit
/// refuses it (over 1 GiB of memory); read_idx_images and read_idx_labels
/// stop at the size the header declares.
/// Errors: not_found, io_error, corruption (bad gzip stream, CRC, truncation).
Result<std::vector<std::uint8_t>> read_gz_file(const std::filesystem::path& path);

/// Reads an idx3 image file (magic 0x00000803).
Result<IdxImages> read_idx_images(const std::filesystem::path& path);

/// Reads an idx1 label file (magic 0x00000801); every label must be
/// < num_classes.
Result<std::vector<std::uint8_t>> read_idx_labels(const std::filesystem::path& path,
                                                  std::size_t num_classes);

}  // namespace asgd::data
