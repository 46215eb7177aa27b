#include "dataset/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

namespace asgd::data {
namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr std::size_t kImagesHeaderBytes = 16;
constexpr std::size_t kLabelsHeaderBytes = 8;
// No dataset this reader is meant for has an image side anywhere near this;
// a larger one means a damaged or foreign header.
constexpr std::size_t kMaxImageSide = 1 << 16;
// The gzip trailer's size field sizes the output up front, but a damaged or
// hostile file can put anything there, and the whole hint is zero-filled at
// once. Real image files compress 2-5x; beyond this ratio the output grows
// by doubling instead.
constexpr std::size_t kMaxHintRatio = 64;

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", static_cast<unsigned>(v));
  return buf;
}

std::string errno_message(int err) { return std::generic_category().message(err); }

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

// a * b, or false when it does not fit in size_t.
bool checked_mul(std::size_t a, std::size_t b, std::size_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// The raw bytes of `path`, refusing files that could not decompress to at
// most kMaxIdxBytes anyway.
Result<std::vector<std::uint8_t>> read_raw_file(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    return Status::NotFound(name + ": no such file");
  }
  if (ec) return Status::IOError(name + ": " + ec.message());
  if (std::filesystem::is_directory(st)) return Status::IOError(name + ": is a directory, not a file");

  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(name.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(name + ": no such file");
    return Status::IOError(name + ": cannot open: " + errno_message(err));
  }
  // Stored (uncompressed) deflate blocks add 5 bytes per 64 KiB, plus the
  // gzip header and trailer; anything bigger cannot be a valid input.
  const std::size_t max_file_bytes = kMaxIdxBytes + kMaxIdxBytes / 4096 + 4096;
  std::vector<std::uint8_t> bytes;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) {
    if (size > max_file_bytes) {
      return Status::Corruption(name + ": file is " + std::to_string(size) +
                                " bytes, more than an IDX file may be (limit " +
                                std::to_string(kMaxIdxBytes) + " bytes decompressed)");
    }
    bytes.reserve(static_cast<std::size_t>(size));
  }
  // Read until EOF rather than trusting the size: the file may be a pipe or
  // may change under us.
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  for (;;) {
    const std::size_t old = bytes.size();
    if (old > max_file_bytes) {
      return Status::Corruption(name + ": file is larger than an IDX file may be (limit " +
                                std::to_string(kMaxIdxBytes) + " bytes decompressed)");
    }
    bytes.resize(old + kChunk);
    const std::size_t got = std::fread(bytes.data() + old, 1, kChunk, file.get());
    bytes.resize(old + got);
    if (got < kChunk) break;
  }
  if (std::ferror(file.get())) {
    return Status::IOError(name + ": read failed: " + errno_message(errno));
  }
  return bytes;
}

bool is_gzip(const std::vector<std::uint8_t>& bytes, std::size_t at) {
  return bytes.size() >= at + 2 && bytes[at] == 0x1f && bytes[at + 1] == 0x8b;
}

struct InflateEnd {
  void operator()(z_stream* s) const { inflateEnd(s); }
};

// Inflates every gzip member in `in` (gzip allows several, concatenated).
Result<std::vector<std::uint8_t>> gunzip(const std::string& name, const std::vector<std::uint8_t>& in) {
  // The last member's trailer holds its size mod 2^32: exact for the usual
  // single-member file, so the output is allocated once. It is only a hint.
  std::size_t hint = std::size_t{1} << 16;
  if (in.size() >= 18) {
    const std::uint8_t* t = in.data() + in.size() - 4;
    const std::size_t isize = std::uint32_t{t[0]} | (std::uint32_t{t[1]} << 8) |
                              (std::uint32_t{t[2]} << 16) | (std::uint32_t{t[3]} << 24);
    std::size_t bound = kMaxIdxBytes;
    std::size_t ratio_bound = 0;
    if (checked_mul(in.size(), kMaxHintRatio, ratio_bound)) bound = std::min(bound, ratio_bound);
    hint = std::max(hint, std::min(isize, bound));
  }

  z_stream zs{};
  // 15 + 32: the largest window, with automatic gzip/zlib header detection.
  if (inflateInit2(&zs, 15 + 32) != Z_OK) {
    return Status::IOError(name + ": cannot initialise zlib: " + (zs.msg ? zs.msg : "out of memory"));
  }
  std::unique_ptr<z_stream, InflateEnd> guard(&zs);

  // One byte past the cap, so that "exactly the cap" and "more" differ.
  const std::size_t out_cap = kMaxIdxBytes + 1;
  std::vector<std::uint8_t> out(std::min(hint, out_cap));
  std::size_t in_pos = 0;
  std::size_t out_pos = 0;
  // zlib counts in uInt (32 bits); feed it at most this much per call.
  constexpr std::size_t kStep = std::numeric_limits<uInt>::max();

  for (;;) {
    if (out_pos == out.size()) {
      if (out.size() == out_cap) {
        return Status::Corruption(name + ": decompresses to more than " + std::to_string(kMaxIdxBytes) +
                                  " bytes, the IDX size limit");
      }
      out.resize(std::min(out_cap, out.size() * 2));
    }
    const std::size_t in_avail = std::min(in.size() - in_pos, kStep);
    const std::size_t out_avail = std::min(out.size() - out_pos, kStep);
    zs.next_in = const_cast<Bytef*>(in.data() + in_pos);  // zlib's API is not const-correct
    zs.avail_in = static_cast<uInt>(in_avail);
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(out_avail);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_avail - zs.avail_in;
    out_pos += out_avail - zs.avail_out;

    if (rc == Z_STREAM_END) {
      if (in_pos == in.size()) break;
      if (is_gzip(in, in_pos)) {
        inflateReset(&zs);
        continue;
      }
      return Status::Corruption(name + ": " + std::to_string(in.size() - in_pos) +
                                " bytes of trailing garbage after the gzip stream");
    }
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
      return Status::Corruption(name + ": corrupt gzip stream (" +
                                (zs.msg ? zs.msg : "invalid compressed data") + ")");
    }
    if (rc == Z_MEM_ERROR) return Status::IOError(name + ": out of memory while decompressing");
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return Status::Corruption(name + ": zlib error " + std::to_string(rc) + " while decompressing");
    }
    // Z_OK or Z_BUF_ERROR: zlib wants more input or more room. Running out
    // of input before the end of the stream means the file was cut short.
    if (in_pos == in.size() && out_pos < out.size()) {
      return Status::Corruption(name + ": truncated gzip stream (unexpected end of file)");
    }
  }
  out.resize(out_pos);
  return out;
}

}  // namespace

Result<std::vector<std::uint8_t>> read_gz_file(const std::filesystem::path& path) {
  auto raw = read_raw_file(path);
  if (!raw.ok()) return raw.status();
  if (!is_gzip(*raw, 0)) {
    if (raw->size() > kMaxIdxBytes) {
      return Status::Corruption(path.string() + ": file is " + std::to_string(raw->size()) +
                                " bytes, more than the IDX size limit of " + std::to_string(kMaxIdxBytes));
    }
    return raw;  // plain IDX, as gzip would pass it through
  }
  return gunzip(path.string(), *raw);
}

Result<IdxImages> read_idx_images(const std::filesystem::path& path) {
  auto bytes = read_gz_file(path);
  if (!bytes.ok()) return bytes.status();
  std::vector<std::uint8_t>& data = *bytes;
  const std::string name = path.string();

  if (data.size() < 4) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kImagesHeaderBytes) +
                              " bytes of idx3 header, got " + std::to_string(data.size()));
  }
  const std::uint32_t magic = read_be32(data.data());
  if (magic != kImagesMagic) {
    std::string msg = name + ": bad magic number " + hex32(magic) + ", expected " + hex32(kImagesMagic) +
                      " (idx3 unsigned-byte images)";
    if (magic == kLabelsMagic) msg += "; this looks like an idx1 label file";
    return Status::Corruption(std::move(msg));
  }
  if (data.size() < kImagesHeaderBytes) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kImagesHeaderBytes) +
                              " bytes of idx3 header, got " + std::to_string(data.size()));
  }
  IdxImages images;
  images.count = read_be32(data.data() + 4);
  images.rows = read_be32(data.data() + 8);
  images.cols = read_be32(data.data() + 12);
  const std::string dims = std::to_string(images.count) + " images of " + std::to_string(images.rows) + "x" +
                           std::to_string(images.cols);
  if (images.rows == 0 || images.cols == 0 || images.rows > kMaxImageSide || images.cols > kMaxImageSide) {
    return Status::Corruption(name + ": header declares " + dims + "; each side must be in [1, " +
                              std::to_string(kMaxImageSide) + "]");
  }
  // Sides are at most 2^16 each, so rows * cols cannot overflow; count * that can.
  std::size_t pixel_bytes = 0;
  if (!checked_mul(images.count, images.rows * images.cols, pixel_bytes) ||
      pixel_bytes > kMaxIdxBytes - kImagesHeaderBytes) {
    return Status::Corruption(name + ": header declares " + dims + ", more than the IDX size limit of " +
                              std::to_string(kMaxIdxBytes) + " bytes");
  }
  const std::size_t expected = kImagesHeaderBytes + pixel_bytes;
  if (data.size() < expected) {
    return Status::Corruption(name + ": truncated: expected " + std::to_string(expected) + " bytes for " + dims +
                              ", got " + std::to_string(data.size()));
  }
  if (data.size() > expected) {
    return Status::Corruption(name + ": " + std::to_string(data.size() - expected) + " trailing bytes after " +
                              dims + " (expected " + std::to_string(expected) + " bytes, got " +
                              std::to_string(data.size()) + ")");
  }
  // Drop the header in place: one memmove instead of a second buffer.
  data.erase(data.begin(), data.begin() + kImagesHeaderBytes);
  images.pixels = std::move(data);
  return images;
}

Result<std::vector<std::uint8_t>> read_idx_labels(const std::filesystem::path& path, std::size_t num_classes) {
  const std::string name = path.string();
  if (num_classes == 0) return Status::InvalidArgument(name + ": num_classes must be at least 1");
  auto bytes = read_gz_file(path);
  if (!bytes.ok()) return bytes.status();
  std::vector<std::uint8_t>& data = *bytes;

  if (data.size() < 4) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kLabelsHeaderBytes) +
                              " bytes of idx1 header, got " + std::to_string(data.size()));
  }
  const std::uint32_t magic = read_be32(data.data());
  if (magic != kLabelsMagic) {
    std::string msg = name + ": bad magic number " + hex32(magic) + ", expected " + hex32(kLabelsMagic) +
                      " (idx1 unsigned-byte labels)";
    if (magic == kImagesMagic) msg += "; this looks like an idx3 image file";
    return Status::Corruption(std::move(msg));
  }
  if (data.size() < kLabelsHeaderBytes) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kLabelsHeaderBytes) +
                              " bytes of idx1 header, got " + std::to_string(data.size()));
  }
  const std::size_t count = read_be32(data.data() + 4);
  const std::size_t expected = kLabelsHeaderBytes + count;  // count < 2^32: no overflow
  if (data.size() < expected) {
    return Status::Corruption(name + ": truncated: expected " + std::to_string(expected) + " bytes for " +
                              std::to_string(count) + " labels, got " + std::to_string(data.size()));
  }
  if (data.size() > expected) {
    return Status::Corruption(name + ": " + std::to_string(data.size() - expected) + " trailing bytes after " +
                              std::to_string(count) + " labels (expected " + std::to_string(expected) +
                              " bytes, got " + std::to_string(data.size()) + ")");
  }
  data.erase(data.begin(), data.begin() + kLabelsHeaderBytes);
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] >= num_classes) {
      return Status::Corruption(name + ": label " + std::to_string(data[i]) + " at index " + std::to_string(i) +
                                " is out of range (num_classes = " + std::to_string(num_classes) + ")");
    }
  }
  return std::move(data);
}

}  // namespace asgd::data
