#include "actors/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/json_text.hpp"
#include "base/paths.hpp"
#include "compute/model.hpp"
#include "messaging/wire.hpp"

namespace asgd {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'A', 'S', 'G', 'D', 'C', 'K', 'P', 'T'};
// A header that claims more than this is corrupt, not a big model's.
constexpr std::uint32_t kMaxHeader = 16u << 20;

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::uint32_t crc_of(const std::string& bytes) {
  return messaging::crc32c(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

nlohmann::json tensor_list(const std::vector<CheckpointTensor>& tensors) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : tensors) list.push_back({{"name", t.name}, {"shape", t.shape}});
  return list;
}

}  // namespace

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Checkpoint Checkpoint::of(Model& model) {
  Checkpoint c;
  c.model = model.name();
  const auto params = std::as_const(model).params();
  for (const ParamEntry& e : model.layout())
    c.params.push_back({e.name, e.shape, {params.begin() + static_cast<std::ptrdiff_t>(e.offset),
                                          params.begin() + static_cast<std::ptrdiff_t>(e.offset + e.size)}});
  for (const LayerBuffer& b : model.buffers())
    c.buffers.push_back({b.name, {b.values.size()}, {b.values.begin(), b.values.end()}});
  return c;
}

std::string framed_bytes(const char (&magic)[8], std::uint32_t version, const nlohmann::json& header,
                         const std::vector<std::span<const float>>& blocks) {
  const std::string text = json_text(header);
  std::string bytes(magic, sizeof magic);
  put(bytes, version);
  put(bytes, static_cast<std::uint32_t>(text.size()));
  bytes += text;
  for (const auto& b : blocks) bytes.append(reinterpret_cast<const char*>(b.data()), b.size_bytes());
  put(bytes, crc_of(bytes));
  return bytes;
}

Status write_framed(const std::string& path, const char (&magic)[8], std::uint32_t version,
                    const nlohmann::json& header, const std::vector<std::span<const float>>& blocks) {
  return write_atomically(path, framed_bytes(magic, version, header, blocks));
}

Status write_synced(const std::string& file, const std::string& bytes) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError("cannot write " + file + ": " + std::strerror(errno));
  std::error_code ec;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      fs::remove(file, ec);
      return Status::IOError("cannot write " + file + ": " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  // The descriptor is closed whatever fsync says (a failed flush used to
  // leave it open, one more with every failed checkpoint).
  std::string why;
  if (::fsync(fd) != 0) why = std::strerror(errno);
  if (::close(fd) != 0 && why.empty()) why = std::strerror(errno);
  if (!why.empty()) {
    fs::remove(file, ec);
    return Status::IOError("cannot flush " + file + ": " + why);
  }
  return {};
}

Status rename_synced(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) {
    const std::string failed = ec.message();
    fs::remove(from, ec);  // nothing left behind
    return Status::IOError("cannot rename " + from + " to " + to + ": " + failed);
  }
  const fs::path path(to);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

Status create_parent(const std::string& file) {
  const fs::path path(file);
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec) return Status::IOError("cannot create " + path.parent_path().string() + ": " + ec.message());
  return {};
}

Status write_atomically(const std::string& file, const std::string& bytes) {
  if (Status s = create_parent(file); !s.ok()) return s;
  const std::string tmp = file + ".tmp";
  if (Status s = write_synced(tmp, bytes); !s.ok()) return s;
  return rename_synced(tmp, file);
}

Result<FramedFile> read_framed(const std::string& path, const char (&magic)[8], std::uint32_t version) {
  auto corrupt = [&](const std::string& why) { return Status::Corruption(path + ": " + why); };
  std::error_code ec;
  const auto type = fs::status(path, ec).type();
  if (type == fs::file_type::not_found) return Status::NotFound("no file at " + path);
  // A folder opens as a stream and then fails its first read (libstdc++
  // throws from inside the stream buffer): refuse it by name first.
  if (type == fs::file_type::directory) return corrupt("is a folder, not a checkpoint file");
  // A pipe or a device would be read until it ends: for ever, for some.
  if (type == fs::file_type::fifo || type == fs::file_type::socket || type == fs::file_type::block ||
      type == fs::file_type::character)
    return corrupt("is not a regular file (a pipe, socket or device)");
  std::string bytes;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::NotFound("no file at " + path);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) return Status::IOError(path + ": read failed");
  } catch (const std::ios_base::failure& e) {
    return Status::IOError(path + ": read failed: " + e.what());
  }
  constexpr std::size_t kFixed = sizeof kMagic + 8;
  if (bytes.size() >= kFixed + 4 && std::memcmp(bytes.data(), magic, 4) == 0 &&
      std::memcmp(bytes.data(), magic, sizeof kMagic) != 0)  // asgd's, of another kind: say which
    return corrupt("an asgd file of another kind (" + std::string(bytes.data(), sizeof kMagic) + ", expected " +
                   std::string(magic, sizeof kMagic) + (std::memcmp(bytes.data() + 4, "SHRD", 4) == 0
                                                            ? "): a shard checkpoint, not a trained model"
                                                            : ")"));
  if (bytes.size() < kFixed + 4 || std::memcmp(bytes.data(), magic, sizeof kMagic) != 0)
    return corrupt(std::string("not an asgd checkpoint (expected ") + std::string(magic, sizeof kMagic) + ")");
  std::uint32_t file_version = 0, header_len = 0, stored_crc = 0;
  std::memcpy(&file_version, bytes.data() + 8, 4);
  std::memcpy(&header_len, bytes.data() + 12, 4);
  if (file_version != version)
    return corrupt("version " + std::to_string(file_version) + ", this asgd reads " + std::to_string(version));
  if (header_len > kMaxHeader || kFixed + header_len + 4 > bytes.size()) return corrupt("truncated header");
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  if (messaging::crc32c(std::as_bytes(std::span(bytes.data(), bytes.size() - 4))) != stored_crc)
    return corrupt("checksum mismatch (the file is damaged)");
  const std::size_t value_bytes = bytes.size() - 4 - kFixed - header_len;
  if (value_bytes % sizeof(float) != 0) return corrupt("the values are not whole float32s");
  FramedFile f;
  try {
    f.header = nlohmann::json::parse(bytes.substr(kFixed, header_len));
  } catch (const nlohmann::json::exception& e) {
    return corrupt(std::string("bad header: ") + e.what());
  }
  f.values.resize(value_bytes / sizeof(float));
  std::memcpy(f.values.data(), bytes.data() + kFixed + header_len, value_bytes);
  return f;
}

namespace {

// A normalisation in a header: a number when one value serves every channel
// (what checkpoints before per-channel values hold), else a list.
nlohmann::json per_channel(const std::vector<float>& v) {
  return v.size() == 1 ? nlohmann::json(v.front()) : nlohmann::json(v);
}
std::vector<float> per_channel(const nlohmann::json& j) {
  return j.is_array() ? j.get<std::vector<float>>() : std::vector<float>{j.get<float>()};
}
// In safetensors metadata, whose values are strings: "0.1307" or
// "0.4914,0.4822,0.4465".
// Each value in as many digits as read back to the same float (%.9g):
// std::to_string's six decimals turned a stddev of 1.23e-5 into 0.000012.
std::string per_channel_text(const std::vector<float>& v) {
  std::string out;
  for (float x : v) {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%.9g", static_cast<double>(x));
    if (!out.empty()) out += ',';
    out += digits;
  }
  return out;
}

}  // namespace

Status write_checkpoint(const std::string& dir, const Checkpoint& ckpt) {
  nlohmann::json header = {
      {"model", ckpt.model},         {"sample_shape", ckpt.sample_shape}, {"classes", ckpt.classes},
      {"dataset", ckpt.dataset},     {"input_mean", per_channel(ckpt.input_mean)},
      {"input_stddev", per_channel(ckpt.input_stddev)},
      {"updates", ckpt.updates},     {"test_accuracy", ckpt.test_accuracy},
      {"params", tensor_list(ckpt.params)}, {"buffers", tensor_list(ckpt.buffers)}};
  if (!ckpt.model_spec.empty()) header["model_spec"] = nlohmann::json::parse(ckpt.model_spec);
  std::vector<std::span<const float>> blocks;
  for (const auto& t : ckpt.params) blocks.emplace_back(t.values);
  for (const auto& t : ckpt.buffers) blocks.emplace_back(t.values);
  return write_framed((fs::path(dir) / kCheckpointFile).string(), kMagic, kCheckpointVersion, header, blocks);
}

Result<Checkpoint> read_checkpoint(const std::string& dir) {
  const fs::path path = look_at(dir).kind == PathKind::folder ? fs::path(dir) / kCheckpointFile : fs::path(dir);
  auto file = read_framed(path.string(), kMagic, kCheckpointVersion);
  if (!file) {
    if (file.status().code() == StatusCode::not_found) return Status::NotFound("no checkpoint at " + path.string());
    return file.status();
  }
  auto corrupt = [&](const std::string& why) { return Status::Corruption(path.string() + ": " + why); };
  Checkpoint c;
  std::size_t at = 0;
  const std::vector<float>& values = file->values;
  try {
    const auto& h = file->header;
    c.model = h.at("model").get<std::string>();
    if (h.contains("model_spec")) c.model_spec = h.at("model_spec").dump();
    c.sample_shape = h.at("sample_shape").get<Shape>();
    c.classes = h.at("classes").get<std::size_t>();
    c.dataset = h.at("dataset").get<std::string>();
    c.input_mean = per_channel(h.at("input_mean"));
    c.input_stddev = per_channel(h.at("input_stddev"));
    c.updates = h.at("updates").get<std::uint64_t>();
    c.test_accuracy = h.at("test_accuracy").get<double>();
    for (const char* group : {"params", "buffers"}) {
      auto& out = std::string(group) == "params" ? c.params : c.buffers;
      for (const auto& t : h.at(group)) {
        CheckpointTensor tensor{t.at("name").get<std::string>(), t.at("shape").get<Shape>(), {}};
        // (A shape of 2^32 x 2^32 multiplied out to 0 and read nothing.)
        const std::optional<std::size_t> n = numel_within(tensor.shape, values.size() - at);
        if (!n) return corrupt("tensor " + tensor.name + " runs past the end");
        tensor.values.assign(values.begin() + static_cast<std::ptrdiff_t>(at),
                             values.begin() + static_cast<std::ptrdiff_t>(at + *n));
        at += *n;
        out.push_back(std::move(tensor));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(std::string("bad header: ") + e.what());
  }
  if (at != values.size()) return corrupt("the tensors do not fill the file");
  return c;
}

Result<SafetensorsFile> write_safetensors(const std::string& path, const Checkpoint& ckpt) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto add = [&](const std::string& name, const Shape& shape, const char* dtype, const void* values,
                 std::size_t bytes) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(values), bytes);
  };
  for (const auto& t : ckpt.params) add(t.name, t.shape, "F32", t.values.data(), t.values.size() * sizeof(float));
  for (const auto& t : ckpt.buffers) {
    add(t.name, t.shape, "F32", t.values.data(), t.values.size() * sizeof(float));
    const std::string suffix = ".running_var";
    if (t.name.ends_with(suffix)) {
      const std::int64_t tracked = 0;
      add(t.name.substr(0, t.name.size() - suffix.size()) + ".num_batches_tracked", {}, "I64", &tracked,
          sizeof tracked);
    }
  }
  header["__metadata__"] = {{"format", "pt"},
                            {"model", ckpt.model},
                            {"dataset", ckpt.dataset},
                            {"input_mean", per_channel_text(ckpt.input_mean)},
                            {"input_stddev", per_channel_text(ckpt.input_stddev)}};
  if (!ckpt.model_spec.empty()) header["__metadata__"]["model_spec"] = ckpt.model_spec;  // JSON text: values are strings
  std::string text = json_text(header);
  text.append((8 - text.size() % 8) % 8, ' ');  // tensors start 8-byte aligned
  std::string bytes;
  put(bytes, static_cast<std::uint64_t>(text.size()));
  bytes += text;
  bytes += data;
  if (Status s = write_atomically(path, bytes); !s.ok()) return s;
  return SafetensorsFile{header.size() - 1, bytes.size()};  // less __metadata__
}

}  // namespace asgd
