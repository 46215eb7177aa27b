#pragma once
// Unpacking the members of a gzip-compressed tar archive (the form CIFAR-10's
// binary version is published in), with zlib: ustar and GNU headers, regular
// files only. A member is written to a temporary file and renamed, so no file
// under a member's name is ever half-written.

#include <filesystem>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd::data {

/// Writes the members of `archive` whose base name is in `wanted` into `dir`
/// under their base names (the archive's folders dropped), all of them only
/// once the whole stream was read and its CRC matched (none on an error).
/// Errors: not_found (no archive, or a wanted member it lacks, named),
/// corruption (a bad gzip stream or CRC, a header that fails its checksum,
/// a truncated member), io_error.
Status extract_tar_gz(const std::filesystem::path& archive, const std::filesystem::path& dir,
                      const std::vector<std::string>& wanted);

}  // namespace asgd::data
