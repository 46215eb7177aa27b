#include "tools/asgd/fetch.hpp"

#include <algorithm>
#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>

#include "base/folder_lock.hpp"
#include "dataset/archive.hpp"
#include "dataset/cifar.hpp"

namespace asgd::cli {

const std::vector<RemoteDataset>& remote_datasets() {
  // The MNIST and Fashion-MNIST digests were measured on the authors' files
  // (their MD5s are the published ones: ../shared/data/README.md). The
  // CIFAR-10 authors publish only an MD5 for the archive.
  static const std::vector<RemoteDataset> datasets = {
      {"mnist",
       {"https://yann.lecun.com/exdb/mnist/", "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/"},
       {{"train-images-idx3-ubyte.gz", 9912422, "sha256",
         "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"},
        {"train-labels-idx1-ubyte.gz", 28881, "sha256",
         "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"},
        {"t10k-images-idx3-ubyte.gz", 1648877, "sha256",
         "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"},
        {"t10k-labels-idx1-ubyte.gz", 4542, "sha256",
         "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"}},
       "",
       {}},
      {"fashion-mnist",
       {"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/"},
       {{"train-images-idx3-ubyte.gz", 26421880, "sha256",
         "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
        {"train-labels-idx1-ubyte.gz", 29515, "sha256",
         "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
        {"t10k-images-idx3-ubyte.gz", 4422102, "sha256",
         "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
        {"t10k-labels-idx1-ubyte.gz", 5148, "sha256",
         "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"}},
       "",
       {}},
      {"cifar10",
       {"https://www.cs.toronto.edu/~kriz/"},
       {{data::kCifar10Archive, 170052171, "md5", "c32a1d4ab5d03f1284b67883e8d87530"}},
       data::kCifar10Archive,
       {{"data_batch_1.bin", 30730000, "", ""},
        {"data_batch_2.bin", 30730000, "", ""},
        {"data_batch_3.bin", 30730000, "", ""},
        {"data_batch_4.bin", 30730000, "", ""},
        {"data_batch_5.bin", 30730000, "", ""},
        {"test_batch.bin", 30730000, "", ""}}},
  };
  return datasets;
}

const RemoteDataset* find_remote_dataset(const std::string& name) {
  for (const RemoteDataset& d : remote_datasets())
    if (d.name == name) return &d;
  return nullptr;
}

Result<std::string> file_digest(const std::filesystem::path& path, const std::string& algorithm) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::NotFound(path.string() + ": cannot open it to check its checksum");
  const EVP_MD* md = EVP_get_digestbyname(algorithm.c_str());
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!md || !ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1)
    return Status::Internal("OpenSSL has no digest " + algorithm);
  std::vector<unsigned char> block(1 << 20);
  std::size_t n = 0;
  while ((n = std::fread(block.data(), 1, block.size(), f.get())) > 0) EVP_DigestUpdate(ctx.get(), block.data(), n);
  if (std::ferror(f.get())) return Status::IOError(path.string() + ": read error while checking its checksum");
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), out, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", out[i]);
  return hex;
}

namespace {

std::string megabytes(double bytes) {
  return bytes < 1e6 ? fmt::format("{:.0f} kB", bytes / 1e3) : fmt::format("{:.1f} MB", bytes / 1e6);
}

// Size and checksum of `path` against `file`: empty when they match, else
// what differs.
std::string mismatch(const std::filesystem::path& path, const RemoteFile& file) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return "a size that cannot be read (" + ec.message() + ")";
  if (size != file.bytes) return fmt::format("{} bytes where {} were expected", size, file.bytes);
  if (file.digest.empty()) return {};
  auto digest = file_digest(path, file.algorithm);
  if (!digest) return digest.status().message();
  if (*digest != file.digest) return fmt::format("{} {} where {} was expected", file.algorithm, *digest, file.digest);
  return {};
}

// Writes what has arrived and rename()s are durable: the data, then the
// folder's entry.
Status sync_path(const std::filesystem::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return Status::IOError(path.string() + ": cannot open it to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IOError(path.string() + ": fsync failed");
  return {};
}

void global_curl_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One transfer of `url` appended to the open file `out` (already holding
// `offset` bytes): its progress bar, its Ctrl-C.
struct Transfer {
  std::FILE* out = nullptr;
  const FetchOptions* options = nullptr;
  std::string label;
  std::uint64_t offset = 0;
  std::uint64_t total = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point drawn{};
  std::uint64_t received = 0;  // this transfer's bytes
  bool write_failed = false;
  bool too_long = false;  // the server sent more than the file has: nothing past `total` is written

  static std::size_t write(char* data, std::size_t size, std::size_t count, void* self) {
    auto* t = static_cast<Transfer*>(self);
    const std::size_t bytes = size * count;
    if (t->offset + t->received + bytes > t->total) {
      t->too_long = true;
      return 0;  // ends the transfer (CURLE_WRITE_ERROR)
    }
    const std::size_t n = std::fwrite(data, 1, bytes, t->out);
    t->received += n;
    if (n != bytes) t->write_failed = true;
    return n;
  }

  static int progress(void* self, curl_off_t, curl_off_t now, curl_off_t, curl_off_t) {
    auto* t = static_cast<Transfer*>(self);
    if (t->options->stop.stop_requested()) return 1;  // aborts the transfer; the .part stays
    if (!t->options->progress) return 0;
    const auto at = std::chrono::steady_clock::now();
    if (at - t->drawn < std::chrono::milliseconds(100)) return 0;
    t->drawn = at;
    const double done = static_cast<double>(t->offset) + static_cast<double>(now);
    const double fraction = t->total > 0 ? done / static_cast<double>(t->total) : 0.0;
    const double seconds = std::chrono::duration<double>(at - t->start).count();
    const int filled = static_cast<int>(fraction * 30);
    std::fprintf(stderr, "\r  %-28s [%s%s] %3.0f%%  %s of %s  %s/s ", t->label.c_str(),
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(30 - filled), '.').c_str(), 100 * fraction,
                 megabytes(done).c_str(), megabytes(static_cast<double>(t->total)).c_str(),
                 megabytes(seconds > 0 ? static_cast<double>(now) / seconds : 0).c_str());
    return 0;
  }
};

// How a download ended, beside why: stopped by Ctrl-C, or on this
// machine's side (the .part could not be written: no server can help).
struct DownloadEnd {
  bool cancelled = false;
  bool local = false;
  bool too_long = false;  ///< the server sent more than the file: a bad copy, not the network
  std::uint64_t resumed_from = 0;  ///< a completed transfer that asked for the rest after these bytes
};

// Downloads `url` into `part`, resuming after what it holds. Empty when the
// transfer completed, else why not.
std::string download(const std::string& url, const std::filesystem::path& part, const RemoteFile& file,
                     const FetchOptions& o, DownloadEnd& end) {
  std::error_code ec;
  std::uint64_t offset = std::filesystem::exists(part, ec) ? std::filesystem::file_size(part, ec) : 0;
  if (ec || offset >= file.bytes) offset = 0;  // nothing to resume (a full .part failed its check)
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::fopen(part.c_str(), offset > 0 ? "ab" : "wb"),
                                                        &std::fclose);
    if (!out) {
      end.local = true;
      return "cannot write " + part.string() + ": " + std::strerror(errno);
    }
    Transfer t{out.get(), &o, file.name, offset, file.bytes};
    std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), &curl_easy_cleanup);
    char error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl.get(), CURLOPT_PROTOCOLS_STR, "http,https,file");
    curl_easy_setopt(curl.get(), CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl.get(), CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl.get(), CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl.get(), CURLOPT_USERAGENT, "asgd-data-fetch/0.1");
    curl_easy_setopt(curl.get(), CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.stall_timeout_s * 1000));
    curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(o.stall_timeout_s)));
    curl_easy_setopt(curl.get(), CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(offset));
    curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, &Transfer::write);
    curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, &Transfer::progress);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, &t);
    const CURLcode rc = curl_easy_perform(curl.get());
    if (o.progress) std::fprintf(stderr, "\r%*s\r", 100, "");
    const bool flushed = std::fflush(out.get()) == 0 && ::fsync(::fileno(out.get())) == 0;
    if (rc == CURLE_ABORTED_BY_CALLBACK && o.stop.stop_requested()) {
      end.cancelled = true;
      return "interrupted";
    }
    if (rc == CURLE_RANGE_ERROR && offset > 0) {  // the server cannot resume: start again from byte 0
      offset = 0;
      continue;
    }
    if (t.too_long) {
      out.reset();
      std::filesystem::remove(part, ec);
      end.too_long = true;
      return fmt::format("the server sent more than the file's {} bytes: not {}", file.bytes, file.name);
    }
    if (t.write_failed || !flushed) {
      end.local = true;
      return "cannot write " + part.string() + " (is the disk full?)";
    }
    if (rc != CURLE_OK) {
      long http = 0;
      curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &http);
      if (rc == CURLE_HTTP_RETURNED_ERROR) return fmt::format("HTTP {}", http);
      return *error ? std::string(error) : std::string(curl_easy_strerror(rc));
    }
    end.resumed_from = offset;
    return {};
  }
  return "the server refused to resume and to start again";
}

// Fetches one file into `dir` unless it is there and valid.
// Stopped (Ctrl-C) while `file` downloaded into `part`: kept for the next
// run to resume, unless nothing arrived.
Status interrupted(const RemoteFile& file, const std::filesystem::path& part) {
  std::error_code ec;
  if (std::filesystem::file_size(part, ec) == 0 && !ec) {
    std::filesystem::remove(part, ec);
    return Status::Cancelled(fmt::format("{}: interrupted before any of it arrived", file.name));
  }
  return Status::Cancelled(fmt::format("{}: interrupted; {} keeps what arrived: run the same command again to resume",
                                       file.name, part.string()));
}

Status fetch_file(const RemoteDataset& d, const RemoteFile& file, const FetchOptions& o) {
  const std::filesystem::path final_path = o.dir / file.name;
  const std::filesystem::path part = o.dir / (file.name + ".part");
  std::error_code ec;
  if (std::filesystem::exists(final_path, ec) && !std::filesystem::is_regular_file(final_path, ec))
    return Status::IOError(fmt::format("{}: {} is in the way (not a regular file): move it, then fetch again",
                                       file.name, final_path.string()));  // (found after the download, before)
  if (std::filesystem::exists(final_path, ec)) {
    const std::string bad = mismatch(final_path, file);
    if (bad.empty()) {
      if (o.say) o.say(fmt::format("{}: {}: already here, {} checked", d.name, file.name, file.algorithm));
      return {};
    }
    if (o.say) o.say(fmt::format("{}: {}: the copy here is bad ({}): fetching it again", d.name, file.name, bad));
  }
  const auto keep = [&](const std::string& from, double seconds) -> Status {
    if (Status s = sync_path(part, false); !s.ok()) return s;
    std::filesystem::rename(part, final_path, ec);
    if (ec) return Status::IOError(fmt::format("{}: cannot rename {} to it: {}", file.name, part.string(), ec.message()));
    if (Status s = sync_path(o.dir, true); !s.ok()) return s;
    if (o.say)
      o.say(fmt::format("{}: {}: {} from {} in {:.1f} s, {} ok", d.name, file.name,
                        megabytes(static_cast<double>(file.bytes)), from, seconds, file.algorithm));
    return {};
  };
  // A whole .part left by a run stopped before its check is checked as it is.
  if (std::filesystem::exists(part, ec) && std::filesystem::file_size(part, ec) == file.bytes) {
    if (mismatch(part, file).empty()) return keep(part.string(), 0.0);
    std::filesystem::remove(part, ec);
  }
  const std::vector<std::string> bases = o.mirror.empty() ? d.bases : std::vector<std::string>{o.mirror};
  std::vector<std::string> failures;
  bool corrupt = false;
  for (std::string base : bases) {
    if (!base.empty() && base.back() != '/') base += '/';
    const std::string url = base + file.name;
    const auto start = std::chrono::steady_clock::now();
    const bool resuming = std::filesystem::file_size(part, ec) > 0 && !ec;
    DownloadEnd end;
    std::string why = download(url, part, file, o, end);
    // A resumed copy that fails its check may be a damaged .part, not a bad
    // server: once more from byte 0 before the server is blamed.
    if (why.empty() && resuming && !mismatch(part, file).empty()) {
      std::filesystem::remove(part, ec);
      if (o.say) o.say(fmt::format("{}: {}: the resumed copy failed its check: fetching it whole", d.name, file.name));
      why = download(url, part, file, o, end);
    }
    if (end.cancelled) return interrupted(file, part);
    if (end.local) return Status::IOError(fmt::format("{}: {}", file.name, why));
    if (why.empty() && end.resumed_from > 0 && o.say)
      o.say(fmt::format("{}: {}: resumed after {}", d.name, file.name, megabytes(static_cast<double>(end.resumed_from))));
    if (!why.empty()) {
      if (std::filesystem::exists(part, ec) && std::filesystem::file_size(part, ec) == 0) std::filesystem::remove(part, ec);
      failures.push_back(url + " (" + why + ")");
      corrupt = corrupt || end.too_long;
      continue;
    }
    if (const std::string bad = mismatch(part, file); !bad.empty()) {
      std::filesystem::remove(part, ec);
      corrupt = true;
      failures.push_back(url + " (its copy has " + bad + ")");
      continue;
    }
    return keep(base, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::string tried;
  for (const std::string& f : failures) tried += (tried.empty() ? "" : "; ") + f;
  if (corrupt)
    return Status::Corruption(fmt::format("{}: no good copy: {}; nothing was kept under {}: try another --mirror",
                                          file.name, tried, final_path.string()));
  const bool kept = std::filesystem::exists(part, ec) && std::filesystem::file_size(part, ec) > 0;
  return Status::Unavailable(fmt::format("{}: could not download it: {}; check the network (or a proxy: "
                                         "https_proxy), or give --mirror URL of a copy{}",
                                         file.name, tried,
                                         kept ? "; what arrived is kept in " + part.string() + " for the next run to resume"
                                              : std::string()));
}

// Whether every member of the archive is in the folder, each checked.
bool members_present(const RemoteDataset& d, const FetchOptions& o) {
  return std::all_of(d.members.begin(), d.members.end(),
                     [&](const RemoteFile& m) { return mismatch(o.dir / m.name, m).empty(); });
}

// The archive's members unpacked into the folder (fetch_dataset fetched the
// archive only when they were not all there).
Status unpack_members(const RemoteDataset& d, const FetchOptions& o) {
  std::vector<std::string> names;
  for (const RemoteFile& m : d.members) names.push_back(m.name);
  const std::filesystem::path archive = o.dir / d.unpack;
  if (Status s = data::extract_tar_gz(archive, o.dir, names); !s.ok()) return s;
  for (const RemoteFile& m : d.members)
    if (const std::string bad = mismatch(o.dir / m.name, m); !bad.empty())
      return Status::Corruption(fmt::format("{} in {} has {}", m.name, archive.string(), bad));
  if (o.say) o.say(fmt::format("{}: unpacked {} files from {}", d.name, names.size(), d.unpack));
  return {};
}

}  // namespace

Status fetch_dataset(const RemoteDataset& d, const FetchOptions& o) {
  global_curl_init();
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return Status::IOError(fmt::format("cannot create the folder {}: {}", o.dir.string(), ec.message()));
  // One fetch at a time per folder: two wrote the same .part files and
  // renamed them from under each other (on a shared file system, nodes
  // fetching at once).
  auto lock = FolderLock::try_hold(o.dir);
  if (!lock && lock.status().code() == StatusCode::unavailable)
    return Status::Unavailable(fmt::format("another asgd data fetch is writing {}; wait for it to end (it holds "
                                           "the folder's lock), then run this one again to check the files",
                                           o.dir.string()));
  if (!lock) return lock.status();
  // The unpacked files already here and whole: the archive is not needed
  // (it was downloaded again, or the fetch failed offline, when it had been
  // removed after unpacking).
  if (!d.unpack.empty() && members_present(d, o)) {
    if (o.say) o.say(fmt::format("{}: the {} unpacked files are here, each checked", d.name, d.members.size()));
    return {};
  }
  for (const RemoteFile& file : d.files)
    if (Status s = fetch_file(d, file, o); !s.ok()) return s;
  if (!d.unpack.empty()) return unpack_members(d, o);
  return {};
}

}  // namespace asgd::cli
