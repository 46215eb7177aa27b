#pragma once
// Keys are indices into a model's flat parameter vector. Each shard owns one
// contiguous key range; ranges are balanced by size (they differ by at most
// one key), disjoint, and together cover every key exactly once.

#include <cstddef>
#include <vector>

namespace asgd {

struct KeyRange {
  std::size_t begin = 0;
  std::size_t end = 0;  // exclusive
  std::size_t size() const { return end - begin; }
  bool contains(std::size_t key) const { return key >= begin && key < end; }
  friend bool operator==(const KeyRange&, const KeyRange&) = default;
};

/// Splits [0, num_keys) into `shards` ranges; shards must be in [1, num_keys].
std::vector<KeyRange> partition_keys(std::size_t num_keys, std::size_t shards);

/// The index of the range holding `key` (binary search); ranges must come
/// from partition_keys and key must be < num_keys.
std::size_t owner_of(const std::vector<KeyRange>& ranges, std::size_t key);

}  // namespace asgd
