#pragma once
// One writer at a time in a folder: an exclusive flock on the folder's own
// descriptor (no file is made in it), held until the FolderLock goes.
// Across processes and within one alike: every holder opens the folder
// itself, and flock's locks belong to the open file, not to the process.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "asgd/status.hpp"

namespace asgd {

class FolderLock {
 public:
  /// Takes `dir`'s lock without waiting. Errors: unavailable while another
  /// holds it, io_error when the folder cannot be opened.
  static Result<FolderLock> try_hold(const std::filesystem::path& dir) {
    FolderLock lock(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (lock.fd_ < 0) return Status::IOError("cannot open the folder " + dir.string() + ": " + std::strerror(errno));
    if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0)
      return Status::Unavailable("another holds the lock of the folder " + dir.string());
    return lock;
  }

  FolderLock(FolderLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FolderLock& operator=(FolderLock&&) = delete;
  FolderLock(const FolderLock&) = delete;
  ~FolderLock() {
    if (fd_ >= 0) ::close(fd_);  // and the lock with it
  }

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace asgd
