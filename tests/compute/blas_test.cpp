#include "compute/blas.hpp"

#include <cblas.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_helpers.hpp"

namespace asgd {
namespace {

using asgd_test::kSanitized;

// OpenBLAS's own threads, for each of which reserve_buffers takes one more.
const std::size_t kOpenblasThreads = static_cast<std::size_t>(std::max(openblas_get_num_procs() - 1, 0));

// The address space this process has mapped, in bytes.
std::uint64_t mapped_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  return 0;
}

// Leaves `room` bytes of address space to this process beyond what it has.
void leave_room(std::uint64_t room) { asgd_test::limit_address_space(mapped_bytes() + room); }

// Maps what is left of the address space, in pieces down to a page.
void use_up_the_address_space() {
  for (std::size_t piece = std::size_t{1} << 30; piece >= 4096; piece /= 2)
    while (::mmap(nullptr, piece, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != MAP_FAILED) {
    }
}

// Two threads multiply 512 x 512 matrices (big enough for OpenBLAS's
// buffered path) once no address space is left. Exits 0 when both return;
// OpenBLAS retrying a buffer forever is the alarm's SIGALRM.
int products_with_reserved_buffers() {
  ::alarm(30);
  blas::set_threads(1);  // as asgd's jobs run it: each product on its caller's thread
  if (!blas::reserve_buffers(2).ok()) return 2;
  constexpr std::size_t n = 512;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c1(n * n), c2(n * n);
  std::atomic<bool> go = false;
  auto multiply = [&](std::vector<float>& c) {
    while (!go.load()) std::this_thread::yield();
    blas::gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
  };
  std::thread t1(multiply, std::ref(c1));  // their stacks mapped before the space runs out
  std::thread t2(multiply, std::ref(c2));
  leave_room(64 << 20);
  use_up_the_address_space();
  go = true;
  t1.join();
  t2.join();
  return c1[0] == 0.5f * n && c2[n * n - 1] == 0.5f * n ? 0 : 3;
}

int reserving_without_room() {
  ::alarm(30);
  leave_room(64 << 20);  // less than one buffer
  const Status s = blas::reserve_buffers(1);
  if (s.ok()) return 2;
  if (s.code() != StatusCode::unavailable) return 3;
  return s.message().find("BLAS work buffer 1 of " + std::to_string(1 + kOpenblasThreads)) != std::string::npos ? 0 : 4;
}

// Two live claims reserve for both; one given back leaves the other's.
int claims_add_up() {
  ::alarm(60);
  auto first = blas::BufferClaim::make(1);
  if (!first.ok()) return 2;
  leave_room(64 << 20);  // less than one more buffer: every reservation's check fails, naming its count
  {
    auto second = blas::BufferClaim::make(1);
    const std::string both = "of " + std::to_string(2 + kOpenblasThreads) + " ";
    if (second.ok() || second.status().message().find(both) == std::string::npos) return 3;
  }
  std::optional<blas::BufferClaim> moved(std::move(first).value());
  moved.reset();
  auto third = blas::BufferClaim::make(1);
  const std::string one = "of " + std::to_string(1 + kOpenblasThreads) + " ";
  return !third.ok() && third.status().message().find(one) != std::string::npos ? 0 : 4;
}

TEST(BlasDeathTest, ProductsOnReservedBuffersRunWhenNoAddressSpaceIsLeft) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit in the limit";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(products_with_reserved_buffers()), ::testing::ExitedWithCode(0), "");
}

TEST(BlasDeathTest, ReservingABufferThatDoesNotFitIsUnavailableNotAHang) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit in the limit";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(reserving_without_room()), ::testing::ExitedWithCode(0), "");
}

TEST(BlasDeathTest, EachClaimReservesForEveryLiveClaimAndGivesItsShareBack) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit in the limit";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(claims_add_up()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace asgd
