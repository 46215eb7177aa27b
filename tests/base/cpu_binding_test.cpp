// base/cpu_binding.hpp: CPU lists as the kernel writes them, binding a
// thread to some of its CPUs, and splitting CPUs among worker processes;
// base/cpus.hpp's cpu_keys_overlap, which tells the workers whose CPUs
// overlap apart from those on other CPUs.

#include "base/cpu_binding.hpp"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "base/cpus.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

using Cpus = std::vector<unsigned>;
namespace fs = std::filesystem;

TEST(CpuBinding, ReadsListsOfNumbersAndRangesAndWritesThemBackShort) {
  EXPECT_EQ(parse_cpu_list("0").value(), (Cpus{0}));
  EXPECT_EQ(parse_cpu_list("0-3,8").value(), (Cpus{0, 1, 2, 3, 8}));
  EXPECT_EQ(parse_cpu_list("8,2-3,3,0").value(), (Cpus{0, 2, 3, 8})) << "sorted, without repeats";
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(format_cpu_list({0, 1, 5, 6, 7, 9}), "0,1,5-7,9");
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* list : {"0-3,8", "0,1,5-7,9", "12"})
    EXPECT_EQ(format_cpu_list(parse_cpu_list(list).value()), list);
}

TEST(CpuBinding, RefusesWhatIsNotACpuListNamingThePart) {
  for (const auto& [list, part] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"1-x", "'1-x'"}, {"3-1", "'3-1'"}, {"0,,1", "''"}, {"0,", "''"}, {"-1", "'-1'"},
           {"a", "'a'"}, {"99999", "'99999'"}, {" 1", "' 1'"}}) {
    auto r = parse_cpu_list(list);
    ASSERT_FALSE(r.ok()) << list;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  }
}

TEST(CpuBinding, SplitsCpusIntoEvenBlocksInOrderOrNotAtAllWhenTooFew) {
  const fs::path none = "/nonexistent-topology";  // no topology: each CPU a core of its own
  EXPECT_EQ(split_cpus({0, 1}, 2, none), (std::vector<Cpus>{{0}, {1}}));
  EXPECT_EQ(split_cpus({0, 1, 2, 3, 4}, 2, none), (std::vector<Cpus>{{0, 1, 2}, {3, 4}}));
  EXPECT_EQ(split_cpus({2, 5, 6, 9}, 3, none), (std::vector<Cpus>{{2, 5}, {6}, {9}}));
  EXPECT_TRUE(split_cpus({0, 1}, 3, none).empty()) << "3 workers cannot each have a CPU of 2";
  EXPECT_TRUE(split_cpus({0, 1}, 0, none).empty());
  EXPECT_TRUE(split_cpus({}, 1, none).empty());
}

// Two packages of two cores of two hardware threads, numbered as Linux
// numbers them: CPUs 0-3 the first thread of each core, 4-7 their siblings.
void write_smt_topology(const fs::path& root) {
  for (unsigned cpu = 0; cpu < 8; ++cpu) {
    const fs::path dir = root / ("cpu" + std::to_string(cpu)) / "topology";
    fs::create_directories(dir);
    std::ofstream(dir / "physical_package_id") << (cpu % 4) / 2 << "\n";
    std::ofstream(dir / "core_id") << cpu % 2 << "\n";  // core ids repeat across packages
  }
}

TEST(CpuBinding, KeepsACoresHardwareThreadsAndAPackagesCoresTogether) {
  const asgd_test::TempDir dir;
  write_smt_topology(dir.path());
  const Cpus all = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(cores_of(all, dir.path()), (std::vector<Cpus>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // By number the halves would be 0-3 and 4-7: every core shared by both.
  EXPECT_EQ(split_cpus(all, 2, dir.path()), (std::vector<Cpus>{{0, 1, 4, 5}, {2, 3, 6, 7}})) << "one package each";
  EXPECT_EQ(split_cpus(all, 4, dir.path()), (std::vector<Cpus>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(split_cpus(all, 3, dir.path()), (std::vector<Cpus>{{0, 1, 4, 5}, {2, 6}, {3, 7}}));
  // More processes than cores: single CPUs, a core's next to each other.
  EXPECT_EQ(split_cpus(all, 8, dir.path()), (std::vector<Cpus>{{0}, {4}, {1}, {5}, {2}, {6}, {3}, {7}}));
  // Part of the machine (a cpuset): the cores it touches.
  EXPECT_EQ(split_cpus({1, 2, 5, 6}, 2, dir.path()), (std::vector<Cpus>{{1, 5}, {2, 6}}));
  // A CPU without topology (cpu9) counts as a core of its own, after the others.
  EXPECT_EQ(cores_of({0, 4, 9}, dir.path()), (std::vector<Cpus>{{0, 4}, {9}}));
}

// A thread that is there before the binding, as OpenBLAS's are (started
// as the library loads): its id, and it waits until told to end.
struct EarlierThread {
  EarlierThread() {
    thread = std::thread([this] {
      tid = static_cast<pid_t>(::syscall(SYS_gettid));
      std::unique_lock lock(mu);
      cv.notify_all();
      cv.wait(lock, [this] { return done; });
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [this] { return tid != 0; });
  }
  ~EarlierThread() {
    {
      std::lock_guard lock(mu);
      done = true;
    }
    cv.notify_all();
    thread.join();
  }
  Cpus cpus() const {
    cpu_set_t set;
    CPU_ZERO(&set);
    Cpus out;
    if (sched_getaffinity(tid, sizeof set, &set) == 0)
      for (unsigned c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
  }
  std::mutex mu;
  std::condition_variable cv;
  pid_t tid = 0;
  bool done = false;
  std::thread thread;
};

// The process's CPUs and scheduling put back for the tests after.
void restore(const Cpus& cpus, const EarlierThread& earlier) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned c : cpus) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof set, &set);
  sched_setaffinity(earlier.tid, sizeof set, &set);
  const sched_param none{};
  sched_setscheduler(0, SCHED_OTHER, &none);
  sched_setscheduler(earlier.tid, SCHED_OTHER, &none);
}

// Every thread of the process: the log said "every thread" while a
// library's thread started before kept every CPU.
TEST(CpuBinding, BindsEveryThreadOfTheProcessOrSaysWhichCpusItMayNotUse) {
  const Cpus allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  EarlierThread earlier;
  std::thread t([&] {
    ASSERT_TRUE(bind_to_cpus({allowed.back()}).ok());
    EXPECT_EQ(allowed_cpus(), (Cpus{allowed.back()}));
    Cpus inherited;
    std::thread([&] { inherited = allowed_cpus(); }).join();
    EXPECT_EQ(inherited, (Cpus{allowed.back()})) << "a thread started afterwards";
    // Bound, it may no longer use the others.
    if (allowed.size() > 1) {
      const Status s = bind_to_cpus({allowed.front()});
      EXPECT_EQ(s.code(), StatusCode::invalid_argument);
      EXPECT_NE(s.message().find("CPU " + std::to_string(allowed.front()) + " is not among the CPUs this process "
                                 "may use (" + std::to_string(allowed.back()) + ")"),
                std::string::npos)
          << s.message();
    }
    EXPECT_FALSE(bind_to_cpus({}).ok());
  });
  t.join();
  EXPECT_EQ(allowed_cpus(), (Cpus{allowed.back()})) << "the test's own thread, running before";
  EXPECT_EQ(earlier.cpus(), (Cpus{allowed.back()})) << "a thread started before";
  restore(allowed, earlier);
}

TEST(CpuBinding, BatchSchedulingHoldsForEveryThreadOfTheProcess) {
  EarlierThread earlier;
  EXPECT_FALSE(batch_scheduled()) << "the test's own thread runs as it was started";
  std::thread t([] {
    ASSERT_TRUE(use_batch_scheduling().ok());
    EXPECT_TRUE(batch_scheduled());
    bool inherited = false;
    std::thread([&] { inherited = batch_scheduled(); }).join();
    EXPECT_TRUE(inherited) << "a thread started afterwards";
  });
  t.join();
  EXPECT_TRUE(batch_scheduled()) << "the test's own thread, running before";
  EXPECT_EQ(sched_getscheduler(earlier.tid), SCHED_BATCH) << "a thread started before";
  restore(allowed_cpus(), earlier);
}

TEST(CpuBinding, KeysOverlapOnTheSameMachineWhenTheirMasksShareACpu) {
  EXPECT_TRUE(cpu_keys_overlap("boot/3", "boot/3"));
  EXPECT_TRUE(cpu_keys_overlap("boot/3", "boot/2")) << "CPUs 0-1 and CPU 1";
  EXPECT_FALSE(cpu_keys_overlap("boot/1", "boot/2")) << "CPU 0 and CPU 1";
  EXPECT_TRUE(cpu_keys_overlap("boot/all", "boot/2"));
  EXPECT_FALSE(cpu_keys_overlap("boot/100", "boot/1")) << "CPU 8 and CPU 0";
  EXPECT_TRUE(cpu_keys_overlap("boot/101", "boot/1")) << "CPUs 0 and 8, and CPU 0";
  EXPECT_FALSE(cpu_keys_overlap("boot/3", "other/3")) << "another machine";
  EXPECT_FALSE(cpu_keys_overlap("boot/cgroup-1-2/3", "boot/3")) << "a CPU-limited container of its own";
  EXPECT_FALSE(cpu_keys_overlap("", "boot/3"));
  EXPECT_FALSE(cpu_keys_overlap("boot/3x", "boot/3y")) << "not hex: only equal keys overlap";
  // This process's own key against a thread bound to one of its CPUs.
  const std::string mine = cpu_set_key();
  std::string bound;
  std::thread([&] {
    if (bind_to_cpus({allowed_cpus().front()}).ok()) bound = cpu_set_key();
  }).join();
  ASSERT_FALSE(bound.empty());
  EXPECT_TRUE(cpu_keys_overlap(mine, bound));
}

}  // namespace
}  // namespace asgd
