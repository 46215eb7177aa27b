#include "dataset/archive.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <system_error>

namespace asgd::data {
namespace {

constexpr std::size_t kBlock = 512;

// An octal field of a tar header (NUL- or space-terminated); nullopt when it
// holds anything else.
std::optional<std::uint64_t> octal(const char* field, std::size_t width) {
  std::uint64_t v = 0;
  std::size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  bool digits = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    v = v * 8 + static_cast<std::uint64_t>(field[i] - '0');
    digits = true;
  }
  for (; i < width; ++i)
    if (field[i] != ' ' && field[i] != '\0') return std::nullopt;
  if (!digits) return std::nullopt;
  return v;
}

std::string text(const char* field, std::size_t width) { return std::string(field, strnlen(field, width)); }

// The header's checksum: its bytes summed with the checksum field as spaces.
bool checksum_ok(const std::array<char, kBlock>& h) {
  const auto stored = octal(h.data() + 148, 8);
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  return stored && *stored == sum;
}

// The gzip stream of an archive, read in order.
class GzStream {
 public:
  explicit GzStream(const std::filesystem::path& archive)
      : where_(archive.string()), gz_(gzopen(archive.c_str(), "rb"), &gzclose) {
    if (gz_) gzbuffer(gz_.get(), 1 << 18);
  }
  bool open() const { return gz_ != nullptr; }

  bool read_exactly(char* to, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const int r = gzread(gz_.get(), to + got, static_cast<unsigned>(std::min<std::size_t>(n - got, 1 << 30)));
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }

  // Corruption naming the archive, with zlib's reason when it has one.
  Status error(const std::string& what) {
    int code = 0;
    const char* msg = gzerror(gz_.get(), &code);
    return Status::Corruption(where_ + ": " + what + (code != Z_OK && msg ? std::string(" (") + msg + ")" : ""));
  }

  // The rest of the stream, to its end and its CRC (which zlib checks there
  // alone).
  Status read_to_the_end(std::vector<char>& buffer) {
    for (int r; (r = gzread(gz_.get(), buffer.data(), static_cast<unsigned>(buffer.size()))) != 0;)
      if (r < 0) return error("is damaged");
    if (int code = 0; gzerror(gz_.get(), &code) && code != Z_OK) return error("is damaged");
    return {};
  }

 private:
  std::string where_;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> gz_;
};

// A member's `padded` bytes from the stream, its first `size` into `out`
// when there is one.
Status copy_member(GzStream& gz, std::uint64_t size, std::uint64_t padded, std::FILE* out,
                   const std::filesystem::path& part, const std::string& name, std::vector<char>& buffer) {
  for (std::uint64_t left = padded; left > 0;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, buffer.size()));
    if (!gz.read_exactly(buffer.data(), n)) return gz.error("member " + name + " is truncated");
    const std::uint64_t offset = padded - left;
    if (out && offset < size) {
      const std::size_t data = static_cast<std::size_t>(std::min<std::uint64_t>(n, size - offset));
      if (std::fwrite(buffer.data(), 1, data, out) != data) return Status::IOError("cannot write " + part.string());
    }
    left -= n;
  }
  if (out && std::fflush(out) != 0) return Status::IOError("cannot write " + part.string());
  return {};
}

// Each member taken is written to BASE.part, and renamed to BASE only once
// the whole gzip stream was read and its CRC matched: a member damaged
// inside (its tar header intact) was kept under its final name. The parts
// left when this goes (an error) are removed.
struct Parts {
  std::vector<std::filesystem::path> paths;
  ~Parts() {
    std::error_code ignored;
    for (const auto& p : paths) std::filesystem::remove(p, ignored);
  }
  Status rename_all() {
    std::error_code ec;
    for (const std::filesystem::path& part : paths) {
      std::filesystem::path target = part;
      target.replace_extension();  // BASE.part -> BASE
      std::filesystem::rename(part, target, ec);
      if (ec) return Status::IOError("cannot rename " + part.string() + " to " + target.string() + ": " + ec.message());
    }
    paths.clear();
    return {};
  }
};

}  // namespace

Status extract_tar_gz(const std::filesystem::path& archive, const std::filesystem::path& dir,
                      const std::vector<std::string>& wanted) {
  const std::string where = archive.string();
  std::error_code ec;
  if (!std::filesystem::exists(archive, ec)) return Status::NotFound(where + ": no such file");
  GzStream gz(archive);
  if (!gz.open()) return Status::IOError(where + ": cannot open it");
  std::set<std::string> missing(wanted.begin(), wanted.end());
  Parts parts;
  std::string long_name;  // a GNU 'L' entry's name for the entry after it
  std::array<char, kBlock> h{};
  std::vector<char> buffer(1 << 20);
  while (!missing.empty()) {
    if (!gz.read_exactly(h.data(), kBlock)) return gz.error("ends before its last member");
    if (std::all_of(h.begin(), h.end(), [](char c) { return c == 0; })) break;  // the end-of-archive blocks
    if (!checksum_ok(h)) return Status::Corruption(where + ": a member header fails its checksum");
    const auto size = octal(h.data() + 124, 12);
    if (!size) return Status::Corruption(where + ": a member header has a malformed size");
    const char type = h[156];
    std::string name = long_name.empty() ? text(h.data() + 345, 155) : std::string();
    if (!name.empty()) name += '/';
    name += long_name.empty() ? text(h.data(), 100) : long_name;
    long_name.clear();
    const std::uint64_t padded = (*size + kBlock - 1) / kBlock * kBlock;
    const std::string base = std::filesystem::path(name).filename().string();
    if (type == 'L') {  // GNU long name: the next header's name is this entry's data
      if (*size > 4096) return Status::Corruption(where + ": a long name of " + std::to_string(*size) + " bytes");
      std::vector<char> n(padded);
      if (!gz.read_exactly(n.data(), padded)) return gz.error("ends inside a long name");
      long_name = text(n.data(), *size);
      continue;
    }
    const bool take = (type == '0' || type == '\0') && missing.count(base) > 0;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(nullptr, &std::fclose);
    const std::filesystem::path part = dir / (base + ".part");
    if (take) {
      out.reset(std::fopen(part.c_str(), "wb"));
      if (!out) return Status::IOError("cannot write " + part.string());
      parts.paths.push_back(part);
    }
    if (Status s = copy_member(gz, *size, padded, out.get(), part, name, buffer); !s.ok()) return s;
    if (take) missing.erase(base);
  }
  if (!missing.empty())
    return Status::NotFound(where + ": has no member named " + *missing.begin() + " (is it the right archive?)");
  if (Status s = gz.read_to_the_end(buffer); !s.ok()) return s;
  return parts.rename_all();
}

}  // namespace asgd::data
