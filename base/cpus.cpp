#include "base/cpus.hpp"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace asgd {
namespace fs = std::filesystem;

namespace {

std::string read_first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

// ceil(quota / period) for a positive quota and period, else 0 (no limit).
unsigned whole_cpus(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<unsigned>((quota + period - 1) / period);
}

// cgroup v2: "max 100000" (no limit) or "QUOTA PERIOD".
unsigned v2_limit(const fs::path& dir) {
  std::istringstream in(read_first_line(dir / "cpu.max"));
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max") return 0;
  try {
    return whole_cpus(std::stoll(quota), period);
  } catch (const std::exception&) {
    return 0;
  }
}

// cgroup v1: cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us.
unsigned v1_limit(const fs::path& dir) {
  try {
    return whole_cpus(std::stoll(read_first_line(dir / "cpu.cfs_quota_us")),
                      std::stoll(read_first_line(dir / "cpu.cfs_period_us")));
  } catch (const std::exception&) {
    return 0;
  }
}

// Keeps the lower of two limits (a limit of 0 CPUs is none).
void keep_lower(CgroupCpuLimit& lowest, unsigned cpus, const fs::path& group) {
  if (cpus > 0 && (lowest.cpus == 0 || cpus < lowest.cpus)) lowest = {cpus, group};
}

// The lowest limit of the group at `path` under `mount` and its ancestors
// up to the mount itself (a group in another namespace's terms, whose path
// is not under this mount, finds the mount's own).
template <class Limit>
CgroupCpuLimit lowest_limit(const fs::path& mount, const std::string& path, Limit limit) {
  CgroupCpuLimit lowest;
  fs::path rel = fs::path(path).relative_path();
  for (;;) {
    std::error_code ec;
    const fs::path dir = mount / rel;
    if (fs::is_directory(dir, ec)) keep_lower(lowest, limit(dir), dir);
    if (rel.empty()) return lowest;
    rel = rel.parent_path();
  }
}

// Where the v1 cpu controller is mounted: its folder is named after the
// controllers mounted together ("cpu,cpuacct"), often with a link per name.
fs::path v1_cpu_mount(const fs::path& root, const std::string& controllers) {
  for (const std::string& name : {controllers, std::string("cpu,cpuacct"), std::string("cpuacct,cpu"),
                                  std::string("cpu")}) {
    std::error_code ec;
    if (fs::exists(root / name / "cpu.cfs_quota_us", ec)) return root / name;
  }
  return {};
}

bool lists_cpu(const std::string& controllers) {
  std::istringstream in(controllers);
  std::string c;
  while (std::getline(in, c, ','))
    if (c == "cpu") return true;
  return false;
}

}  // namespace

CgroupCpuLimit cgroup_cpu_limit(const std::string& proc_self_cgroup, const fs::path& root) {
  CgroupCpuLimit lowest;
  const auto take = [&lowest](const CgroupCpuLimit& l) { keep_lower(lowest, l.cpus, l.group); };
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "ID:CONTROLLERS:PATH"; v2's is "0::PATH".
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::error_code ec;
    if (controllers.empty()) {
      // The unified hierarchy: at the root, or beside the v1 ones (hybrid).
      for (const fs::path& mount : {root, root / "unified"})
        if (fs::exists(mount / "cgroup.controllers", ec)) {
          take(lowest_limit(mount, path, v2_limit));
          break;
        }
    } else if (lists_cpu(controllers)) {
      if (const fs::path mount = v1_cpu_mount(root, controllers); !mount.empty())
        take(lowest_limit(mount, path, v1_limit));
    }
  }
  return lowest;
}

std::vector<unsigned> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<unsigned> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (unsigned cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

namespace {

// How many CPUs `allowed` (allowed_cpus()) holds, the host's count where
// it is empty (the mask could not be read).
unsigned count_of(const std::vector<unsigned>& allowed) {
  return allowed.empty() ? std::max(1u, std::thread::hardware_concurrency()) : static_cast<unsigned>(allowed.size());
}

}  // namespace

unsigned affinity_cpus() { return count_of(allowed_cpus()); }

namespace {

// Read once per process: models ask at every build (Model::finalize), and
// a job's CPU limit seldom changes while it runs (one that does is seen by
// the next process).
const CgroupCpuLimit& own_cgroup_limit() {
  static const CgroupCpuLimit limit = [] {
    std::ifstream in("/proc/self/cgroup");
    std::stringstream text;
    text << in.rdbuf();
    return cgroup_cpu_limit(text.str(), "/sys/fs/cgroup");
  }();
  return limit;
}

}  // namespace

unsigned usable_cpus() {
  const unsigned cpus = affinity_cpus();
  const unsigned limit = own_cgroup_limit().cpus;
  return limit > 0 ? std::min(cpus, limit) : cpus;
}

std::string cpu_set_key() {
  std::string key = read_first_line("/proc/sys/kernel/random/boot_id");
  if (key.empty()) key = "no-boot-id";
  const std::vector<unsigned> cpus = allowed_cpus();
  // A limit below the mask's CPUs is the group's own budget: its folder's
  // device and inode name it (the same in every namespace).
  if (const CgroupCpuLimit& limit = own_cgroup_limit(); limit.cpus > 0 && limit.cpus < count_of(cpus)) {
    struct stat st {};
    if (stat(limit.group.c_str(), &st) == 0)
      key += "/cgroup-" + std::to_string(st.st_dev) + "-" + std::to_string(st.st_ino);
  }
  if (cpus.empty()) return key + "/all";
  // The mask as hex, highest CPU first, without leading zeros.
  std::vector<int> nibbles(cpus.back() / 4 + 1, 0);  // CPUs 0-3 first
  for (unsigned cpu : cpus) nibbles[cpu / 4] |= 1 << (cpu % 4);
  std::string mask;
  for (auto n = nibbles.rbegin(); n != nibbles.rend(); ++n) mask += "0123456789abcdef"[*n];
  return key + "/" + mask;
}

bool cpu_keys_overlap(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const auto slash_a = a.rfind('/'), slash_b = b.rfind('/');
  if (slash_a == std::string::npos || slash_b == std::string::npos) return false;
  if (a.compare(0, slash_a, b, 0, slash_b) != 0) return false;  // another machine or control group
  const std::string mask_a = a.substr(slash_a + 1), mask_b = b.substr(slash_b + 1);
  if (mask_a == "all" || mask_b == "all") return true;
  // Hex digits, highest CPU first: compare from the lowest CPUs up.
  auto nibble = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (std::size_t i = 0; i < std::min(mask_a.size(), mask_b.size()); ++i) {
    const int x = nibble(mask_a[mask_a.size() - 1 - i]), y = nibble(mask_b[mask_b.size() - 1 - i]);
    if (x < 0 || y < 0) return false;
    if ((x & y) != 0) return true;
  }
  return false;
}

}  // namespace asgd
