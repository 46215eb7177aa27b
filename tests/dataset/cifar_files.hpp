#pragma once
// Small CIFAR-10-format files for tests: the five training batches and the
// test batch, with `per_batch` records each, images a model can learn (each
// class its own colour and the place of a bright square, plus noise).

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace asgd_test {

/// Record r of a generated batch: label, then 1024 red, green, blue bytes.
inline std::vector<std::uint8_t> cifar_record(std::uint8_t label, std::uint32_t& state) {
  std::vector<std::uint8_t> rec(3073);
  rec[0] = label;
  const std::size_t row0 = 4 + (label % 5) * 5, col0 = 4 + (label / 5) * 12;
  for (std::size_t c = 0; c < 3; ++c)
    for (std::size_t y = 0; y < 32; ++y)
      for (std::size_t x = 0; x < 32; ++x) {
        state = state * 1664525u + 1013904223u;
        const int noise = static_cast<int>(state >> 27);  // 0..31
        int v = (c == label % 3 ? 60 + 15 * label : 40) + noise;
        if (y >= row0 && y < row0 + 6 && x >= col0 && x < col0 + 6) v = 230 + noise / 4;
        rec[1 + c * 1024 + y * 32 + x] = static_cast<std::uint8_t>(v);
      }
  return rec;
}

/// Writes data_batch_1..5.bin and test_batch.bin into `dir`.
inline void write_cifar10(const std::filesystem::path& dir, std::size_t per_batch, std::uint32_t seed = 1) {
  std::filesystem::create_directories(dir);
  std::uint32_t state = seed;
  const std::vector<std::string> names = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                          "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
  for (const std::string& name : names) {
    std::ofstream out(dir / name, std::ios::binary);
    for (std::size_t r = 0; r < per_batch; ++r) {
      const auto rec = cifar_record(static_cast<std::uint8_t>(r % 10), state);
      out.write(reinterpret_cast<const char*>(rec.data()), static_cast<std::streamsize>(rec.size()));
    }
  }
}

}  // namespace asgd_test
