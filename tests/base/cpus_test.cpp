// base/cpus.hpp: the CPUs a process may compute on, from its affinity mask
// and its control group's CPU limit (cgroup files written here in the
// layouts the kernel mounts them in).

#include "base/cpus.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <string>
#include <thread>

#include "temp_dir.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

// Runs fn on a thread bound to `cpu` alone; false where it cannot be bound.
template <class Fn>
bool on_one_cpu(int cpu, Fn fn) {
  bool bound = false;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) return;
    bound = true;
    fn();
  });
  t.join();
  return bound;
}

TEST(Cpus, AThreadBoundToOneCpuCountsOneAndNamesOtherCpusThanAnUnboundOne) {
  const unsigned all = affinity_cpus();
  const std::string unbound = cpu_set_key();
  unsigned counted = 0;
  std::string key0, key0_again, key1;
  ASSERT_TRUE(on_one_cpu(0, [&] { counted = affinity_cpus(); key0 = cpu_set_key(); }));
  ASSERT_TRUE(on_one_cpu(0, [&] { key0_again = cpu_set_key(); }));
  EXPECT_EQ(counted, 1u);
  EXPECT_EQ(key0, key0_again);
  if (all > 1) {
    EXPECT_NE(key0, unbound);
    ASSERT_TRUE(on_one_cpu(1, [&] { key1 = cpu_set_key(); }));
    EXPECT_NE(key0, key1);
  }
  // The same machine either way: the keys share the boot id before the mask.
  EXPECT_EQ(key0.substr(0, key0.find('/')), unbound.substr(0, unbound.find('/')));
  EXPECT_GE(usable_cpus(), 1u);
  EXPECT_LE(usable_cpus(), all);
}

TEST(Cpus, ACgroupV2CpuMaxLimitsToItsQuotaRoundedUpAndAnAncestorsLowerOneWins) {
  const asgd_test::TempDir dir;
  const fs::path root = dir.path();
  write(root / "cgroup.controllers", "cpuset cpu io memory pids");
  write(root / "kubepods/cpu.max", "250000 100000");  // 2.5 CPUs: 3 threads' worth
  write(root / "kubepods/pod1/cpu.max", "max 100000");
  write(root / "kubepods/pod1/c1/cpu.max", "600000 100000");
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/c1\n", root).cpus, 3u);
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/c1\n", root).group, root / "kubepods") << "the group that sets it";
  write(root / "kubepods/cpu.max", "max 100000");
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1/c1\n", root).cpus, 6u);
  EXPECT_EQ(cgroup_cpu_limit("0::/kubepods/pod1\n", root).cpus, 0u) << "no limit";
  // A path from another namespace's view: the mount's own group counts.
  write(root / "cpu.max", "200000 100000");
  EXPECT_EQ(cgroup_cpu_limit("0::/elsewhere/job\n", root).cpus, 2u);
}

TEST(Cpus, ACgroupV1QuotaCountsAndMinusOneIsNoLimit) {
  const asgd_test::TempDir dir;
  const fs::path root = dir.path();
  const fs::path cpu = root / "cpu,cpuacct";
  write(cpu / "cpu.cfs_quota_us", "-1");
  write(cpu / "cpu.cfs_period_us", "100000");
  write(cpu / "slurm/job_7/cpu.cfs_quota_us", "-1");
  write(cpu / "slurm/job_7/cpu.cfs_period_us", "100000");
  const std::string self = "12:memory:/slurm/job_7\n4:cpu,cpuacct:/slurm/job_7\n0::/\n";
  EXPECT_EQ(cgroup_cpu_limit(self, root).cpus, 0u);
  write(cpu / "slurm/job_7/cpu.cfs_quota_us", "50000");  // half a CPU: one thread
  EXPECT_EQ(cgroup_cpu_limit(self, root).cpus, 1u);
  write(cpu / "slurm/cpu.cfs_quota_us", "400000");
  write(cpu / "slurm/cpu.cfs_period_us", "100000");
  write(cpu / "slurm/job_7/cpu.cfs_quota_us", "1000000");
  EXPECT_EQ(cgroup_cpu_limit(self, root).cpus, 4u) << "the parent's 4 CPUs, below the group's 10";
  EXPECT_EQ(cgroup_cpu_limit(self, root).group, cpu / "slurm");
}

TEST(Cpus, NoCgroupFilesOrUnreadableOnesSetNoLimit) {
  const asgd_test::TempDir dir;
  EXPECT_EQ(cgroup_cpu_limit("", dir.path()).cpus, 0u);
  EXPECT_EQ(cgroup_cpu_limit("garbage\n1:cpu:/x\n0::/y\n", dir.path()).cpus, 0u);
  write(dir.path() / "cgroup.controllers", "cpu");
  write(dir.path() / "cpu.max", "lots of CPUs");
  EXPECT_EQ(cgroup_cpu_limit("0::/\n", dir.path()).cpus, 0u);
}

}  // namespace
}  // namespace asgd
