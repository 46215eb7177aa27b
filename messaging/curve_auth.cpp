#include "messaging/curve_auth.hpp"

#include <fcntl.h>
#include "base/log.hpp"
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>
#include <system_error>
#include <vector>

namespace asgd::messaging {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kZ85KeyChars = 40;
constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
constexpr std::string_view kKeyTag = " curve:";
// A key file is two comment lines and a key: anything this large is not one.
constexpr std::uintmax_t kMaxKeyFileBytes = 64 << 10;

std::string_view trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

std::string errno_text(int e) { return std::strerror(e); }

// The one key in a key file (format in the header).
Result<CurveKey> read_key(const fs::path& file) {
  std::error_code ec;
  const auto st = fs::status(file, ec);
  if (ec || !fs::exists(st)) return Status::NotFound(file.string() + ": no such key file");
  if (!fs::is_regular_file(st)) return Status::InvalidArgument(file.string() + ": not a key file (not a regular file)");
  const auto size = fs::file_size(file, ec);
  if (ec) return Status::IOError(file.string() + ": " + ec.message());
  if (size > kMaxKeyFileBytes)
    return Status::InvalidArgument(file.string() + ": " + std::to_string(size) + " bytes is not a key file");
  std::ifstream in(file);
  if (!in) return Status::IOError(file.string() + ": cannot be read: " + errno_text(errno));
  std::optional<CurveKey> key;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string_view t = trimmed(line);
    if (t.empty() || t.front() == '#') continue;
    if (key)
      return Status::InvalidArgument(file.string() + ": line " + std::to_string(number) +
                                     ": a second key (a key file holds one line of 40 Z85 characters)");
    key = from_z85(t);
    if (!key)
      return Status::InvalidArgument(file.string() + ": line " + std::to_string(number) +
                                     " is not a CURVE key (one line of 40 Z85 characters)");
  }
  if (!key) return Status::InvalidArgument(file.string() + ": holds no key (one line of 40 Z85 characters)");
  return *key;
}

bool valid_key_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

// Writes `text` to `file` with `mode`, through a temporary file renamed over
// it, so that a reader never sees half a key.
Status write_file(const fs::path& file, const std::string& text, mode_t mode) {
  std::string hidden = ".";  // (not "." + name: GCC 12 warns falsely about that)
  hidden += file.filename().string();
  hidden += ".tmp" + std::to_string(::getpid());
  const fs::path tmp = file.parent_path() / hidden;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Status::IOError(tmp.string() + ": cannot be created: " + errno_text(errno));
  bool ok = ::fchmod(fd, mode) == 0;  // the umask may have narrowed it; never widened beyond `mode`
  std::size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (ok && ::rename(tmp.c_str(), file.c_str()) == 0) return {};
  const std::string why = errno_text(ok ? errno : saved);
  ::unlink(tmp.c_str());
  return Status::IOError(file.string() + ": cannot be written: " + why);
}

std::string key_file_text(const std::string& comment, const CurveKey& key) { return comment + to_z85(key) + "\n"; }

}  // namespace

bool curve_supported() { return zmq_has("curve") == 1; }

std::string to_z85(const CurveKey& key) {
  char text[kZ85KeyChars + 1] = {};
  zmq_z85_encode(text, key.data(), key.size());
  return std::string(text, kZ85KeyChars);
}

std::optional<CurveKey> from_z85(std::string_view text) {
  if (text.size() != kZ85KeyChars) return std::nullopt;
  if (text.find_first_not_of(kZ85Alphabet) != std::string_view::npos) return std::nullopt;
  const std::string terminated(text);  // zmq_z85_decode reads a C string
  CurveKey key{};
  if (zmq_z85_decode(key.data(), terminated.c_str()) == nullptr) return std::nullopt;
  return key;
}

std::string key_fingerprint(const CurveKey& public_key) { return to_z85(public_key).substr(0, 12); }

Result<CurveKeypair> new_curve_keypair() {
  if (!curve_supported()) return Status::Unavailable("this libzmq was built without CURVE (libsodium)");
  char pub[kZ85KeyChars + 1] = {};
  char sec[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    return Status::Internal(std::string("generating a CURVE keypair failed: ") + zmq_strerror(zmq_errno()));
  CurveKeypair k;
  k.public_key = *from_z85(pub);
  k.secret_key = *from_z85(sec);
  return k;
}

Result<CurveKey> curve_public_key(const CurveKey& secret_key) {
  if (!curve_supported()) return Status::Unavailable("this libzmq was built without CURVE (libsodium)");
  const std::string sec = to_z85(secret_key);
  char pub[kZ85KeyChars + 1] = {};
  if (zmq_curve_public(pub, sec.c_str()) != 0)
    return Status::Internal(std::string("deriving a CURVE public key failed: ") + zmq_strerror(zmq_errno()));
  return *from_z85(pub);
}

Result<CurveKey> read_public_key_file(const fs::path& file) { return read_key(file); }

Result<CurveKeypair> read_secret_key_file(const fs::path& file) {
  // Both halves are 40 Z85 characters: the name is the one way to tell them apart.
  if (file.extension() == ".pub")
    return Status::InvalidArgument(file.string() + ": a public key file; this needs the secret key (NAME.key)");
  auto secret = read_key(file);
  if (!secret) return secret.status();
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    logger().warn("{}: the secret key is readable by other users (mode {:04o}); run chmod 600 {}", file.string(),
                 st.st_mode & 07777, file.string());
  auto pub = curve_public_key(*secret);
  if (!pub) return pub.status();
  return CurveKeypair{*pub, *secret};
}

Result<KeyFiles> write_key_files(const fs::path& dir, const std::string& name, const CurveKeypair& keys,
                                 bool overwrite) {
  if (!valid_key_name(name))
    return Status::InvalidArgument("--name '" + name +
                                   "': use letters, digits, '.', '_' and '-', not starting with '.'");
  KeyFiles files{dir / (name + ".key"), dir / (name + ".pub")};
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) return Status::IOError(dir.string() + ": cannot be created: " + ec.message());
    fs::permissions(dir, fs::perms::owner_all, ec);  // it holds a secret
  } else if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument("--out " + dir.string() + ": not a folder");
  }
  if (!overwrite) {
    for (const fs::path& f : {files.secret, files.public_})
      if (fs::exists(f, ec))
        return Status::InvalidArgument(f.string() +
                                       " exists; --force replaces it (whoever holds the old key is then refused)");
  }
  const std::string quoted = "\"" + name + "\"";
  Status s = write_file(files.secret,
                        key_file_text("# asgd CURVE secret key " + quoted +
                                          " (Z85). Keep it on this host, readable by its owner only:\n"
                                          "# whoever holds it is admitted as " + quoted +
                                          " by every process whose --auth-keys folder has " + name + ".pub.\n",
                                      keys.secret_key),
                        0600);
  if (!s.ok()) return s;
  s = write_file(files.public_,
                 key_file_text("# asgd CURVE public key " + quoted +
                                   " (Z85). Copy it into the --auth-keys folder of every process\n"
                                   "# that should admit " + quoted + " or connect to it.\n",
                               keys.public_key),
                 0644);
  if (!s.ok()) return s;
  return files;
}

Result<CurveOptions> load_auth_keys(const AuthKeysSpec& spec) {
  const std::string flag = "--auth-keys " + spec.dir;
  if (!curve_supported()) return Status::Unavailable(flag + ": this libzmq was built without CURVE (libsodium)");
  std::error_code ec;
  if (spec.dir.empty() || !fs::is_directory(spec.dir, ec)) return Status::NotFound(flag + ": no such folder");
  std::vector<fs::path> pubs, secrets;
  for (const auto& entry : fs::directory_iterator(spec.dir, ec)) {
    const auto ext = entry.path().extension();
    // A key the user meant that is not a file (a folder named x.pub) is
    // said, not passed over: its peer would be refused without a word why.
    if (!entry.is_regular_file(ec) && (ext == ".pub" || ext == ".key"))
      return Status::InvalidArgument(entry.path().string() + ": not a key file (not a regular file)");
    if (!entry.is_regular_file(ec)) continue;
    if (ext == ".pub") pubs.push_back(entry.path());
    if (ext == ".key") secrets.push_back(entry.path());
  }
  if (ec) return Status::IOError(flag + ": cannot be listed: " + ec.message());
  std::sort(pubs.begin(), pubs.end());
  std::sort(secrets.begin(), secrets.end());
  if (pubs.empty())
    return Status::InvalidArgument(flag + ": holds no *.pub file, so no peer would be admitted; `asgd keys generate "
                                          "--out " + spec.dir + " --name NAME` writes one");
  CurveOptions o;
  for (const auto& p : pubs) {
    auto key = read_public_key_file(p);
    if (!key) return key.status();
    o.allowed.push_back(*key);
  }
  std::sort(o.allowed.begin(), o.allowed.end());
  o.allowed.erase(std::unique(o.allowed.begin(), o.allowed.end()), o.allowed.end());

  fs::path key_file = spec.key_file;
  if (key_file.empty()) {
    if (secrets.empty())
      return Status::NotFound(flag + ": holds no secret key (*.key) for this process; write one with `asgd keys "
                                     "generate --out " + spec.dir + " --name NAME`, or give --key FILE");
    if (secrets.size() > 1) {
      std::string names;
      for (const auto& s : secrets) names += (names.empty() ? "" : ", ") + s.filename().string();
      return Status::InvalidArgument(flag + ": holds several secret keys (" + names +
                                     "); say which is this process's with --key FILE");
    }
    key_file = secrets.front();
  }
  auto own = read_secret_key_file(key_file);
  if (!own) return own.status();
  // A public key copied to NAME.key reads as a secret one of another
  // identity, which every peer then refuses.
  if (std::find(o.allowed.begin(), o.allowed.end(), own->secret_key) != o.allowed.end())
    return Status::InvalidArgument(key_file.string() + ": holds a public key of " + flag +
                                   " (one of its *.pub files), not a secret key; give the NAME.key that `asgd keys "
                                   "generate` wrote beside NAME.pub");
  o.public_key = own->public_key;
  o.secret_key = own->secret_key;

  fs::path server = spec.server_key_file;
  const fs::path coordinator = fs::path(spec.dir) / "coordinator.pub";
  if (server.empty() && fs::exists(coordinator, ec)) server = coordinator;
  if (!server.empty()) {
    auto key = read_public_key_file(server);
    if (!key) return key.status();
    o.server_key = *key;
  }
  return o;
}

std::string with_server_key(const std::string& endpoint, const CurveKey& server_key) {
  return endpoint + std::string(kKeyTag) + to_z85(server_key);
}

Result<std::pair<std::string, std::optional<CurveKey>>> split_server_key(const std::string& endpoint) {
  const auto at = endpoint.rfind(kKeyTag);
  if (at == std::string::npos) return std::make_pair(endpoint, std::optional<CurveKey>());
  auto key = from_z85(std::string_view(endpoint).substr(at + kKeyTag.size()));
  if (!key)
    return Status::InvalidArgument("endpoint '" + endpoint +
                                   "': what follows ' curve:' is not a CURVE public key (40 Z85 characters)");
  return std::make_pair(endpoint.substr(0, at), key);
}

bool LogBudget::allow(Clock::time_point now, std::uint64_t& left_out) {
  if (used_ == 0 || now - window_start_ >= window_) {
    window_start_ = now;
    used_ = 0;
  }
  if (used_ >= lines_) {
    ++held_back_;
    return false;
  }
  ++used_;
  left_out = held_back_;
  held_back_ = 0;
  return true;
}

}  // namespace asgd::messaging
