#pragma once
// Binding a process to some of its CPUs: `asgd worker --cpus LIST` and
// `asgd shard --cpus LIST`, and the sets `asgd cluster` gives its worker
// processes when each can have CPUs of its own (docs/cluster.md, "CPUs").
// Lists are written as the kernel writes them (cpuset, taskset -c):
// "0-3,8,10-11".

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

/// The CPUs a list names, in increasing order without repeats; an
/// InvalidArgument error naming the part that is not a CPU number or range.
Result<std::vector<unsigned>> parse_cpu_list(std::string_view text);

/// `cpus` (increasing) as a list: runs of three or more as ranges, "0-3,8".
std::string format_cpu_list(const std::vector<unsigned>& cpus);

/// Binds the process's threads (those running, such as a library's started
/// as it loaded, and so those started afterwards) to `cpus`; each must be
/// one it may use now (allowed_cpus()), else an InvalidArgument error
/// names those that are not and the ones it may. Call it before a process
/// starts threads of its own.
Status bind_to_cpus(const std::vector<unsigned>& cpus);

/// Puts the process's threads, and every thread started afterwards, under
/// Linux's SCHED_BATCH: the same share of the CPU as before, but its
/// wake-ups do not preempt the thread running on its CPU. For a process
/// whose threads hand work to each other on CPUs of their own (a worker
/// process of `asgd cluster`). An IOError saying why where it is refused.
Status use_batch_scheduling();

/// Whether the calling thread runs under SCHED_BATCH.
bool batch_scheduled();

/// Where the kernel describes the CPUs' topology.
inline const std::filesystem::path kCpuTopologyRoot = "/sys/devices/system/cpu";

/// The cores `cpus` lie on, each as its CPUs among `cpus` (its hardware
/// threads), in order of package, then core: read from the topology under
/// `root` (cpuN/topology/physical_package_id and core_id). A CPU whose
/// topology cannot be read counts as a core of its own.
std::vector<std::vector<unsigned>> cores_of(const std::vector<unsigned>& cpus,
                                            const std::filesystem::path& root = kCpuTopologyRoot);

/// `allowed` split into `parts` sets, one per process: when there are at
/// least as many cores as parts, whole cores each (a core's hardware
/// threads never go to two processes, which would compete inside it), in
/// blocks of consecutive cores as even as can be (the first ones one
/// larger); else blocks of CPUs in the same order. Empty when there are
/// fewer CPUs than parts, or none.
std::vector<std::vector<unsigned>> split_cpus(const std::vector<unsigned>& allowed, unsigned parts,
                                              const std::filesystem::path& root = kCpuTopologyRoot);

}  // namespace asgd
