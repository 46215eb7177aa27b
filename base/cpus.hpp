#pragma once
// The CPUs this process may compute on, for a job's thread budgets: the
// ones its affinity mask allows (taskset, Slurm's and mpirun's binding, a
// cpuset cgroup), no more than a CPU bandwidth limit on its control group
// allows (a container's CPU limit: cgroup v2's cpu.max, v1's
// cpu.cfs_quota_us). std::thread::hardware_concurrency() counts the host's
// CPUs and sees neither.

#include <filesystem>
#include <string>
#include <vector>

namespace asgd {

/// The CPUs this process may use: affinity_cpus(), capped by its control
/// group's CPU limit when it has one (read at the first call). At least 1.
unsigned usable_cpus();

/// The numbers of the CPUs the calling thread's affinity mask allows, in
/// increasing order; empty where the mask cannot be read.
std::vector<unsigned> allowed_cpus();

/// How many CPUs the calling thread's affinity mask allows (the host's
/// count where the mask cannot be read). At least 1.
unsigned affinity_cpus();

/// A control group's CPU limit.
struct CgroupCpuLimit {
  unsigned cpus = 0;            ///< whole CPUs, rounded up; 0: no limit
  std::filesystem::path group;  ///< the group's folder that sets it
};

/// The CPU limit that the control groups named in `proc_self_cgroup` (the
/// text of /proc/self/cgroup) set under `root` (where the cgroup file
/// systems are mounted, /sys/fs/cgroup): the lowest quota / period of the
/// group and its ancestors, cgroup v2 (cpu.max) or v1 (the cpu controller's
/// cpu.cfs_quota_us and cpu.cfs_period_us). None when no group sets one, or
/// none can be read.
CgroupCpuLimit cgroup_cpu_limit(const std::string& proc_self_cgroup, const std::filesystem::path& root);

/// Names the CPUs this process competes for: the running kernel's boot id
/// (one per machine or VM, shared by its containers), the calling thread's
/// affinity mask and, when a control group's CPU limit caps them, that
/// group (a container's own). Processes with the same key compute on the
/// same CPUs; processes on other hosts, bound to other CPUs, or in other
/// CPU-limited containers have other keys.
std::string cpu_set_key();

/// Whether processes with keys `a` and `b` (cpu_set_key()) compete for a
/// CPU: the same machine and control group, and masks that share a CPU
/// (two processes bound to CPUs 0-1 and 1, or one unbound and one bound).
/// Keys that cannot be read that way overlap only when equal.
bool cpu_keys_overlap(const std::string& a, const std::string& b);

}  // namespace asgd
