#pragma once
// A cache of decompressed IDX image files. Inflating MNIST's 47 MB of
// training images takes about 0.15 s of a CPU, and every process that
// loads the dataset pays it (`asgd cluster`: the coordinator and each
// worker). The first process to inflate a gzip'd image file of 1 MiB or
// more writes the images as a plain IDX file into a cache folder, named
// after the source file and the images' CRC-32C; later processes read that
// copy and check it against the checksum in its name. A copy that fails
// the check is reported, removed and replaced: nothing trains on it.
//
// The folder is the caller's (the runtime's resolve_image_cache(): from
// the environment, at the edge of the program). A copy is
// named <file>-<where>-<version>-<crc>.idx: `where` hashes the source's
// canonical path, `version` its size, modification and change times,
// device and inode, so an edited or replaced source gets a copy of its own,
// and the older copies of the same source are removed when it is written;
// `crc` covers the images' dimensions and pixels. Beside each copy,
// <copy>.source names its source: writing a copy also removes the copies
// of sources that no longer exist, and what a write that died left (an
// hour on). A folder that cannot be written (or has too little space)
// leaves loading as it was.

#include <filesystem>

#include "asgd/status.hpp"
#include "dataset/idx.hpp"

namespace asgd::data {

/// How read_idx_images_cached found the images.
enum class CacheUse {
  none,     ///< not through the cache: no folder, not gzip, or under 1 MiB
  hit,      ///< read from the cache's copy
  written,  ///< inflated from the source, and the copy written
  unwritten ///< inflated from the source; the copy could not be written
};

/// read_idx_images(path), through the cache in folder `cache` (none when
/// empty) when `path` is a gzip file: the same images, bit for bit. A copy that is damaged (a bad
/// checksum, a truncated or malformed file) is logged as a warning,
/// removed and written again from the source. `use`, if given, says how.
Result<IdxImages> read_idx_images_cached(const std::filesystem::path& path, const std::filesystem::path& cache,
                                         CacheUse* use = nullptr);

}  // namespace asgd::data
