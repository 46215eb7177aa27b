#pragma once
// In-memory labelled image datasets, their train/validation/test splits, and
// the seeded orderings and batches that workers train on.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "asgd/dataset.hpp"
#include "asgd/status.hpp"

namespace asgd::data {

/// Images and their integer labels. A dataset read from image files keeps
/// each pixel as the file's byte (a quarter of the memory of float32: every
/// process of a job holds the whole training split) with a table per channel
/// that gives the byte's normalised float; a user's dataset keeps its
/// floats. Either way copy_samples() gives the normalised floats, the same
/// bit for bit.
struct LabeledImages {
  std::size_t count = 0;
  std::size_t channels = 1;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<float> pixels;          // (count, channels, rows, cols), normalised; empty when `bytes` holds them
  std::vector<std::uint8_t> bytes;    // (count, channels, rows, cols), the files' bytes; or empty
  std::vector<std::array<float, 256>> decode;  // with `bytes`: channel c's byte v is decode[c][v]
  std::vector<std::int32_t> labels;   // (count,), each in [0, num_classes)

  std::size_t sample_size() const { return channels * rows * cols; }
  /// A CRC-32C of the shape, the samples (their bytes, else the normalised
  /// floats) and the labels: processes that loaded the same files agree on
  /// it, and a worker on another host whose files differ is found out.
  std::uint32_t fingerprint() const;
  /// Samples [first, first + n) as normalised floats, back to back, into
  /// `out` (room for n * sample_size()). first + n must not pass count.
  void copy_samples(std::size_t first, std::size_t n, float* out) const;
  /// The same, as a vector.
  std::vector<float> samples(std::size_t first, std::size_t n) const;
};

/// Per-channel normalisation x' = (x / 255 - mean[c]) / stddev[c], with mean
/// and stddev measured on the training split (never on validation or test):
/// one value per channel, or a single one for every channel.
struct Normalization {
  std::vector<float> mean = {0.0f};
  std::vector<float> stddev = {1.0f};
};

/// Channel c's value of a per-channel list (Normalization's mean or stddev,
/// a checkpoint's): its item c, or its only item for every channel.
inline float channel_value(const std::vector<float>& values, std::size_t c) {
  return values[values.size() == 1 ? 0 : c];
}

/// Values in one sample at most (2^31, 8 GiB of floats): a larger shape is
/// a mistake, not data (user data, a Predictor's shape).
inline constexpr std::size_t kMaxSampleValues = std::size_t{1} << 31;

/// The values in one sample of `shape` (its dimensions multiplied; 0 with
/// a zero dimension), or nullopt past kMaxSampleValues. Checked as it
/// multiplies, so a shape whose product wraps around ({2^61 + 1, 8, 1} to
/// 8) is caught.
inline std::optional<std::size_t> sample_values(std::span<const std::size_t> shape) {
  std::size_t values = 1;
  for (const std::size_t d : shape)
    if (__builtin_mul_overflow(values, d, &values) || values > kMaxSampleValues) return std::nullopt;
  return values;
}

/// The three splits of one dataset.
struct DatasetSplits {
  std::string name;            // "mnist", "fashion-mnist", "cifar10"
  std::size_t num_classes = 10;
  Normalization normalization;
  LabeledImages train;         // official training set minus the validation split
  LabeledImages validation;    // held out from the official training set
  LabeledImages test;          // the official test set, untouched
};

/// Names load_dataset understands.
const std::vector<std::string>& known_datasets();
bool is_known_dataset(const std::string& name);

/// Loads `name` from `dir`, which holds the four IDX files under their
/// official names (train-images-idx3-ubyte, train-labels-idx1-ubyte,
/// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), each with or without
/// ".gz"; or the folder above it, holding `name`/ with them (the datasets'
/// parent folder, as $ASGD_DATA_DIR). cifar10 instead reads CIFAR-10's binary
/// batches (dataset/cifar.hpp has where it looks). `validation_size` images
/// are held out of the training set, chosen by a permutation seeded with
/// `seed`, so the split is reproducible. Each channel is normalised by its
/// own mean and stddev, measured on the training split. `image_cache`, when
/// not empty, is the folder where decompressed copies of gzip'd image files
/// are kept and read (dataset/idx_cache.hpp).
/// Errors: invalid_argument (unknown name, validation_size >= train count),
/// not_found (missing directory or file, the message names it), corruption.
Result<DatasetSplits> load_dataset(const std::string& name, const std::filesystem::path& dir,
                                   std::size_t validation_size, std::uint64_t seed,
                                   const std::filesystem::path& image_cache = {});

/// `data` (checked by asgd::validate(const UserDataset&)) in the runtime's
/// layout: a copy of every split, images (C, H, W) as they are, vectors (N)
/// as (1, 1, N); no normalisation (mean 0, stddev 1: the user's values are
/// taken as normalised already).
DatasetSplits from_user_dataset(const UserDataset& data);

/// A random permutation of [0, n) that depends only on (seed, stream, epoch):
/// used for per-epoch shuffling, one stream per worker.
std::vector<std::size_t> shuffled_order(std::size_t n, std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t epoch);

/// The part of [0, n) that worker `index` of `count` trains on: contiguous,
/// sizes differ by at most one, together they cover [0, n) exactly once.
struct Partition {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};
Partition partition_for(std::size_t n, std::size_t index, std::size_t count);

/// One mini-batch, copied out of a LabeledImages.
struct Batch {
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;          // position of this batch within its epoch
  bool last_in_epoch = false;
  std::size_t size = 0;             // B
  std::vector<float> x;             // (B, channels, rows, cols)
  std::vector<std::int32_t> y;      // (B,)
};

/// Fills `batch` (x, y, size) with the samples of `images` at `indices`,
/// reusing its storage.
void gather_batch(const LabeledImages& images, std::span<const std::size_t> indices, Batch& batch);

/// The first `n` samples of `images` (all of them, when fewer) as one
/// batch: what a worker's speed is measured on (--worker-weights auto).
Batch leading_batch(const LabeledImages& images, std::size_t n);

}  // namespace asgd::data
