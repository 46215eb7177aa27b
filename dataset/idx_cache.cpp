#include "dataset/idx_cache.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
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

// The checksum in a copy's name: of its dimensions (count, rows, columns,
// big-endian, as in its header) and then its pixels, so that a damaged
// header is the copy's fault too, not blamed on the source.
std::array<unsigned char, 12> dimensions(const IdxImages& images) {
  const std::array<std::size_t, 3> fields = {images.count, images.rows, images.cols};
  std::array<unsigned char, 12> out{};
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<unsigned char>(fields[i] >> (24 - 8 * b));
  return out;
}

std::uint32_t crc_of(const IdxImages& images) {
  const auto head = dimensions(images);
  const std::uint32_t crc = crc32c(std::as_bytes(std::span(head)));
  return crc32c(std::as_bytes(std::span(images.pixels.data(), images.pixels.size())), crc);
}

// False for anything but a regular file (a named pipe would block here):
// read_idx_images says what it is.
bool gzip_magic(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
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
  // The change time too: `cp -p` or `tar x` keep a replaced file's size
  // and modification time, and its inode number may be the old one's;
  // nobody sets the change time.
  const std::string version = std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
                              std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
                              std::to_string(st.st_ctim.tv_nsec) + ":" + std::to_string(st.st_dev) + ":" +
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
  const std::string actual = hex(crc_of(*images));
  if (named != actual)
    return Status::Corruption(file.string() + ": CRC-32C of the images (and their header) is " + actual +
                              ", its name says " + named);
  return images;
}

// True for a file last written more than an hour ago (or that cannot be
// looked at: nothing is removed then).
bool hour_old(const fs::path& p) {
  std::error_code ec;
  const auto t = fs::last_write_time(p, ec);
  return !ec && fs::file_time_type::clock::now() - t > std::chrono::hours(1);
}

// The source a copy was made from, as its "<copy>.source" names it; empty
// where there is none (a copy from before they were written).
std::string source_of(const fs::path& copy) {
  std::ifstream in(copy.string() + ".source");
  std::string source;
  std::getline(in, source);
  return source;
}

// Removes what no load will read again: the copies of sources that are
// gone (a dataset folder deleted, a test's temporary folder), copies
// without a ".source" (from before they were written) and what a write
// that died left behind, these two once an hour old (a write under way
// is younger). Called when a copy is written, which is rare.
void prune(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path p = entry.path();
    const std::string name = p.filename().string();
    std::error_code ignored;
    if (name.starts_with(".tmp-")) {
      if (hour_old(p)) fs::remove(p, ignored);
    } else if (name.ends_with(".idx")) {
      const std::string source = source_of(p);
      std::error_code looked;
      const bool gone = !source.empty() && !fs::exists(source, looked) && !looked;
      if (gone || (source.empty() && hour_old(p))) {
        fs::remove(p, ignored);
        fs::remove(p.string() + ".source", ignored);
      }
    } else if (name.ends_with(".idx.source")) {
      if (!fs::exists(dir / name.substr(0, name.size() - 7), ignored) && hour_old(p)) fs::remove(p, ignored);
    }
  }
}

// Writes `text` to `file` whole, or says why not.
Status write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out.flush()) return Status::IOError("cannot write " + file.string() + ": " + std::generic_category().message(errno));
  return {};
}

// Writes `images`, the copy of `source`, as `file` (by way of a temporary
// file, renamed: nobody reads half of it) with "<file>.source" beside it,
// and removes the other copies of the same source (names starting with
// `where`) and whatever prune() finds. Why not, where it cannot.
Status write_copy(const fs::path& dir, const fs::path& file, const std::string& where, const fs::path& source,
                  const IdxImages& images) {
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
    const std::array<unsigned char, 4> magic = {0, 0, 8, 3};  // unsigned bytes, 3 dimensions
    const auto dims = dimensions(images);
    out.write(reinterpret_cast<const char*>(magic.data()), magic.size());
    out.write(reinterpret_cast<const char*>(dims.data()), dims.size());
    out.write(reinterpret_cast<const char*>(images.pixels.data()), static_cast<std::streamsize>(images.pixels.size()));
    if (!out.flush()) {
      const std::string why = std::generic_category().message(errno);
      out.close();
      fs::remove(tmp, ec);
      return Status::IOError("cannot write " + tmp.string() + ": " + why);
    }
  }
  const fs::path named = file.string() + ".source";
  if (Status s = write_text(named, fs::canonical(source, ec).string() + "\n"); !s.ok() || ec) {
    fs::remove(tmp, ec);
    return s.ok() ? Status::IOError("cannot name the source of " + file.string()) : s;
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    return Status::IOError("cannot rename " + tmp.string() + " to " + file.string() + ": " + why);
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(where, 0) == 0 && entry.path() != file && entry.path() != named)
      fs::remove(entry.path(), ec);  // an older version's
  }
  prune(dir);
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
  const fs::path file = cache / (version + hex(crc_of(*images)) + ".idx");
  if (Status written = write_copy(cache, file, where, path, *images); !written.ok()) {
    how = CacheUse::unwritten;
    static std::atomic<bool> said{false};  // once a process: the next file would fail alike
    if (!said.exchange(true))
      logger().info("dataset cache: {} not kept ({}); each load inflates it (ASGD_CACHE_DIR names another folder)",
                    path.string(), written.message());
  } else {
    how = CacheUse::written;
    logger().debug("dataset cache: {} kept as {}", path.string(), file.string());
  }
  return images;
}

}  // namespace asgd::data
