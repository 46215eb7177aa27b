// Launcher detection, roles by rank and Slurm host lists, from environments
// the tests write (runtime/launcher.hpp).

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/launcher.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

using Hosts = std::vector<std::string>;

// The patterns and what Slurm makes of them.
const std::vector<std::pair<std::string, Hosts>>& host_lists() {
  static const std::vector<std::pair<std::string, Hosts>> lists = {
      {"node01", {"node01"}},
      {"a,b,c", {"a", "b", "c"}},
      {"node[1-3]", {"node1", "node2", "node3"}},
      {"node[01-03]", {"node01", "node02", "node03"}},
      {"node[08-11]", {"node08", "node09", "node10", "node11"}},
      {"node[001-002]", {"node001", "node002"}},
      {"node[1,3,5]", {"node1", "node3", "node5"}},
      {"node[1-2,7]", {"node1", "node2", "node7"}},
      {"node[01-04,07],gpu-a[1-2]", {"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"}},
      {"gpu-a[1-2],login", {"gpu-a1", "gpu-a2", "login"}},
      {"rack[1-2]-n[1-2]", {"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
      {"n[9-10]", {"n9", "n10"}},
      {"n[09-10]", {"n09", "n10"}},
      {"n[98-101]", {"n98", "n99", "n100", "n101"}},
      {"n[5]", {"n5"}},
      {"a[1-2]b[3-4]", {"a1b3", "a1b4", "a2b3", "a2b4"}},
      {"a,,b", {"a", "b"}},
      {"a[1-2],b[3-4]", {"a1", "a2", "b3", "b4"}},
      {"c1-[1-2]", {"c1-1", "c1-2"}},
      {"host.example.org", {"host.example.org"}},
      {"x[1-2],y,z[07-08]", {"x1", "x2", "y", "z07", "z08"}},
      {"node[1-1]", {"node1"}},
      {"n[0001-0003]", {"n0001", "n0002", "n0003"}},
  };
  return lists;
}

TEST(Launcher, HostListsExpandAsSlurmDoes) {
  ASSERT_GE(host_lists().size(), 20u);
  for (const auto& [list, hosts] : host_lists()) {
    auto got = expand_hostlist(list);
    ASSERT_TRUE(got.ok()) << list << ": " << got.status().to_string();
    EXPECT_EQ(*got, hosts) << list;
  }
}

// Where Slurm is installed, its own expansion is the reference (scontrol
// reads a configuration first: a minimal one, written here).
TEST(Launcher, HostListsAgreeWithScontrolWhereSlurmIsInstalled) {
  if (std::system("command -v scontrol >/dev/null 2>&1") != 0) GTEST_SKIP() << "scontrol is not installed";
  const asgd_test::TempDir dir("_slurm");
  const std::string conf = (dir / "slurm.conf").string();
  {
    std::ofstream out(conf);
    out << "ClusterName=asgdtest\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n";
  }
  for (const auto& [list, hosts] : host_lists()) {
    const std::string cmd = "SLURM_CONF='" + conf + "' scontrol show hostnames '" + list + "' 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    Hosts slurm;
    char line[512];
    while (std::fgets(line, sizeof line, p)) {
      std::string h(line);
      while (!h.empty() && (h.back() == '\n' || h.back() == '\r')) h.pop_back();
      if (!h.empty()) slurm.push_back(h);
    }
    ::pclose(p);
    EXPECT_EQ(*expand_hostlist(list), slurm) << list;
  }
}

TEST(Launcher, MalformedHostListsAreRefusedNamingTheList) {
  for (const char* bad : {"node[1-3", "node1-3]", "node[3-1]", "node[]", "node[a-b]", "n[1-2]x", "node[1-]"}) {
    auto got = expand_hostlist(bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_NE(got.status().message().find(bad), std::string::npos) << got.status().message();
  }
}

TEST(Launcher, EachLauncherIsReadFromItsOwnVariables) {
  auto slurm = detect_launch({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "1"},
                              {"SLURM_JOB_NODELIST", "node[07-08]"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}},
                             "auto");
  ASSERT_TRUE(slurm.ok()) << slurm.status().to_string();
  EXPECT_EQ(slurm->kind, LauncherKind::slurm);
  EXPECT_EQ(slurm->rank, 3u);
  EXPECT_EQ(slurm->world_size, 5u);
  EXPECT_EQ(slurm->local_rank, 1u);
  EXPECT_EQ(slurm->hosts, (Hosts{"node07", "node08"}));
  EXPECT_EQ(slurm->coordinator, "tcp://node07:" + std::to_string(port_for_job("4242.0")));
  EXPECT_EQ(slurm->port_from, "derived from SLURM_JOB_ID=4242 and SLURM_STEP_ID=0");
  // A step on part of the allocation: rank 0 is on the step's first node.
  auto step = detect_launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_JOB_NODELIST", "node[01-02]"},
                             {"SLURM_STEP_NODELIST", "node02"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "1"}},
                            "auto");
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  EXPECT_EQ(step->coordinator, "tcp://node02:" + std::to_string(port_for_job("4242.1")));
  EXPECT_NE(port_for_job("4242.1"), port_for_job("4242.0")) << "two steps of one job at once";
  EXPECT_TRUE(slurm->rank_hosts.empty()) << "without SLURM_TASKS_PER_NODE, where the ranks are is unknown";
  auto placed = detect_launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
                               {"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}},
                              "auto");
  ASSERT_TRUE(placed.ok()) << placed.status().to_string();
  EXPECT_EQ(placed->rank_hosts, (Hosts{"n1", "n1", "n2", "n2", "n3"})) << "block distribution";
  EXPECT_EQ(*parse_tasks_per_node("3"), (std::vector<std::uint32_t>{3}));
  EXPECT_FALSE(parse_tasks_per_node("2(x").ok());
  EXPECT_FALSE(parse_tasks_per_node("").ok());
  EXPECT_EQ(detect_launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_JOB_NODELIST", "n1"},
                           {"SLURM_JOB_ID", "1"}, {"SLURM_STEP_ID", "0"}},
                          "auto", 31000)
                ->coordinator,
            "tcp://n1:31000")
      << "--port wins over the job id's";

  auto mpi = detect_launch({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "5"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}},
                           "auto");
  ASSERT_TRUE(mpi.ok()) << mpi.status().to_string();
  EXPECT_EQ(mpi->kind, LauncherKind::mpi);
  EXPECT_EQ(mpi->rank, 2u);
  EXPECT_EQ(mpi->coordinator, "") << "MPI does not say where rank 0 is: a rendezvous file or ASGD_COORDINATOR does";
  EXPECT_EQ(detect_launch({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}}, "auto")->world_size, 3u);
  EXPECT_EQ(detect_launch({{"PMIX_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, "auto")->world_size, 4u);

  auto k8s = detect_launch({{"JOB_COMPLETION_INDEX", "4"}, {"ASGD_WORLD_SIZE", "5"},
                            {"ASGD_COORDINATOR", "tcp://train-0.train:29500"}},
                           "auto");
  ASSERT_TRUE(k8s.ok()) << k8s.status().to_string();
  EXPECT_EQ(k8s->kind, LauncherKind::kubernetes);
  EXPECT_EQ(k8s->rank, 4u);
  EXPECT_EQ(k8s->coordinator, "tcp://train-0.train:29500");

  auto torch = detect_launch({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.5"},
                              {"MASTER_PORT", "29500"}},
                             "auto");
  ASSERT_TRUE(torch.ok()) << torch.status().to_string();
  EXPECT_EQ(torch->kind, LauncherKind::torchrun);
  EXPECT_EQ(torch->coordinator, "tcp://10.0.0.5:29500");

  auto own = detect_launch({{"ASGD_RANK", "0"}, {"ASGD_WORLD_SIZE", "5"}, {"ASGD_COORDINATOR", "tcp://h:1"},
                            {"SLURM_PROCID", "3"}},
                           "auto");
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->kind, LauncherKind::env) << "ASGD_* come first";
  // mpirun inside a Slurm allocation: its ranks inherit the batch script's SLURM_PROCID.
  auto mpi_in_slurm = detect_launch({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                     {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "5"}},
                                    "auto");
  ASSERT_TRUE(mpi_in_slurm.ok()) << mpi_in_slurm.status().to_string();
  EXPECT_EQ(mpi_in_slurm->kind, LauncherKind::mpi);
  EXPECT_EQ(mpi_in_slurm->rank, 1u);
  EXPECT_EQ(detect_launch({}, "auto")->kind, LauncherKind::local);
  EXPECT_EQ(detect_launch({{"SLURM_PROCID", "3"}}, "local")->kind, LauncherKind::local) << "--launcher local wins";
}

// From the launcher audit (2026-11-29).
TEST(Launcher, TorchrunsAgentStoreMpiexecInSlurmAndRunIdsThatTellRunsApart) {
  const Environment torch = {{"RANK", "0"},         {"WORLD_SIZE", "5"},
                             {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "29500"},
                             {"TORCHELASTIC_RUN_ID", "none"}};
  auto plain = detect_launch(torch, "auto");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->coordinator, "tcp://h0:29500");
  EXPECT_EQ(plain->port_from, "MASTER_PORT=29500");
  // torchrun's default run id is "none" for every run: the meeting point names it.
  EXPECT_EQ(plain->run_id, "MASTER_ADDR:MASTER_PORT=h0:29500");
  // Static rendezvous: torchrun's agent listens on MASTER_PORT itself.
  Environment agent = torch;
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  auto derived = detect_launch(agent, "auto");
  ASSERT_TRUE(derived.ok()) << derived.status().to_string();
  EXPECT_EQ(derived->coordinator, "tcp://h0:" + std::to_string(port_for_job("torchrun h0:29500 none")));
  EXPECT_NE(derived->coordinator, "tcp://h0:29500");
  EXPECT_NE(derived->port_from.find("torchrun's agent holds MASTER_PORT"), std::string::npos) << derived->port_from;
  EXPECT_EQ(detect_launch(agent, "auto", 31000)->coordinator, "tcp://h0:31000") << "--port wins";
  EXPECT_EQ(detect_launch(agent, "auto", 31000)->port_from, "given with --port");
  // MPICH's mpiexec inside a Slurm job: its proxies' step says 1 task.
  auto hydra = detect_launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"},
                              {"SLURM_JOB_ID", "7"}, {"SLURM_STEP_NODELIST", "n1"}, {"PMI_RANK", "3"},
                              {"PMI_SIZE", "5"}},
                             "auto");
  ASSERT_TRUE(hydra.ok()) << hydra.status().to_string();
  EXPECT_EQ(hydra->kind, LauncherKind::mpi);
  EXPECT_EQ(hydra->rank, 3u);
  EXPECT_EQ(hydra->world_size, 5u);
  // srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE to Slurm's own: still Slurm.
  auto pmi2 = detect_launch({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "5"}, {"SLURM_STEP_ID", "0"},
                             {"SLURM_JOB_ID", "7"}, {"SLURM_STEP_NODELIST", "n1"}, {"PMI_RANK", "2"},
                             {"PMI_SIZE", "5"}},
                            "auto");
  ASSERT_TRUE(pmi2.ok()) << pmi2.status().to_string();
  EXPECT_EQ(pmi2->kind, LauncherKind::slurm);
  // Older Slurm spells the step SLURM_STEPID: the run id has it.
  auto old_slurm = detect_launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_STEPID", "3"},
                                  {"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n1"}},
                                 "auto");
  ASSERT_TRUE(old_slurm.ok()) << old_slurm.status().to_string();
  EXPECT_EQ(old_slurm->run_id, "SLURM_JOB_ID=7 SLURM_STEPID=3");
  // One rank (srun -n 1, srun --pty): the way on is --launcher local.
  Launch one = *plain;
  one.world_size = 1;
  auto lone = role_of_rank(one, 1, 2);
  ASSERT_FALSE(lone.ok());
  EXPECT_NE(lone.status().message().find("or give --launcher local"), std::string::npos) << lone.status().message();
}

TEST(Launcher, MissingOrBadVariablesAreOneLineErrorsNamingThem) {
  auto expect_error = [](const Environment& env, const std::string& wanted, const std::string& names) {
    auto got = detect_launch(env, wanted);
    ASSERT_FALSE(got.ok()) << names;
    EXPECT_EQ(got.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(got.status().message().find(names), std::string::npos) << got.status().message();
  };
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}}, "auto", "SLURM_NTASKS is not set");
  expect_error({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}}, "auto",
               "SLURM_PROCID=x: expected a whole number");
  expect_error({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "5"}, {"SLURM_STEP_ID", "0"}}, "auto",
               "SLURM_PROCID=5 is not below SLURM_NTASKS=5");
  // asgd cluster in a batch script (sbatch --wrap): SLURM_PROCID=0 but no
  // step; it waited out --join-timeout for ranks that never come.
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "n1"}, {"SLURM_JOB_ID", "5"}},
               "auto", "SLURM_STEP_ID is not set: this is a batch script, not a task of an srun step");
  expect_error({{"ASGD_RANK", "0"}, {"ASGD_WORLD_SIZE", "2"}}, "auto", "ASGD_COORDINATOR is not set");
  // A bad ASGD_COORDINATOR, refused alike on every rank (a worker rank took port 99999 and waited).
  for (const char* rank : {"0", "2"}) {
    expect_error({{"JOB_COMPLETION_INDEX", rank}, {"ASGD_WORLD_SIZE", "4"}, {"ASGD_COORDINATOR", "tcp://127.0.0.1:99999"}},
                 "auto", "launcher kubernetes: ASGD_COORDINATOR tcp://127.0.0.1:99999: expected tcp://HOST:PORT");
    expect_error({{"JOB_COMPLETION_INDEX", rank}, {"ASGD_WORLD_SIZE", "4"}, {"ASGD_COORDINATOR", "pod-0:29500"}},
                 "auto", "ASGD_COORDINATOR pod-0:29500: expected tcp://HOST:PORT");
  }
  // MASTER_PORT past a port: named (rank 0 blamed ASGD_COORDINATOR, which was not set, and the others waited).
  for (const char* rank : {"0", "3"})
    expect_error({{"RANK", rank}, {"WORLD_SIZE", "5"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "99999"}}, "auto",
                 "launcher torchrun: MASTER_PORT=99999 is not a port (1 to 65535)");
  expect_error({}, "slurm", "launcher slurm: SLURM_PROCID is not set");
  expect_error({}, "mpi", "launcher mpi: none of OMPI_COMM_WORLD_RANK, PMIX_RANK and PMI_RANK is set");
  expect_error({}, "pbs", "--launcher pbs: expected auto, local, env, slurm, mpi, kubernetes or torchrun");
}

TEST(Launcher, RanksTakeRolesAndAWrongWorldSizeSaysWhatWouldFit) {
  Launch l;
  l.kind = LauncherKind::slurm;
  l.world_size = 5;
  const std::vector<std::pair<RankRole, std::uint32_t>> expected = {
      {RankRole::coordinator, 0}, {RankRole::shard, 0}, {RankRole::shard, 1}, {RankRole::worker, 0},
      {RankRole::worker, 1}};
  for (std::uint32_t r = 0; r < 5; ++r) {
    l.rank = r;
    auto role = role_of_rank(l, 2, 2);
    ASSERT_TRUE(role.ok()) << role.status().to_string();
    EXPECT_EQ(role->role, expected[r].first) << "rank " << r;
    EXPECT_EQ(role->index, expected[r].second) << "rank " << r;
  }
  auto wrong = role_of_rank(l, 2, 3);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("5 ranks, but 1 coordinator, 2 shards and 3 workers take 6; with these "
                                          "ranks give --workers 2"),
            std::string::npos)
      << wrong.status().message();
}

TEST(Launcher, PortsAndAddressesEveryRankDerivesAlike) {
  EXPECT_EQ(port_for_job("123456"), port_for_job("123456"));
  EXPECT_NE(port_for_job("123456"), port_for_job("123457"));
  for (const char* id : {"1", "99", "123456", "abc", "49.0"}) {
    EXPECT_GE(port_for_job(id), 10000);
    EXPECT_LT(port_for_job(id), 30000) << "below Linux's ephemeral ports";
  }
  auto local = address_towards("127.0.0.1");
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  EXPECT_EQ(*local, "127.0.0.1");
  EXPECT_FALSE(address_towards("no-such-host.invalid").ok());
  auto split = split_tcp_endpoint("tcp://node07:31000");
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->first, "node07");
  EXPECT_EQ(split->second, 31000);
  EXPECT_FALSE(split_tcp_endpoint("node07:31000").ok());
  EXPECT_FALSE(split_tcp_endpoint("tcp://node07:0").ok());
  auto lo = interface_address("lo");
  ASSERT_TRUE(lo.ok()) << lo.status().to_string();
  EXPECT_EQ(*lo, "127.0.0.1");
  auto none = interface_address("nosuch0");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find(" lo"), std::string::npos) << "names the interfaces there are: "
                                                                  << none.status().message();
}

}  // namespace
}  // namespace asgd
