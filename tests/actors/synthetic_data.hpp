#pragma once
// Small in-memory datasets for actor tests that must not depend on files.

#include <memory>

#include "base/random.hpp"
#include "dataset/dataset.hpp"

namespace asgd_test {

inline asgd::data::LabeledImages random_images(std::size_t count, std::uint64_t seed) {
  asgd::data::LabeledImages out;
  out.count = count;
  out.rows = 28;
  out.cols = 28;
  asgd::Rng rng(seed);
  out.pixels.resize(count * out.sample_size());
  for (auto& p : out.pixels) p = rng.normal();
  out.labels.resize(count);
  for (auto& l : out.labels) l = static_cast<std::int32_t>(rng.below(10));
  return out;
}

inline std::shared_ptr<const asgd::data::DatasetSplits> synthetic_splits(std::size_t train, std::uint64_t seed = 7) {
  auto d = std::make_shared<asgd::data::DatasetSplits>();
  d->name = "synthetic";
  d->train = random_images(train, seed);
  d->validation = random_images(16, seed + 1);
  d->test = random_images(16, seed + 2);
  return d;
}

}  // namespace asgd_test
