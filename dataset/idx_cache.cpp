#include "dataset/idx_cache.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>

#include "base/crc32c.hpp"
#include "base/log.hpp"

namespace asgd::data {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMinCachedBytes = std::size_t{1} << 20;  ///< smaller files inflate in no time
constexpr std::uintmax_t kSpareBytes = std::uintmax_t{64} << 20;  ///< left free on the cache's file system

std::string hex(std::uint32_t v) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", v);
  return s;
}

std::uint32_t crc_of(const std::string& text) { return crc32c(std::as_bytes(std::span(text.data(), text.size()))); }

std::uint32_t crc_of(const std::vector<std::uint8_t>& bytes) {
  return crc32c(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

bool gzip_magic(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<unsigned char, 2> m{};
  return in.read(reinterpret_cast<char*>(m.data()), 2) && m[0] == 0x1f && m[1] == 0x8b;
}

// How the names of `path`'s copies start: every copy's "<file>-<where>-",
// and a copy of its present version's "<file>-<where>-<version>-";
// nullopt where the file cannot be looked at.
std::optional<std::pair<std::string, std::string>> copy_prefixes(const fs::path& path) {
  std::error_code ec;
  const fs::path canonical = fs::canonical(path, ec);
  struct stat st {};
  if (ec || ::stat(canonical.c_str(), &st) != 0) return std::nullopt;
  const std::string where = canonical.filename().stem().string() + "-" + hex(crc_of(canonical.string())) + "-";
  const std::string version = std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
                              std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_dev) + ":" +
                              std::to_string(st.st_ino);
  return std::pair{where, where + hex(crc_of(version)) + "-"};
}

// The copy in `dir` whose name starts with `prefix`, if there is one.
std::optional<fs::path> find_copy(const fs::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == prefix.size() + 12 && name.rfind(prefix, 0) == 0 && name.ends_with(".idx")) return entry.path();
  }
  return std::nullopt;
}

// The images in the copy `file`, if its checksum is the one in its name;
// else why not.
Result<IdxImages> read_copy(const fs::path& file) {
  auto images = read_idx_images(file);
  if (!images.ok()) return images.status();
  const std::string name = file.filename().string();
  const std::string named = name.substr(name.size() - 12, 8);
  const std::string actual = hex(crc_of(images->pixels));
  if (named != actual)
    return Status::Corruption(file.string() + ": CRC-32C of the images is " + actual + ", its name says " + named);
  return images;
}

// Writes `images` as the copy `file` (by way of a temporary file, renamed:
// nobody reads half of it) and removes the other copies of the same source
// (names starting with `where`). Why not, where it cannot.
Status write_copy(const fs::path& dir, const fs::path& file, const std::string& where, const IdxImages& images) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create " + dir.string() + ": " + ec.message());
  const auto space = fs::space(dir, ec);
  if (ec) return Status::IOError("cannot read the free space of " + dir.string() + ": " + ec.message());
  if (space.available < images.pixels.size() + kSpareBytes)
    return Status::IOError(dir.string() + " has " + std::to_string(space.available >> 20) + " MiB free");
  static std::atomic<unsigned> serial{0};
  const fs::path tmp = dir / (".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(serial++) + "-" +
                              file.filename().string());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    std::array<unsigned char, 16> header{};
    const std::array<std::uint32_t, 4> fields = {0x00000803u, static_cast<std::uint32_t>(images.count),
                                                 static_cast<std::uint32_t>(images.rows),
                                                 static_cast<std::uint32_t>(images.cols)};
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t b = 0; b < 4; ++b) header[i * 4 + b] = static_cast<unsigned char>(fields[i] >> (24 - 8 * b));
    out.write(reinterpret_cast<const char*>(header.data()), header.size());
    out.write(reinterpret_cast<const char*>(images.pixels.data()), static_cast<std::streamsize>(images.pixels.size()));
    if (!out.flush()) {
      out.close();
      fs::remove(tmp, ec);
      return Status::IOError("cannot write " + tmp.string());
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::IOError("cannot rename " + tmp.string() + " to " + file.string());
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(where, 0) == 0 && entry.path() != file) fs::remove(entry.path(), ec);  // an older version's
  }
  return {};
}

}  // namespace

Result<IdxImages> read_idx_images_cached(const fs::path& path, const fs::path& cache, CacheUse* use) {
  CacheUse ignored;
  CacheUse& how = use != nullptr ? *use : ignored;
  how = CacheUse::none;
  if (cache.empty() || !gzip_magic(path)) return read_idx_images(path);
  const auto prefixes = copy_prefixes(path);
  if (!prefixes) return read_idx_images(path);
  const auto& [where, version] = *prefixes;
  if (auto copy = find_copy(cache, version)) {
    auto images = read_copy(*copy);
    if (images.ok()) {
      how = CacheUse::hit;
      logger().debug("dataset cache: {} read from {}", path.string(), copy->string());
      return images;
    }
    logger().warn("the dataset cache's copy of {} is damaged ({}): it is removed, and the images read from {}",
                  path.string(), images.status().message(), path.string());
    std::error_code ec;
    fs::remove(*copy, ec);
  }
  auto images = read_idx_images(path);
  if (!images.ok() || images->pixels.size() < kMinCachedBytes) return images;
  const fs::path file = cache / (version + hex(crc_of(images->pixels)) + ".idx");
  if (Status written = write_copy(cache, file, where, *images); !written.ok()) {
    how = CacheUse::unwritten;
    logger().info("dataset cache: {} not kept ({}); each load inflates it (ASGD_CACHE_DIR names another folder)",
                  path.string(), written.message());
  } else {
    how = CacheUse::written;
    logger().debug("dataset cache: {} kept as {}", path.string(), file.string());
  }
  return images;
}

}  // namespace asgd::data
