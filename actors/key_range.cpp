#include "actors/key_range.hpp"

#include <algorithm>
#include <cassert>

namespace asgd {

std::vector<KeyRange> partition_keys(std::size_t num_keys, std::size_t shards) {
  assert(shards >= 1 && shards <= num_keys);
  std::vector<KeyRange> ranges(shards);
  const std::size_t base = num_keys / shards;
  const std::size_t extra = num_keys % shards;
  std::size_t begin = 0;
  for (std::size_t i = 0; i < shards; ++i) {
    const std::size_t size = base + (i < extra ? 1 : 0);
    ranges[i] = {begin, begin + size};
    begin += size;
  }
  return ranges;
}

std::size_t owner_of(const std::vector<KeyRange>& ranges, std::size_t key) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), key,
                             [](std::size_t k, const KeyRange& r) { return k < r.end; });
  assert(it != ranges.end() && it->contains(key));
  return static_cast<std::size_t>(it - ranges.begin());
}

}  // namespace asgd
