#include "dataset/dataset.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <system_error>
#include <utility>

#include "compute/random.hpp"
#include "dataset/idx.hpp"

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
  std::error_code ec;
  auto gz = dir / (base + ".gz");
  if (std::filesystem::exists(gz, ec)) return gz;
  auto plain = dir / base;
  if (std::filesystem::exists(plain, ec)) return plain;
  return Status::NotFound(gz.string() + ": no such file (nor an uncompressed " + base + ")");
}

// The pixels of `images` at `indices` (ascending), through the byte -> float
// table `lut`.
LabeledImages select(const IdxImages& images, const std::vector<std::uint8_t>& labels,
                     const std::vector<std::size_t>& indices, const std::array<float, 256>& lut) {
  LabeledImages out;
  out.count = indices.size();
  out.channels = 1;
  out.rows = images.rows;
  out.cols = images.cols;
  const std::size_t ss = out.sample_size();
  out.pixels.resize(out.count * ss);
  out.labels.resize(out.count);
  float* dst = out.pixels.data();
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::uint8_t* src = images.pixels.data() + indices[k] * ss;
    for (std::size_t p = 0; p < ss; ++p) dst[p] = lut[src[p]];
    dst += ss;
    out.labels[k] = labels[indices[k]];
  }
  return out;
}

std::vector<std::size_t> iota(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> names = {"mnist", "fashion-mnist"};
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
  splits.normalization = {0.0f, 1.0f};
  splits.train = convert(data.train);
  splits.validation = convert(data.validation);
  splits.test = convert(data.test);
  return splits;
}

Result<DatasetSplits> load_dataset(const std::string& name, const std::filesystem::path& dir,
                                   std::size_t validation_size, std::uint64_t seed) {
  if (name == "cifar10" || name == "cifar-10") {
    return Status::InvalidArgument("dataset \"" + name + "\" is not supported yet (known: " + known_names() + ")");
  }
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

  auto train_images_path = find_idx_file(dir, "train-images-idx3-ubyte");
  if (!train_images_path.ok()) return train_images_path.status();
  auto train_labels_path = find_idx_file(dir, "train-labels-idx1-ubyte");
  if (!train_labels_path.ok()) return train_labels_path.status();
  auto test_images_path = find_idx_file(dir, "t10k-images-idx3-ubyte");
  if (!test_images_path.ok()) return test_images_path.status();
  auto test_labels_path = find_idx_file(dir, "t10k-labels-idx1-ubyte");
  if (!test_labels_path.ok()) return test_labels_path.status();

  auto train_images = read_idx_images(*train_images_path);
  if (!train_images.ok()) return train_images.status();
  auto train_labels = read_idx_labels(*train_labels_path, kNumClasses);
  if (!train_labels.ok()) return train_labels.status();
  auto test_images = read_idx_images(*test_images_path);
  if (!test_images.ok()) return test_images.status();
  auto test_labels = read_idx_labels(*test_labels_path, kNumClasses);
  if (!test_labels.ok()) return test_labels.status();

  auto check_counts = [](const std::filesystem::path& images_path, std::size_t images,
                         const std::filesystem::path& labels_path, std::size_t labels) -> Status {
    if (images == labels) return {};
    return Status::Corruption(images_path.string() + " has " + std::to_string(images) + " images but " +
                              labels_path.string() + " has " + std::to_string(labels) + " labels");
  };
  if (auto s = check_counts(*train_images_path, train_images->count, *train_labels_path, train_labels->size());
      !s.ok()) {
    return s;
  }
  if (auto s = check_counts(*test_images_path, test_images->count, *test_labels_path, test_labels->size());
      !s.ok()) {
    return s;
  }
  if (test_images->rows != train_images->rows || test_images->cols != train_images->cols) {
    return Status::Corruption(test_images_path->string() + ": images are " + std::to_string(test_images->rows) +
                              "x" + std::to_string(test_images->cols) + " but the training images in " +
                              train_images_path->string() + " are " + std::to_string(train_images->rows) + "x" +
                              std::to_string(train_images->cols));
  }
  if (test_images->count == 0) {
    return Status::Corruption(test_images_path->string() + ": the test set is empty");
  }
  const std::size_t n = train_images->count;
  if (validation_size >= n) {
    return Status::InvalidArgument("validation_size " + std::to_string(validation_size) +
                                   " must be smaller than the " + std::to_string(n) + " training images in " +
                                   train_images_path->string());
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

  // Pixels are bytes, so a histogram of the training split gives the exact
  // mean and variance in one cheap pass.
  const std::size_t ss = train_images->rows * train_images->cols;
  std::array<std::uint64_t, 256> hist{};
  for (std::size_t i : train_idx) {
    const std::uint8_t* src = train_images->pixels.data() + i * ss;
    for (std::size_t p = 0; p < ss; ++p) ++hist[src[p]];
  }
  const double total = static_cast<double>(train_idx.size() * ss);
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
  const double stddev = var > 0.0 ? std::sqrt(var) : 1.0;

  std::array<float, 256> lut{};
  for (std::size_t v = 0; v < 256; ++v) {
    lut[v] = static_cast<float>((static_cast<double>(v) / 255.0 - mean) / stddev);
  }

  DatasetSplits splits;
  splits.name = name;
  splits.num_classes = kNumClasses;
  splits.normalization.mean = static_cast<float>(mean);
  splits.normalization.stddev = static_cast<float>(stddev);
  splits.train = select(*train_images, *train_labels, train_idx, lut);
  splits.validation = select(*train_images, *train_labels, validation_idx, lut);
  splits.test = select(*test_images, *test_labels, iota(test_images->count), lut);
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

void gather_batch(const LabeledImages& images, std::span<const std::size_t> indices, Batch& batch) {
  const std::size_t ss = images.sample_size();
  batch.size = indices.size();
  batch.x.resize(indices.size() * ss);
  batch.y.resize(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::size_t i = indices[k];
    assert(i < images.count);
    std::copy_n(images.pixels.data() + i * ss, ss, batch.x.data() + k * ss);
    batch.y[k] = images.labels[i];
  }
}

}  // namespace asgd::data
