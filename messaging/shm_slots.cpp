// Shared memory objects left behind by processes that died
// (messaging/shm_slots.hpp's remove_orphans and remove_stale_slots).

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/process.hpp"
#include "messaging/shm_slots.hpp"

namespace asgd::messaging::shm_detail {
namespace {

// "asgd-PID-TOKEN-INDEX", as make_slot names a slot: its PID, or 0.
pid_t offering_pid(std::string_view name) {
  if (!name.starts_with("asgd-")) return 0;
  name.remove_prefix(5);
  std::uint64_t numbers[3] = {};
  for (int k = 0; k < 3; ++k) {
    if (k > 0) {
      if (!name.starts_with('-')) return 0;
      name.remove_prefix(1);
    }
    const auto [at, ec] = std::from_chars(name.data(), name.data() + name.size(), numbers[k]);  // no digits: an error
    if (ec != std::errc()) return 0;
    name.remove_prefix(static_cast<std::size_t>(at - name.data()));
  }
  return name.empty() && numbers[0] <= static_cast<std::uint64_t>(INT32_MAX) ? static_cast<pid_t>(numbers[0]) : 0;
}

}  // namespace

std::optional<OutSlot> make_slot_file(std::uint64_t token, std::size_t index, std::size_t size, std::string* why) {
  OutSlot s;
  s.name = "/asgd-" + std::to_string(getpid()) + "-" + std::to_string(token) + "-" + std::to_string(index);
  const int fd = shm_open(s.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot create shared memory " + s.name + ": " + std::strerror(errno);
    return std::nullopt;
  }
  s.file = std::make_unique<Fd>(fd);
  // posix_fallocate, not ftruncate: a full /dev/shm is an error here, not a
  // SIGBUS on the first write.
  if (posix_fallocate(fd, 0, static_cast<off_t>(size)) != 0 || !(s.region = map_region(fd, size))) {
    shm_unlink(s.name.c_str());
    *why = "cannot size shared memory " + s.name;
    return std::nullopt;
  }
  return s;
}

std::size_t remove_orphans(const std::string& dir, const std::function<pid_t(const std::string& name)>& owner_of) {
  std::size_t removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const pid_t pid = owner_of(name);
    if (pid == 0 || process_runs(pid)) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

std::size_t remove_stale_slots(const std::string& dir) {
  return remove_orphans(dir, [](const std::string& name) { return offering_pid(name); });
}

}  // namespace asgd::messaging::shm_detail
