#include "dataset/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
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
// The smallest output buffer: below this, growing costs more than it saves.
constexpr std::size_t kMinBuffer = std::size_t{1} << 16;

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
  // A named pipe or a device would block in fopen or never end (a link to
  // /dev/zero read 1 GiB before the limit below refused it).
  if (!std::filesystem::is_regular_file(st))
    return Status::IOError(name + ": not a regular file (a named pipe, a device or a socket)");

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
  // Read until EOF rather than trusting the size: the file may change
  // under us.
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
  void operator()(z_stream* s) const {
    inflateEnd(s);
    delete s;
  }
};

// The decompressed bytes of one file, handed out in order as they are asked
// for. An IDX reader inflates the header first, learns from it how many bytes
// to expect, and stops one byte past them, so a gzip bomb costs the size its
// header declares rather than whatever the stream would inflate to.
class DecompressingReader {
 public:
  // Reads `path` whole (compressed, it is small next to what it holds) and
  // makes ready to inflate it, or to pass it through when it is not gzip.
  static Result<DecompressingReader> open(const std::filesystem::path& path) {
    DecompressingReader r;
    r.name_ = path.string();
    auto raw = read_raw_file(path);
    if (!raw.ok()) return raw.status();
    r.in_ = std::move(*raw);
    if (!is_gzip(r.in_, 0)) {
      if (r.in_.size() > kMaxIdxBytes) {
        return Status::Corruption(r.name_ + ": file is " + std::to_string(r.in_.size()) +
                                  " bytes, more than the IDX size limit of " + std::to_string(kMaxIdxBytes));
      }
      r.hint_ = r.in_.size();
      return r;  // plain IDX, as gzip would pass it through
    }
    // The last member's trailer holds its size mod 2^32: exact for the usual
    // single-member file, so the output is allocated once. Only a hint.
    r.hint_ = kMinBuffer;
    if (r.in_.size() >= 18) {
      const std::uint8_t* t = r.in_.data() + r.in_.size() - 4;
      const std::size_t isize = std::uint32_t{t[0]} | (std::uint32_t{t[1]} << 8) |
                                (std::uint32_t{t[2]} << 16) | (std::uint32_t{t[3]} << 24);
      std::size_t bound = kMaxIdxBytes;
      std::size_t ratio_bound = 0;
      if (checked_mul(r.in_.size(), kMaxHintRatio, ratio_bound)) bound = std::min(bound, ratio_bound);
      r.hint_ = std::max(r.hint_, std::min(isize, bound));
    }
    // zlib keeps a pointer back to its z_stream: it lives on the heap so the
    // reader can move.
    auto zs = std::make_unique<z_stream>();
    // 15 + 32: the largest window, with automatic gzip/zlib header detection.
    if (inflateInit2(zs.get(), 15 + 32) != Z_OK) {
      return Status::IOError(r.name_ + ": cannot initialise zlib: " + (zs->msg ? zs->msg : "out of memory"));
    }
    r.zs_.reset(zs.release());
    return r;
  }

  // Copies the next decompressed bytes into dst[0, n). Returns n, or fewer
  // only at the end of the data, once the gzip trailer (CRC, length) and
  // whatever follows the stream have been checked.
  Result<std::size_t> read(std::uint8_t* dst, std::size_t n) {
    if (!zs_) {
      const std::size_t got = std::min(n, in_.size() - in_pos_);
      std::copy_n(in_.data() + in_pos_, got, dst);
      in_pos_ += got;
      return got;
    }
    z_stream& zs = *zs_;
    // zlib counts in uInt (32 bits); feed it at most this much per call.
    constexpr std::size_t kStep = std::numeric_limits<uInt>::max();
    std::size_t done = 0;
    while (done < n && !at_end_) {
      const std::size_t in_avail = std::min(in_.size() - in_pos_, kStep);
      const std::size_t out_avail = std::min(n - done, kStep);
      zs.next_in = in_.data() + in_pos_;
      zs.avail_in = static_cast<uInt>(in_avail);
      zs.next_out = dst + done;
      zs.avail_out = static_cast<uInt>(out_avail);
      const int rc = inflate(&zs, Z_NO_FLUSH);
      in_pos_ += in_avail - zs.avail_in;
      done += out_avail - zs.avail_out;

      if (rc == Z_STREAM_END) {
        if (in_pos_ == in_.size()) {
          at_end_ = true;
        } else if (is_gzip(in_, in_pos_)) {
          inflateReset(&zs);  // gzip allows several members, concatenated
        } else {
          return Status::Corruption(name_ + ": " + std::to_string(in_.size() - in_pos_) +
                                    " bytes of trailing garbage after the gzip stream");
        }
        continue;
      }
      if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
        return Status::Corruption(name_ + ": corrupt gzip stream (" +
                                  (zs.msg ? zs.msg : "invalid compressed data") + ")");
      }
      if (rc == Z_MEM_ERROR) return Status::IOError(name_ + ": out of memory while decompressing");
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return Status::Corruption(name_ + ": zlib error " + std::to_string(rc) + " while decompressing");
      }
      // Z_OK or Z_BUF_ERROR with room left in dst: zlib has used all the
      // input before the end of the stream, so the file was cut short.
      if (in_pos_ == in_.size() && done < n) {
        return Status::Corruption(name_ + ": truncated gzip stream (unexpected end of file)");
      }
    }
    return done;
  }

  // A guess at the whole decompressed size (exact for a plain file and a
  // well-formed single-member gzip), bounded by what the compressed size
  // could plausibly hold: enough to size a first buffer, never to judge data.
  std::size_t size_hint() const { return hint_; }

  const std::string& name() const { return name_; }

 private:
  DecompressingReader() = default;

  std::string name_;
  std::vector<std::uint8_t> in_;  // the file as stored
  std::size_t in_pos_ = 0;
  std::size_t hint_ = 0;
  std::unique_ptr<z_stream, InflateEnd> zs_;  // null for a plain file
  bool at_end_ = false;                       // the last gzip member has ended
};

// Makes `buf` hold `size` bytes, keeping its contents, with capacity exactly
// `size`: a plain resize may double the capacity past what the header allows.
void grow_to(std::vector<std::uint8_t>& buf, std::size_t size) {
  buf.reserve(size);
  buf.resize(size);
}

// The `body_bytes` that follow an IDX header of `header_bytes`, refusing a
// file that holds fewer or more. The buffer starts at the reader's size hint
// and grows as bytes arrive, so a header that declares a huge count over a
// tiny file allocates little; at most one byte past the declared size is ever
// inflated.
Result<std::vector<std::uint8_t>> read_declared(DecompressingReader& in, std::size_t header_bytes,
                                                std::size_t body_bytes, const std::string& dims) {
  const std::string& name = in.name();
  const std::size_t expected = header_bytes + body_bytes;
  std::vector<std::uint8_t> body(std::min(body_bytes, in.size_hint()));
  std::size_t filled = 0;
  while (filled < body_bytes) {
    if (filled == body.size()) grow_to(body, std::min(body_bytes, std::max(body.size() * 2, kMinBuffer)));
    const std::size_t want = body.size() - filled;
    auto got = in.read(body.data() + filled, want);
    if (!got.ok()) return got.status();
    filled += *got;
    if (*got < want) {
      return Status::Corruption(name + ": truncated: expected " + std::to_string(expected) + " bytes for " + dims +
                                ", got " + std::to_string(header_bytes + filled));
    }
  }
  std::uint8_t past_end = 0;
  auto more = in.read(&past_end, 1);
  if (!more.ok()) return more.status();
  if (*more != 0) {
    // A damaged deflate stream may inflate to more than its header says
    // before its checksum, at the end, gives it away: read on (64 MiB at
    // most) so that the damage is named rather than the length.
    std::vector<std::uint8_t> scratch(64 * 1024);
    for (std::size_t read = 0; read < (std::size_t{64} << 20);) {
      auto rest = in.read(scratch.data(), scratch.size());
      if (!rest.ok()) return rest.status();
      if (*rest == 0) break;
      read += *rest;
    }
    return Status::Corruption(name + ": trailing bytes after " + dims + ": the file holds more than the " +
                              std::to_string(expected) + " bytes its header declares");
  }
  return body;
}

}  // namespace

Result<std::vector<std::uint8_t>> read_gz_file(const std::filesystem::path& path) {
  auto in = DecompressingReader::open(path);
  if (!in.ok()) return in.status();
  std::vector<std::uint8_t> out(std::min(in->size_hint(), kMaxIdxBytes));
  std::size_t filled = 0;
  for (;;) {
    const std::size_t want = out.size() - filled;
    auto got = in->read(out.data() + filled, want);
    if (!got.ok()) return got.status();
    filled += *got;
    if (*got < want) break;
    // Full: look one byte ahead before growing, so an exact hint costs one
    // allocation.
    std::uint8_t next = 0;
    auto more = in->read(&next, 1);
    if (!more.ok()) return more.status();
    if (*more == 0) break;
    if (out.size() == kMaxIdxBytes) {
      return Status::Corruption(path.string() + ": decompresses to more than " + std::to_string(kMaxIdxBytes) +
                                " bytes, the IDX size limit");
    }
    grow_to(out, std::min(kMaxIdxBytes, std::max(out.size() * 2, kMinBuffer)));
    out[filled++] = next;
  }
  out.resize(filled);
  return out;
}

Result<IdxImages> read_idx_images(const std::filesystem::path& path) {
  auto in = DecompressingReader::open(path);
  if (!in.ok()) return in.status();
  const std::string name = path.string();

  std::array<std::uint8_t, kImagesHeaderBytes> header{};
  auto got = in->read(header.data(), header.size());
  if (!got.ok()) return got.status();
  if (*got < 4) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kImagesHeaderBytes) +
                              " bytes of idx3 header, got " + std::to_string(*got));
  }
  const std::uint32_t magic = read_be32(header.data());
  if (magic != kImagesMagic) {
    std::string msg = name + ": bad magic number " + hex32(magic) + ", expected " + hex32(kImagesMagic) +
                      " (idx3 unsigned-byte images)";
    if (magic == kLabelsMagic) msg += "; this looks like an idx1 label file";
    return Status::Corruption(std::move(msg));
  }
  if (*got < kImagesHeaderBytes) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kImagesHeaderBytes) +
                              " bytes of idx3 header, got " + std::to_string(*got));
  }
  IdxImages images;
  images.count = read_be32(header.data() + 4);
  images.rows = read_be32(header.data() + 8);
  images.cols = read_be32(header.data() + 12);
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
  auto pixels = read_declared(*in, kImagesHeaderBytes, pixel_bytes, dims);
  if (!pixels.ok()) return pixels.status();
  images.pixels = std::move(*pixels);
  return images;
}

Result<std::vector<std::uint8_t>> read_idx_labels(const std::filesystem::path& path, std::size_t num_classes) {
  const std::string name = path.string();
  if (num_classes == 0) return Status::InvalidArgument(name + ": num_classes must be at least 1");
  auto in = DecompressingReader::open(path);
  if (!in.ok()) return in.status();

  std::array<std::uint8_t, kLabelsHeaderBytes> header{};
  auto got = in->read(header.data(), header.size());
  if (!got.ok()) return got.status();
  if (*got < 4) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kLabelsHeaderBytes) +
                              " bytes of idx1 header, got " + std::to_string(*got));
  }
  const std::uint32_t magic = read_be32(header.data());
  if (magic != kLabelsMagic) {
    std::string msg = name + ": bad magic number " + hex32(magic) + ", expected " + hex32(kLabelsMagic) +
                      " (idx1 unsigned-byte labels)";
    if (magic == kImagesMagic) msg += "; this looks like an idx3 image file";
    return Status::Corruption(std::move(msg));
  }
  if (*got < kLabelsHeaderBytes) {
    return Status::Corruption(name + ": truncated: expected at least " + std::to_string(kLabelsHeaderBytes) +
                              " bytes of idx1 header, got " + std::to_string(*got));
  }
  const std::size_t count = read_be32(header.data() + 4);
  if (count > kMaxIdxBytes - kLabelsHeaderBytes) {
    return Status::Corruption(name + ": header declares " + std::to_string(count) +
                              " labels, more than the IDX size limit of " + std::to_string(kMaxIdxBytes) + " bytes");
  }
  auto labels = read_declared(*in, kLabelsHeaderBytes, count, std::to_string(count) + " labels");
  if (!labels.ok()) return labels.status();
  const std::vector<std::uint8_t>& data = *labels;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] >= num_classes) {
      return Status::Corruption(name + ": label " + std::to_string(data[i]) + " at index " + std::to_string(i) +
                                " is out of range (num_classes = " + std::to_string(num_classes) + ")");
    }
  }
  return labels;
}

}  // namespace asgd::data
