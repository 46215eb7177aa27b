// Shared memory objects left behind by processes that died
// (messaging/shm_slots.hpp's remove_orphans and remove_stale_slots).

#include <sys/mman.h>

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
