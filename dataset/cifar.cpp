#include "dataset/cifar.hpp"

#include <system_error>

namespace asgd::data {

const std::vector<std::string>& cifar10_train_files() {
  static const std::vector<std::string> files = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                                 "data_batch_4.bin", "data_batch_5.bin"};
  return files;
}

const std::string& cifar10_test_file() {
  static const std::string file = "test_batch.bin";
  return file;
}

Result<std::filesystem::path> find_cifar10_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const std::filesystem::path& candidate :
       {dir, dir / "cifar-10-batches-bin", dir / "cifar10", dir / "cifar10" / "cifar-10-batches-bin"})
    if (std::filesystem::exists(candidate / cifar10_train_files().front(), ec)) return candidate;
  // Only the archive here (a copy made by hand, or a fetch stopped before
  // it unpacked): the fetch checks and unpacks it, no download.
  for (const std::filesystem::path& folder : {dir, dir / "cifar10"})
    if (std::filesystem::exists(folder / kCifar10Archive, ec))
      return Status::NotFound((dir / cifar10_train_files().front()).string() + ": no such file, but " +
                              (folder / kCifar10Archive).string() + " is: asgd data fetch cifar10 --data-dir " +
                              folder.string() + " checks it and unpacks the batches without a download");
  return Status::NotFound((dir / cifar10_train_files().front()).string() +
                          ": no such file (CIFAR-10's binary batches; asgd data fetch cifar10 downloads them)");
}

Result<CifarImages> read_cifar10_batches(const std::filesystem::path& dir, const std::vector<std::string>& files) {
  CifarImages out;
  IdxImages& im = out.images;
  im.channels = kCifarChannels;
  im.rows = im.cols = kCifarSide;
  const std::size_t pixels = im.sample_size();
  for (const std::string& name : files) {
    const std::filesystem::path path = dir / name;
    const std::string where = path.string();
    auto read = read_gz_file(path);  // the IDX reader's: plain or gzip, bounded, errors named
    if (!read) {
      if (read.status().code() != StatusCode::not_found) return read.status();
      return Status::NotFound(read.status().message() + " (asgd data fetch cifar10 downloads it)");
    }
    const std::vector<std::uint8_t>& raw = *read;
    if (raw.empty()) return Status::Corruption(where + ": the file is empty");
    if (raw.size() % kCifarRecordBytes != 0)
      return Status::Corruption(where + ": " + std::to_string(raw.size()) + " bytes is not a whole number of " +
                                std::to_string(kCifarRecordBytes) + "-byte records (truncated?)");
    const std::size_t records = raw.size() / kCifarRecordBytes;
    const std::size_t first = im.count;
    im.count += records;
    im.pixels.resize(im.count * pixels);
    out.labels.resize(im.count);
    for (std::size_t r = 0; r < records; ++r) {
      const std::uint8_t* record = raw.data() + r * kCifarRecordBytes;
      if (record[0] >= 10)
        return Status::Corruption(where + ": record " + std::to_string(r) + " has label " + std::to_string(record[0]) +
                                  ", outside 0..9");
      out.labels[first + r] = record[0];
      std::copy(record + 1, record + kCifarRecordBytes, im.pixels.begin() + static_cast<std::ptrdiff_t>((first + r) * pixels));
    }
  }
  return out;
}

}  // namespace asgd::data
