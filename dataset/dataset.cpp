#include "dataset/dataset.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <span>
#include <system_error>
#include <utility>

#include "base/crc32c.hpp"
#include "base/random.hpp"
#include "dataset/cifar.hpp"
#include "dataset/idx.hpp"
#include "dataset/idx_cache.hpp"

namespace asgd::data {
namespace {

constexpr std::size_t kNumClasses = 10;
// Stream of the train/validation split permutation ("va"), kept apart from
// the per-worker shuffling streams.
constexpr std::uint64_t kValidationStream = 0x7661;

std::string known_names() {
  std::string names;
  for (const std::string& n : known_datasets()) {
    if (!names.empty()) names += ", ";
    names += n;
  }
  return names;
}

// "<dir>/<base>.gz" if it exists, else "<dir>/<base>".
Result<std::filesystem::path> find_idx_file(const std::filesystem::path& dir, const std::string& base) {
  // A folder that cannot be searched is not a missing file: say which.
  const auto there = [](const std::filesystem::path& p) -> Result<bool> {
    std::error_code ec;
    const bool found = std::filesystem::exists(p, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      return Status::IOError(p.string() + ": cannot look at it: " + ec.message());
    return found;
  };
  auto gz = dir / (base + ".gz");
  auto plain = dir / base;
  for (const auto& p : {gz, plain}) {
    auto found = there(p);
    if (!found.ok()) return found.status();
    if (*found) return p;
  }
  return Status::NotFound(gz.string() + ": no such file (nor an uncompressed " + base + ")");
}

// The images at `indices` (ascending), their bytes as they are, decoded
// through `decode` (a table per channel) when read.
LabeledImages select(const IdxImages& images, const std::vector<std::uint8_t>& labels,
                     const std::vector<std::size_t>& indices, const std::vector<std::array<float, 256>>& decode) {
  LabeledImages out;
  out.count = indices.size();
  out.channels = images.channels;
  out.rows = images.rows;
  out.cols = images.cols;
  out.decode = decode;
  const std::size_t ss = out.sample_size();
  out.bytes.resize(out.count * ss);
  out.labels.resize(out.count);
  for (std::size_t k = 0; k < indices.size(); ++k) {
    std::copy_n(images.pixels.data() + indices[k] * ss, ss, out.bytes.data() + k * ss);
    out.labels[k] = labels[indices[k]];
  }
  return out;
}

std::vector<std::size_t> iota(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// An IDX image file and its label file, read and checked against each
// other.
struct ImagesAndLabels {
  std::filesystem::path images_path;
  IdxImages images;
  std::vector<std::uint8_t> labels;
};

Result<ImagesAndLabels> read_images_and_labels(const std::filesystem::path& dir, const std::string& images_name,
                                               const std::string& labels_name, const std::filesystem::path& image_cache) {
  auto images_path = find_idx_file(dir, images_name);
  if (!images_path.ok()) return images_path.status();
  auto labels_path = find_idx_file(dir, labels_name);
  if (!labels_path.ok()) return labels_path.status();
  auto images = read_idx_images_cached(*images_path, image_cache);
  if (!images.ok()) return images.status();
  auto labels = read_idx_labels(*labels_path, kNumClasses);
  if (!labels.ok()) return labels.status();
  if (images->count != labels->size()) {
    return Status::Corruption(images_path->string() + " has " + std::to_string(images->count) + " images but " +
                              labels_path->string() + " has " + std::to_string(labels->size()) + " labels");
  }
  return ImagesAndLabels{*images_path, std::move(images).value(), std::move(labels).value()};
}

// CIFAR-10's batch `files` in `dir`, as an image file and its labels.
Result<ImagesAndLabels> read_cifar10(const std::filesystem::path& dir, const std::vector<std::string>& files) {
  auto read = read_cifar10_batches(dir, files);
  if (!read) return read.status();
  // (Named as the folder when the set is spread over several files: a
  // message about the training set named data_batch_1.bin alone.)
  return ImagesAndLabels{files.size() == 1 ? dir / files.front() : dir, std::move(read->images),
                         std::move(read->labels)};
}

// The official training and test sets of `name` in `dir` (or in the
// dataset's own folder under it), IDX images through `image_cache`.
Result<std::pair<ImagesAndLabels, ImagesAndLabels>> read_train_and_test(const std::string& name,
                                                                        const std::filesystem::path& dir,
                                                                        const std::filesystem::path& image_cache) {
  if (name == "cifar10") {
    auto from = find_cifar10_folder(dir);
    if (!from) return from.status();
    auto train = read_cifar10(*from, cifar10_train_files());
    if (!train) return train.status();
    auto test = read_cifar10(*from, {cifar10_test_file()});
    if (!test) return test.status();
    return std::pair{std::move(train).value(), std::move(test).value()};
  }
  // The datasets' parent folder (../shared/data) is taken when it holds
  // the dataset's own folder and no IDX files of its own.
  std::filesystem::path from = dir;
  if (!find_idx_file(dir, "train-images-idx3-ubyte").ok() && find_idx_file(dir / name, "train-images-idx3-ubyte").ok())
    from = dir / name;
  auto train = read_images_and_labels(from, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", image_cache);
  if (!train) return train.status();
  auto test = read_images_and_labels(from, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", image_cache);
  if (!test) return test.status();
  return std::pair{std::move(train).value(), std::move(test).value()};
}

// The mean and standard deviation of the pixels (scaled to [0, 1]) of
// channel `channel` of the images `idx`. Pixels are bytes, so a histogram
// gives them exactly in one cheap pass.
struct PixelStatistics {
  double mean = 0.0;
  double stddev = 1.0;
};
PixelStatistics pixel_statistics(const IdxImages& images, const std::vector<std::size_t>& idx, std::size_t channel) {
  const std::size_t plane = images.rows * images.cols;
  // Four histograms, summed at the end: neighbouring pixels are often the
  // same byte, and one histogram would make each increment wait for the
  // last (about twice the time over MNIST's 43 million bytes).
  std::array<std::array<std::uint64_t, 256>, 4> partial{};
  for (std::size_t i : idx) {
    const std::uint8_t* src = images.pixels.data() + i * images.sample_size() + channel * plane;
    std::size_t p = 0;
    for (; p + 4 <= plane; p += 4) {
      ++partial[0][src[p]];
      ++partial[1][src[p + 1]];
      ++partial[2][src[p + 2]];
      ++partial[3][src[p + 3]];
    }
    for (; p < plane; ++p) ++partial[0][src[p]];
  }
  std::array<std::uint64_t, 256> hist{};
  for (const auto& h : partial)
    for (std::size_t v = 0; v < 256; ++v) hist[v] += h[v];
  const double total = static_cast<double>(idx.size() * plane);
  double mean = 0.0;
  for (std::size_t v = 0; v < 256; ++v) mean += static_cast<double>(hist[v]) * (static_cast<double>(v) / 255.0);
  mean /= total;
  double var = 0.0;
  for (std::size_t v = 0; v < 256; ++v) {
    const double d = static_cast<double>(v) / 255.0 - mean;
    var += static_cast<double>(hist[v]) * d * d;
  }
  var /= total;
  // A constant image set has no spread to divide by; centring alone is all
  // that can be done.
  return {mean, var > 0.0 ? std::sqrt(var) : 1.0};
}

}  // namespace

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> names = {"mnist", "fashion-mnist", "cifar10"};
  return names;
}

bool is_known_dataset(const std::string& name) {
  const auto& names = known_datasets();
  return std::find(names.begin(), names.end(), name) != names.end();
}

DatasetSplits from_user_dataset(const UserDataset& data) {
  const auto& shape = data.sample_shape;
  const bool image = shape.size() == 3;
  auto convert = [&](const LabeledSamples& in) {
    LabeledImages out;
    out.count = in.labels.size();
    out.channels = image ? shape[0] : 1;
    out.rows = image ? shape[1] : 1;
    out.cols = image ? shape[2] : shape.at(0);
    out.pixels = in.values;
    out.labels = in.labels;
    return out;
  };
  DatasetSplits splits;
  splits.name = data.name;
  splits.num_classes = data.classes;
  splits.normalization = {};
  splits.train = convert(data.train);
  splits.validation = convert(data.validation);
  splits.test = convert(data.test);
  return splits;
}

Result<DatasetSplits> load_dataset(const std::string& name, const std::filesystem::path& dir,
                                   std::size_t validation_size, std::uint64_t seed,
                                   const std::filesystem::path& image_cache) {
  if (!is_known_dataset(name)) {
    return Status::InvalidArgument("unknown dataset \"" + name + "\" (known: " + known_names() + ")");
  }
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    return Status::NotFound("data directory " + dir.string() + " does not exist");
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::NotFound("data directory " + dir.string() + " is not a directory");
  }

  auto read = read_train_and_test(name, dir, image_cache);
  if (!read) return read.status();
  const ImagesAndLabels* train = &read->first;
  const ImagesAndLabels* test = &read->second;
  const IdxImages& train_images = train->images;
  const IdxImages& test_images = test->images;
  if (test_images.rows != train_images.rows || test_images.cols != train_images.cols) {
    return Status::Corruption(test->images_path.string() + ": images are " + std::to_string(test_images.rows) +
                              "x" + std::to_string(test_images.cols) + " but the training images in " +
                              train->images_path.string() + " are " + std::to_string(train_images.rows) + "x" +
                              std::to_string(train_images.cols));
  }
  if (test_images.count == 0) {
    return Status::Corruption(test->images_path.string() + ": the test set is empty");
  }
  if (train_images.count == 0)  // a damaged file, not a --validation-size to change
    return Status::Corruption(train->images_path.string() + ": the training set is empty");
  const std::size_t n = train_images.count;
  if (validation_size >= n) {
    return Status::InvalidArgument("--validation-size " + std::to_string(validation_size) +
                                   ": must be smaller than the " + std::to_string(n) + " training images in " +
                                   train->images_path.string());
  }

  // The first validation_size entries of a seeded permutation are held out;
  // both parts are then walked in ascending original order.
  const auto perm = shuffled_order(n, seed, kValidationStream, 0);
  std::vector<bool> held_out(n, false);
  for (std::size_t k = 0; k < validation_size; ++k) held_out[perm[k]] = true;
  std::vector<std::size_t> train_idx;
  std::vector<std::size_t> validation_idx;
  train_idx.reserve(n - validation_size);
  validation_idx.reserve(validation_size);
  for (std::size_t i = 0; i < n; ++i) (held_out[i] ? validation_idx : train_idx).push_back(i);

  DatasetSplits splits;
  splits.name = name;
  splits.num_classes = kNumClasses;
  splits.normalization.mean.clear();
  splits.normalization.stddev.clear();
  std::vector<std::array<float, 256>> decode(train_images.channels);
  for (std::size_t c = 0; c < train_images.channels; ++c) {
    const PixelStatistics norm = pixel_statistics(train_images, train_idx, c);
    for (std::size_t v = 0; v < 256; ++v)
      decode[c][v] = static_cast<float>((static_cast<double>(v) / 255.0 - norm.mean) / norm.stddev);
    splits.normalization.mean.push_back(static_cast<float>(norm.mean));
    splits.normalization.stddev.push_back(static_cast<float>(norm.stddev));
  }
  splits.train = select(train_images, train->labels, train_idx, decode);
  splits.validation = select(train_images, train->labels, validation_idx, decode);
  splits.test = select(test_images, test->labels, iota(test_images.count), decode);
  return splits;
}

std::vector<std::size_t> shuffled_order(std::size_t n, std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t epoch) {
  std::vector<std::size_t> order = iota(n);
  Rng rng(mix_seed(seed, stream, epoch));
  // Fisher-Yates, written out so the result is the same on every platform.
  for (std::size_t i = n; i > 1; --i) {
    const std::size_t j = rng.below(i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

Partition partition_for(std::size_t n, std::size_t index, std::size_t count) {
  assert(count > 0 && index < count);
  const std::size_t base = n / count;
  const std::size_t extra = n % count;  // the first `extra` workers take one more
  Partition p;
  p.begin = index * base + std::min(index, extra);
  p.end = p.begin + base + (index < extra ? 1 : 0);
  return p;
}

Batch leading_batch(const LabeledImages& images, std::size_t n) {
  Batch batch;
  gather_batch(images, iota(std::min(n, images.count)), batch);
  return batch;
}

void gather_batch(const LabeledImages& images, std::span<const std::size_t> indices, Batch& batch) {
  const std::size_t ss = images.sample_size();
  batch.size = indices.size();
  batch.x.resize(indices.size() * ss);
  batch.y.resize(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::size_t i = indices[k];
    assert(i < images.count);
    // The next sample's bytes are on their way while this one is decoded:
    // a byte at a time, the decoding would otherwise wait for each line of
    // a sample from memory in turn (twice the time of copying floats, on a
    // core shared with a worker's compute; half of it with the prefetch).
    if (k + 1 < indices.size() && !images.bytes.empty()) {
      const std::uint8_t* next = images.bytes.data() + indices[k + 1] * ss;
      for (std::size_t line = 0; line < ss; line += 64) __builtin_prefetch(next + line);
    }
    images.copy_samples(i, 1, batch.x.data() + k * ss);
    batch.y[k] = images.labels[i];
  }
}

void LabeledImages::copy_samples(std::size_t first, std::size_t n, float* out) const {
  assert(first + n <= count);
  const std::size_t ss = sample_size();
  if (bytes.empty()) {
    std::copy_n(pixels.data() + first * ss, n * ss, out);
    return;
  }
  assert(decode.size() == channels);
  const std::size_t plane = rows * cols;
  const std::uint8_t* src = bytes.data() + first * ss;
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t c = 0; c < channels; ++c) {
      const std::array<float, 256>& table = decode[c];
      for (std::size_t p = 0; p < plane; ++p) out[p] = table[src[p]];
      src += plane;
      out += plane;
    }
  }
}

std::uint32_t LabeledImages::fingerprint() const {
  const std::array<std::uint64_t, 4> shape = {count, channels, rows, cols};
  std::uint32_t crc = crc32c(std::as_bytes(std::span(shape)));
  crc = bytes.empty() ? crc32c(std::as_bytes(std::span(pixels)), crc) : crc32c(std::as_bytes(std::span(bytes)), crc);
  return crc32c(std::as_bytes(std::span(labels)), crc);
}

std::vector<float> LabeledImages::samples(std::size_t first, std::size_t n) const {
  std::vector<float> out(n * sample_size());
  copy_samples(first, n, out.data());
  return out;
}

}  // namespace asgd::data
