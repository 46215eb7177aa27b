#include "base/cpu_binding.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/cpus.hpp"

namespace asgd {

namespace {

// A CPU number: decimal digits only, below CPU_SETSIZE.
bool parse_cpu(std::string_view s, unsigned& cpu) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), cpu);
  return ec == std::errc() && end == s.data() + s.size() && cpu < CPU_SETSIZE;
}

}  // namespace

Result<std::vector<unsigned>> parse_cpu_list(std::string_view text) {
  std::vector<unsigned> cpus;
  if (text.empty()) return Status::InvalidArgument("an empty CPU list (write it as 0-3,8)");
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view part = text.substr(at, comma - at);
    const std::size_t dash = part.find('-');
    unsigned first = 0, last = 0;
    const bool ok = dash == std::string_view::npos
                        ? parse_cpu(part, first) && parse_cpu(part, last)
                        : parse_cpu(part.substr(0, dash), first) && parse_cpu(part.substr(dash + 1), last);
    if (!ok || last < first)
      return Status::InvalidArgument("'" + std::string(part) + "' in the CPU list '" + std::string(text) +
                                     "' is not a CPU number or a range N-M (write the list as 0-3,8; CPUs below " +
                                     std::to_string(CPU_SETSIZE) + ")");
    for (unsigned c = first; c <= last; ++c) cpus.push_back(c);
    at = comma + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<unsigned>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j >= i + 2) {
      out += '-' + std::to_string(cpus[j]);
    } else if (j == i + 1) {
      out += ',' + std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

namespace {

// Calls `apply` with each of this process's threads but the calling one:
// those a library started as it loaded (OpenBLAS's, idle) kept the CPUs
// and the scheduling the process was started with, while the log said
// every thread. Best effort: a thread may end meanwhile.
template <class Apply>
void for_other_threads(Apply apply) {
  const pid_t self = static_cast<pid_t>(::syscall(SYS_gettid));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const std::string name = entry.path().filename().string();
    pid_t tid = 0;
    if (std::from_chars(name.data(), name.data() + name.size(), tid).ec == std::errc() && tid != self) apply(tid);
  }
}

}  // namespace

Status bind_to_cpus(const std::vector<unsigned>& cpus) {
  if (cpus.empty()) return Status::InvalidArgument("no CPUs to bind to");
  const std::vector<unsigned> allowed = allowed_cpus();
  std::vector<unsigned> outside;
  for (unsigned c : cpus)
    if (!std::binary_search(allowed.begin(), allowed.end(), c)) outside.push_back(c);
  if (!outside.empty())
    return Status::InvalidArgument("CPU" + std::string(outside.size() > 1 ? "s " : " ") + format_cpu_list(outside) +
                                   (outside.size() > 1 ? " are" : " is") +
                                   " not among the CPUs this process may use (" + format_cpu_list(allowed) + ")");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    return Status::IOError("binding to CPUs " + format_cpu_list(cpus) + " failed (sched_setaffinity)");
  for_other_threads([&](pid_t tid) { sched_setaffinity(tid, sizeof set, &set); });
  return {};
}

Status use_batch_scheduling() {
  const sched_param none{};
  if (sched_setscheduler(0, SCHED_BATCH, &none) != 0)
    return Status::IOError(std::string("SCHED_BATCH refused: ") + std::strerror(errno));
  for_other_threads([&](pid_t tid) { sched_setscheduler(tid, SCHED_BATCH, &none); });
  return {};
}

bool batch_scheduled() { return sched_getscheduler(0) == SCHED_BATCH; }

std::vector<std::vector<unsigned>> cores_of(const std::vector<unsigned>& cpus, const std::filesystem::path& root) {
  // (package, core) of each CPU; a CPU without them gets a core of its own
  // after every described one.
  auto read = [&](unsigned cpu, const char* name) {
    std::ifstream in(root / ("cpu" + std::to_string(cpu)) / "topology" / name);
    long long v = -1;
    return in >> v && v >= 0 ? v : -1;
  };
  std::map<std::pair<long long, long long>, std::vector<unsigned>> described;
  std::vector<std::vector<unsigned>> alone;
  for (unsigned cpu : cpus) {
    const long long package = read(cpu, "physical_package_id"), core = read(cpu, "core_id");
    if (package < 0 || core < 0) {
      alone.push_back({cpu});
    } else {
      described[{package, core}].push_back(cpu);
    }
  }
  std::vector<std::vector<unsigned>> cores;
  for (auto& [where, on] : described) cores.push_back(std::move(on));
  for (auto& c : alone) cores.push_back(std::move(c));
  return cores;
}

namespace {

// `units` in `parts` blocks of consecutive units, as even as can be.
std::vector<std::vector<unsigned>> blocks_of(const std::vector<std::vector<unsigned>>& units, unsigned parts) {
  std::vector<std::vector<unsigned>> out(parts);
  const std::size_t base = units.size() / parts, extra = units.size() % parts;
  std::size_t at = 0;
  for (unsigned p = 0; p < parts; ++p) {
    for (std::size_t n = base + (p < extra ? 1 : 0); n > 0; --n, ++at)
      out[p].insert(out[p].end(), units[at].begin(), units[at].end());
    std::sort(out[p].begin(), out[p].end());
  }
  return out;
}

}  // namespace

std::vector<std::vector<unsigned>> split_cpus(const std::vector<unsigned>& allowed, unsigned parts,
                                              const std::filesystem::path& root) {
  if (parts == 0 || allowed.size() < parts) return {};
  const auto cores = cores_of(allowed, root);
  if (cores.size() >= parts) return blocks_of(cores, parts);
  std::vector<std::vector<unsigned>> cpus;  // the CPUs one by one, a core's next to each other
  for (const auto& core : cores)
    for (unsigned cpu : core) cpus.push_back({cpu});
  return blocks_of(cpus, parts);
}

}  // namespace asgd
