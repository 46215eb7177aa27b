// A shard process's allocator (runtime/cluster_internal.hpp).
#include <malloc.h>

#include <cstdlib>
#include <limits>
#include <vector>

#include "runtime/cluster_internal.hpp"

namespace asgd::cluster_detail {

namespace {

// A shard process's memory is mostly push buffers (a push is the size of
// its key range; ZeroMQ's I/O thread allocates each, and frees it once the
// reply written over it has been sent), and the queue bounds of
// runtime/cluster.cpp (kShardReceiveQueue, kShardSendQueue, ...) cap how many
// are alive at once. Left to itself, glibc hands freed buffers back to the
// kernel and faults them in again for the next burst, and gives each thread
// its own heap: under overload, resident memory climbs in steps, to the
// level the bounds allow, whenever a burst fills every queue further than
// before, which may take minutes. Instead the process takes that memory
// when it is assigned its keys and keeps it: one heap for every thread,
// buffers up to 32 MiB from it, never trimmed, grown at once to what the
// bounds allow (up to 1 GiB; beyond, it grows as the queues fill, to the
// same bound). Process-wide settings: a shard process is a process of its
// own.
constexpr int kHeapBuffersUpTo = 32 << 20;
constexpr std::size_t kMaxReserve = std::size_t{1} << 30;

}  // namespace

void configure_shard_allocator() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, kHeapBuffersUpTo);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

void reserve_push_buffers(std::size_t push_bytes, std::size_t buffers) {
  if (push_bytes == 0 || push_bytes > kHeapBuffersUpTo || buffers * push_bytes > kMaxReserve) return;
  std::vector<void*> blocks(buffers, nullptr);
  for (void*& b : blocks) {
    b = std::malloc(push_bytes);
    if (b == nullptr) break;
    for (std::size_t i = 0; i < push_bytes; i += 4096) static_cast<volatile char*>(b)[i] = 0;  // resident now
  }
  for (void* b : blocks) std::free(b);
}

}  // namespace asgd::cluster_detail
