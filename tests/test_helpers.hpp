#pragma once
// Small helpers several suites share.

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace asgd_test {

/// How many times slower a sanitized build runs a training job: ThreadSanitizer
/// costs 5-15x on our loops, AddressSanitizer about 2-3x. A harness's own
/// bound on waiting for a job (a log line, its exit) is multiplied by it, as
/// scripts/sanitize multiplies ctest's TIMEOUTs; a bound that is the
/// product's promise (a job stops within its heartbeat timeout) is not.
#if defined(__SANITIZE_THREAD__)
inline constexpr int kSanitizerSlowdown = 10;
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr int kSanitizerSlowdown = 3;
#else
inline constexpr int kSanitizerSlowdown = 1;
#endif

/// Whether a sanitizer is built in: tests that limit the address space mean
/// nothing then, since its shadow memory alone needs terabytes of it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// The resident memory of process `pid` (VmRSS in /proc/PID/status), or of
/// this process when `pid` is 0; 0 when it cannot be read.
inline std::size_t resident_bytes(int pid = 0) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmRSS:   123456 kB"
  return 0;
}

/// Limits this process's address space to `bytes` (RLIMIT_AS); exits with
/// status 90 when it cannot. For a death test's child.
inline void limit_address_space(std::uint64_t bytes) {
  const rlimit limit{bytes, bytes};
  if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(90);
}

/// The asgd binary the tests run: $ASGD_CLI when set (a test binary moved
/// away from its build tree, as in a scripts/gpu-bundle folder), else the
/// one built beside this test binary.
inline const char* asgd_cli_path() {
  const char* env = std::getenv("ASGD_CLI");
  return env != nullptr && *env != '\0' ? env : ASGD_CLI_PATH;
}

/// A library the tests built (a fake NVML, a fake CUDA plugin): at `built`,
/// its path in the build tree, or, in a scripts/gpu-bundle folder (whose
/// tests run far from the build tree), as `file` in the bundle's lib/.
inline std::string built_test_library(const std::string& built, const std::string& file) {
  std::error_code ec;
  if (std::filesystem::exists(built, ec)) return built;
  return (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().parent_path() / "lib" / file).string();
}

/// Polls `done` every 10 ms until it holds (true) or `limit` passes (false).
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// A JSON Lines file (a metrics file), one object per line.
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace asgd_test
