#include "actors/checkpoint_claim.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "actors/checkpoint.hpp"

namespace asgd {

namespace fs = std::filesystem;

namespace {

// How long a claim file's lock may be held by another before giving up:
// its holders read and write a number, or rename a file, under it.
constexpr auto kClaimLockWait = std::chrono::seconds(10);

// FILE.claim, open and locked for as long as this lives.
class LockedClaim {
 public:
  static Result<LockedClaim> open(const std::string& file) {
    LockedClaim c(file + ".claim");
    c.fd_ = ::open(c.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c.fd_ < 0) return Status::IOError("cannot open " + c.path_ + ": " + std::strerror(errno));
    const auto deadline = std::chrono::steady_clock::now() + kClaimLockWait;
    while (::flock(c.fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR)
        return Status::IOError("cannot lock " + c.path_ + ": " + std::strerror(errno));
      if (std::chrono::steady_clock::now() >= deadline)
        return Status::IOError("cannot lock " + c.path_ + ": another process has held it for over " +
                               std::to_string(kClaimLockWait.count()) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return c;
  }
  LockedClaim(LockedClaim&& other) noexcept : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}
  LockedClaim& operator=(LockedClaim&&) = delete;
  ~LockedClaim() {
    if (fd_ >= 0) ::close(fd_);  // and the lock with it
  }

  // The newest claim's number; 0 for a claim file just made.
  Result<std::uint64_t> newest() const {
    char text[32];
    const ssize_t n = ::pread(fd_, text, sizeof text, 0);
    if (n < 0) return Status::IOError("cannot read " + path_ + ": " + std::strerror(errno));
    std::size_t end = static_cast<std::size_t>(n);
    while (end > 0 && text[end - 1] == '\n') --end;
    if (end == 0) return std::uint64_t{0};
    std::uint64_t number = 0;
    const auto [at, err] = std::from_chars(text, text + end, number);
    if (err != std::errc() || at != text + end)
      return Status::Corruption(path_ + ": holds no claim number (remove it if no shard of this job is running)");
    return number;
  }

  Status set(std::uint64_t number) const {
    const std::string text = std::to_string(number) + "\n";
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) || ::fsync(fd_) != 0)
      return Status::IOError("cannot write " + path_ + ": " + std::strerror(errno));
    return {};
  }

 private:
  explicit LockedClaim(std::string path) : path_(std::move(path)) {}
  std::string path_;
  int fd_ = -1;
};

// FILE.claim, locked, while no claim newer than `claim` was taken on
// `file`: the write of claim `claim` may go on while it is held. Errors:
// cancelled when a newer claim was taken, as LockedClaim's otherwise.
Result<LockedClaim> hold_if_newest(const std::string& file, std::uint64_t claim) {
  auto locked = LockedClaim::open(file);
  if (!locked) return locked.status();
  auto newest = locked->newest();
  if (!newest) return newest.status();
  if (*newest > claim)
    return Status::Cancelled(file + " was claimed by another process after this one (its claim " +
                             std::to_string(*newest) + ", this one's " + std::to_string(claim) +
                             "): it took this shard's place, and this process's state is older than its own");
  return locked;
}

std::string temporary_of(const std::string& file, std::uint64_t claim) {
  return file + "." + std::to_string(claim) + ".tmp";
}

// Removes FILE.K.tmp for every K below `claim`: what processes killed
// mid-write left (a live one that was given up for dead loses its write,
// which the claim would refuse anyway).
void remove_older_temporaries(const std::string& file, std::uint64_t claim) {
  std::error_code ec;
  for (const auto& [k, path] : unfinished_writes(file))
    if (k < claim) fs::remove(path, ec);
}

}  // namespace

std::vector<std::pair<std::uint64_t, std::string>> unfinished_writes(const std::string& file) {
  const fs::path path(file);
  const std::string prefix = path.filename().string() + ".";
  std::vector<std::pair<std::uint64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path.has_parent_path() ? path.parent_path() : ".", ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".tmp") || entry.is_directory(ec)) continue;
    std::uint64_t k = 0;
    const char* first = name.data() + prefix.size();
    const char* last = name.data() + name.size() - 4;
    const auto [at, err] = std::from_chars(first, last, k);
    if (err == std::errc() && at == last) found.emplace_back(k, entry.path().string());
  }
  return found;
}

Result<std::uint64_t> claim_checkpoint(const std::string& file) {
  if (Status s = create_parent(file); !s.ok()) return s;
  auto claim = LockedClaim::open(file);
  if (!claim) return claim.status();
  auto newest = claim->newest();
  if (!newest) return newest.status();
  const std::uint64_t mine = *newest + 1;
  if (Status s = claim->set(mine); !s.ok()) return s;
  remove_older_temporaries(file, mine);
  return mine;
}

Status claimable(const std::string& file) {
  std::error_code ec;
  if (!fs::exists(file + ".claim", ec)) return {};
  auto claim = LockedClaim::open(file);
  if (!claim) return claim.status();
  auto newest = claim->newest();
  return newest ? Status{} : newest.status();
}

Status write_claimed(const std::string& file, std::uint64_t claim, const std::string& bytes) {
  // No write at all for a superseded claim (a stale process wakes to
  // ticks and stops); the lock is let go while the bytes are written.
  if (auto held = hold_if_newest(file, claim); !held) return held.status();
  const std::string tmp = temporary_of(file, claim);
  if (Status s = write_synced(tmp, bytes); !s.ok()) return s;
  auto held = hold_if_newest(file, claim);  // and held through the rename
  if (!held) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return held.status();
  }
  return rename_synced(tmp, file);
}

}  // namespace asgd
