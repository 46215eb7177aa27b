#pragma once
// What the shared-memory tests share: whether this machine lets a process
// make what make_shm_transport uses, and the skips when it does not (then
// every part, or every message, keeps to the wire, as it says, and those
// tests have nothing to test).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>
#include <string>

#include "messaging/shm_ring.hpp"

namespace asgd::messaging::testing {

// Whether a process may create POSIX shared memory here (a container
// without /dev/shm may not).
inline bool shm_usable() {
  const std::string name = "/asgd-probe-" + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return false;
  close(fd);
  shm_unlink(name.c_str());
  return true;
}

// Whether a process may bind a doorbell (a Unix datagram socket in the
// abstract namespace) here: without one, messages keep to the wire and
// only large parts go through shared memory.
inline bool bell_usable() {
  std::mt19937_64 rng(std::random_device{}());
  return shm_detail::make_bell(rng).has_value();
}

}  // namespace asgd::messaging::testing

#define ASGD_REQUIRE_SHARED_MEMORY()                            \
  if (!::asgd::messaging::testing::shm_usable()) GTEST_SKIP() \
      << "no POSIX shared memory here (/dev/shm)"

#define ASGD_REQUIRE_RINGS()                                     \
  ASGD_REQUIRE_SHARED_MEMORY();                                  \
  if (!::asgd::messaging::testing::bell_usable()) GTEST_SKIP() \
      << "no abstract Unix sockets here: no rings"
