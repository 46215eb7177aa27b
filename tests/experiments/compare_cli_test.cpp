// `asgd compare` as a user runs it: real jobs on MNIST, the files it leaves,
// its exit codes and one-line errors, and Ctrl-C.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/cpus.hpp"
#include "base/folder_lock.hpp"
#include "cli/cli_run.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace {

namespace fs = std::filesystem;
using asgd_test::asgd;
using asgd_test::CliRun;
using asgd_test::expect_one_line_error;
using asgd_test::slurp;

std::vector<std::vector<std::string>> csv_rows(const fs::path& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream s(line);
    for (std::string f; std::getline(s, f, ',');) fields.push_back(f);
    if (!line.empty() && line.back() == ',') fields.emplace_back();
    rows.push_back(fields);
  }
  return rows;
}

std::size_t column(const std::vector<std::string>& header, const std::string& name) {
  const auto it = std::find(header.begin(), header.end(), name);
  EXPECT_NE(it, header.end()) << name;
  return static_cast<std::size_t>(it - header.begin());
}

TEST(CompareCli, RunsEveryPolicyForEveryRepeatAndWritesTheCsvFilesTheReportAndOneMetricsFilePerRun) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --policies bsp,ssp:2,async --repeats 2 --dataset mnist --data-dir " + mnist.string() +
                        " --model mlp --workers 2 --epochs 2 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  // One line per finished run, [k/6].
  for (char k = '1'; k <= '6'; ++k) EXPECT_NE(r.out.find(std::string("[") + k + "/6] "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("report:  " + (out / "report.html").string()), std::string::npos) << r.out;

  const auto results = csv_rows(out / "results.csv");
  ASSERT_EQ(results.size(), 7u) << slurp(out / "results.csv");  // header + 6 runs
  const auto& header = results[0];
  std::multiset<std::string> policies;
  std::set<std::pair<std::string, std::string>> policy_seed;
  for (std::size_t i = 1; i < results.size(); ++i) {
    const auto& row = results[i];
    ASSERT_EQ(row.size(), header.size()) << i;
    policies.insert(row[column(header, "policy")]);
    policy_seed.insert({row[column(header, "policy")], row[column(header, "seed")]});
    EXPECT_EQ(row[column(header, "workers")], "2");
    EXPECT_EQ(row[column(header, "epochs")], "2");
    EXPECT_EQ(row[column(header, "model")], "mlp");
    EXPECT_EQ(row[column(header, "seed")], std::to_string(1 + std::stoi(row[column(header, "repeat")])));
    EXPECT_GT(std::stod(row[column(header, "final_test_accuracy")]), 0.9);
    // The target is chosen from the runs, so every run reached it.
    EXPECT_FALSE(row[column(header, "target_accuracy")].empty());
    EXPECT_FALSE(row[column(header, "time_to_target_s")].empty()) << row[0];
    EXPECT_TRUE(fs::exists(out / "runs" / (row[0] + ".jsonl"))) << row[0];
  }
  EXPECT_EQ(policies, (std::multiset<std::string>{"bsp", "bsp", "ssp:2", "ssp:2", "async", "async"}));
  EXPECT_EQ(policy_seed.size(), 6u);  // seeds 1 and 2 under each policy
  EXPECT_EQ(results[1][column(header, "staleness")], "0");  // bsp
  EXPECT_EQ(results[2][column(header, "staleness")], "2");  // ssp:2
  // Each run's rate, its policy's default: bsp's sums two workers' gradients.
  EXPECT_EQ(results[1][column(header, "lr")], "0.04");  // bsp
  EXPECT_EQ(results[3][column(header, "lr")], "0.02");  // async
  EXPECT_EQ(results[3][column(header, "batch")], "64");

  const auto curves = csv_rows(out / "curves.csv");
  ASSERT_GT(curves.size(), 1u);
  std::map<std::string, int> epochs_per_run;
  for (std::size_t i = 1; i < curves.size(); ++i) {
    const std::string kind = curves[i][column(curves[0], "kind")];
    EXPECT_TRUE(kind == "epoch" || kind == "eval") << kind;
    if (kind == "epoch") ++epochs_per_run[curves[i][0]];
  }
  EXPECT_EQ(epochs_per_run.size(), 6u);
  for (const auto& [run, n] : epochs_per_run) EXPECT_EQ(n, 2) << run;

  const std::string runs_file = slurp(out / "runs" / "ssp:2-w2-r1.jsonl");
  const std::string last = runs_file.substr(runs_file.rfind('\n', runs_file.size() - 2) + 1);
  const auto summary = nlohmann::json::parse(last);
  EXPECT_EQ(summary["event"], "summary");
  EXPECT_EQ(summary["staleness"], 2);

  const std::string report = slurp(out / "report.html");
  EXPECT_NE(report.find("Consistency policies compared"), std::string::npos);
  for (const char* id : {"bsp-w2-r0", "ssp:2-w2-r1", "async-w2-r1"}) EXPECT_NE(report.find(id), std::string::npos) << id;
  EXPECT_NE(report.find("lr 0.04 (bsp), 0.02 (ssp:2, async)"), std::string::npos);
}

// --processes: each run as asgd cluster (a coordinator, a shard and the
// workers as processes), the parameter-server and the decentralized
// policies alike; the same files, read back from each run's metrics.
TEST(CompareCli, RunsEachJobAsProcessesWithProcessesAndRefusesHogwildThere) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --processes --policies bsp,allreduce,gossip:2 --workers 2 --epochs 1 --data-dir " +
                        mnist.string() + " --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto results = csv_rows(out / "results.csv");
  ASSERT_EQ(results.size(), 4u) << slurp(out / "results.csv");
  const auto& header = results[0];
  for (std::size_t i = 1; i < results.size(); ++i) {
    const auto& row = results[i];
    EXPECT_GT(std::stod(row[column(header, "final_test_accuracy")]), 0.9) << row[0];
    EXPECT_GT(std::stod(row[column(header, "samples_per_s")]), 0.0) << row[0];
    EXPECT_FALSE(row[column(header, "time_to_target_s")].empty()) << row[0];
    for (const char* ext : {".jsonl", ".toml", ".log"}) EXPECT_TRUE(fs::exists(out / "runs" / (row[0] + ext))) << row[0] << ext;
  }
  EXPECT_EQ(results[1][column(header, "policy")], "bsp");
  EXPECT_EQ(results[1][column(header, "shards")], "1");
  EXPECT_EQ(results[3][column(header, "staleness")], "2");  // gossip:2
  const auto curves = csv_rows(out / "curves.csv");
  std::map<std::string, int> epochs_per_run;
  for (std::size_t i = 1; i < curves.size(); ++i) epochs_per_run[curves[i][0]] += curves[i][column(curves[0], "kind")] == "epoch";
  EXPECT_EQ(epochs_per_run.size(), 3u);
  for (const auto& [run, n] : epochs_per_run) EXPECT_EQ(n, 1) << run;
  EXPECT_NE(slurp(out / "report.html").find("--processes"), std::string::npos) << "the report's command says how it ran";
  expect_one_line_error(asgd("compare --processes --policies hogwild,async --data-dir " + mnist.string() + " --out " +
                             (dir / "h").string()),
                        2, "hogwild");
}

// A device list gives each worker count its first devices: the study's
// "one device, then two" (here the CPU twice, for want of a GPU), with
// speedup and efficiency against the first.
TEST(CompareCli, ADeviceListGivesEachWorkerCountItsFirstDevices) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --policies async --workers 1,2 --device cpu,cpu --epochs 1 --data-dir " +
                        mnist.string() + " --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string csv = slurp(out / "results.csv");
  EXPECT_NE(csv.find("async-w1-r0,async,,1,1,cpu,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("async-w2-r0,async,,2,1,\"cpu,cpu\","), std::string::npos) << csv;
  EXPECT_NE(r.out.find("2 workers: speedup"), std::string::npos) << r.out;
  // The same folder again: refused, the first comparison left whole.
  expect_one_line_error(asgd("compare --policies bsp --epochs 1 --data-dir " + mnist.string() + " --out " + out.string()),
                        2, "holds an earlier comparison");
  EXPECT_EQ(slurp(out / "results.csv"), csv);
  const std::string data = " --data-dir " + mnist.string() + " --out " + (dir / "bad").string();
  expect_one_line_error(asgd("compare --policies async --workers 1,3 --device cpu,cpu" + data), 2,
                        "--device cpu,cpu: 2 devices for 3 workers");
}

TEST(CompareCli, TheReportSaysHowManyCpusTheRunsHadWhereABindingLeftThemFewerThanTheHost) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  if (asgd::affinity_cpus() < 2) GTEST_SKIP() << "one CPU: no binding leaves fewer";
  if (std::system("taskset -c 0 true >/dev/null 2>&1") != 0) GTEST_SKIP() << "taskset cannot bind to CPU 0 here";
  const asgd_test::TempDir dir;
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --policies async --epochs 1 --data-dir " + mnist.string() + " --out " + out.string(),
                        {}, "taskset -c 0");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string report = slurp(out / "report.html");
  EXPECT_NE(report.find("1 usable CPU of " + std::to_string(std::thread::hardware_concurrency()) + " CPU cores"),
            std::string::npos);
}

TEST(CompareCli, RejectsABadListRepeatsOrFolderWithExitCode2NamingTheValue) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const std::string data = " --data-dir " + mnist.string();
  const std::string out = " --out " + (dir / "out").string();
  expect_one_line_error(asgd("compare --policies bsp,petuum" + data + out), 2, "petuum");
  expect_one_line_error(asgd("compare --policies bsp,,async" + data + out), 2, "--policies bsp,,async");
  expect_one_line_error(asgd("compare --policies ssp:x" + data + out), 2, "ssp:x");
  expect_one_line_error(asgd("compare --policies bsp --repeats 0" + data + out), 2, "--repeats 0");
  expect_one_line_error(asgd("compare --policies bsp --repeats -1" + data + out), 2,
                        "--repeats -1: not a valid R: runs per policy");  // was CLI11's "Could not convert"
  expect_one_line_error(asgd("compare --policies bsp" + data), 2, "--out");
  expect_one_line_error(asgd("compare --policies bsp --workers 1,0" + data + out), 2, "--workers 1,0");
  expect_one_line_error(asgd("compare --policies bsp --metrics-out m.jsonl" + data + out), 2, "--metrics-out");
  std::ofstream(dir / "a-file") << "not a folder";
  const std::string unwritable = (dir / "a-file" / "cmp").string();
  expect_one_line_error(asgd("compare --policies bsp" + data + " --out " + unwritable), 2, "--out " + unwritable);
  expect_one_line_error(asgd("compare --policies ssp,ssp:3" + data + out), 2,
                        "'ssp' and 'ssp:3' are the same policy with the same settings");
  expect_one_line_error(asgd("compare --policies ssp:2,ssp:02" + data + out), 2, "'ssp:2' and 'ssp:02'");
  // A policy's setting no listed policy takes had no effect, exit 0.
  expect_one_line_error(asgd("compare --policies bsp,async --moving-rate 0.5" + data + out), 2,
                        "--moving-rate: applies to --policy easgd only, and --policies bsp,async has none of them");
  expect_one_line_error(asgd("compare --policies bsp,allreduce --staleness-aware-lr true" + data + out), 2,
                        "--staleness-aware-lr: applies to --policy async and ssp only");
  EXPECT_EQ(asgd("compare --policies ssp,ssp:3 --staleness 5 --epochs 0" + data + out).err.find("same policy"),
            std::string::npos);  // ssp:5 and ssp:3 differ (the run is refused for --epochs 0)
  expect_one_line_error(asgd("compare --policies bsp --workers ''" + data + out), 2, "--workers : expected whole numbers");
  expect_one_line_error(asgd("compare --policies bsp --resume " + dir.path().string() + data + out), 2,
                        "compare starts every run from the beginning");
  std::ofstream(dir / "resume.toml") << "resume = \"" << dir.path().string() << "\"\n";
  expect_one_line_error(asgd("compare --policies bsp --config " + (dir / "resume.toml").string() + data + out), 2,
                        "resume.toml: resume = " + dir.path().string() + ": compare starts every run from the beginning");
  // A folder another comparison is writing into (it holds the folder's lock).
  fs::create_directories(dir / "busy");
  {
    auto held = asgd::FolderLock::try_hold(dir / "busy");
    ASSERT_TRUE(held.ok());
    expect_one_line_error(asgd("compare --policies bsp" + data + " --out " + (dir / "busy").string()), 2,
                          "another asgd compare is writing there; give another folder");
  }
  // Found before the comparison's folder is made, not at the first run.
  expect_one_line_error(asgd("compare --policies bsp --checkpoint-dir " + (dir / "a-file").string() + data + out), 2,
                        "--checkpoint-dir " + (dir / "a-file").string() + ": cannot write there");
  EXPECT_FALSE(fs::exists(dir / "out"));  // nothing ran
}

// A config file's settings count as its flags do: a policy's own
// (staleness for ssp) go to the runs of that policy, eval-every 0 stays 0,
// and its policy gives way to --policies.
TEST(CompareCli, AConfigFileSetsWhatItsFlagsWould) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  std::ofstream(dir / "job.toml") << "staleness = 5\neval-every = 0\npolicy = \"bsp\"\nepochs = 1\n";
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --policies ssp --config " + (dir / "job.toml").string() + " --data-dir " +
                        mnist.string() + " --validation-size 1000 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("policy bsp from " + (dir / "job.toml").string() + " is replaced by each policy of --policies"),
            std::string::npos)
      << r.out;
  const auto results = csv_rows(out / "results.csv");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1][column(results[0], "policy")], "ssp");
  EXPECT_EQ(results[1][column(results[0], "staleness")], "5");
  const auto curves = csv_rows(out / "curves.csv");
  for (std::size_t i = 1; i < curves.size(); ++i) EXPECT_EQ(curves[i][column(curves[0], "kind")], "epoch");
}

TEST(CompareCli, AFailingRunExitsWith1AndStillWritesTheFilesSayingTheComparisonIsIncomplete) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path broken = dir / "mnist";
  fs::create_directories(broken);
  for (const auto& e : fs::directory_iterator(mnist)) fs::copy_file(e.path(), broken / e.path().filename());
  for (const auto& e : fs::directory_iterator(broken))
    if (e.path().filename().string().find("train-images") != std::string::npos) fs::resize_file(e.path(), 1000);
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --policies bsp,async --data-dir " + broken.string() + " --out " + out.string());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("asgd: error: run bsp-w2-r0 failed"), std::string::npos) << r.err;
  EXPECT_EQ(csv_rows(out / "results.csv").size(), 1u);  // the header: no run finished
  EXPECT_NE(slurp(out / "report.html").find("Incomplete"), std::string::npos);

  // The same folder is taken again (no run had finished there), and a run
  // that fails for what the user gave, its metrics file a folder, still
  // exits 1: the comparison had started.
  fs::remove(out / "runs" / "bsp-w2-r0.jsonl");
  fs::create_directories(out / "runs" / "bsp-w2-r0.jsonl");
  const CliRun again = asgd("compare --policies bsp --epochs 1 --data-dir " + mnist.string() + " --out " + out.string());
  EXPECT_EQ(again.exit_code, 1) << again.out << again.err;
  EXPECT_NE(again.err.find("asgd: error: run bsp-w2-r0 failed: --metrics-out " + (out / "runs").string()),
            std::string::npos) << again.err;
  EXPECT_EQ(again.err.find("holds an earlier comparison"), std::string::npos) << again.err;
}

// As processes, a failed run says why in the child's words and where its
// output is, once.
TEST(CompareCli, AFailedRunAsProcessesSaysWhyAndNamesItsLog) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path out = dir / "cmp";
  const CliRun r = asgd("compare --processes --policies bsp --epochs 1 --lr 1e6 --data-dir " + mnist.string() +
                        " --out " + out.string());
  expect_one_line_error(r, 1, "asgd: error: run bsp-w2-r0 failed: training diverged: ");
  const std::string log = (out / "runs" / "bsp-w2-r0.log").string();
  EXPECT_NE(r.err.find("(asgd cluster exited with status 1; its output: " + log + ")"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("details in"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

TEST(CompareCli, AnInterruptStopsAfterTheRunningJobAndKeepsTheFinishedRuns) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  const asgd_test::TempDir dir;
  const fs::path out = dir / "cmp";
  const fs::path stdout_file = dir / "stdout";
  const fs::path stderr_file = dir / "stderr";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int o = ::open(stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    const std::string data_dir = mnist.string(), out_dir = out.string();
    ::execl(asgd_test::asgd_cli_path(), asgd_test::asgd_cli_path(), "compare", "--policies", "bsp,async", "--repeats", "20", "--epochs", "1",
            "--data-dir", data_dir.c_str(), "--out", out_dir.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Interrupt once the first run has finished.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (slurp(stdout_file).find("[1/40]") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1) << slurp(stdout_file) << slurp(stderr_file);
  const std::string err = slurp(stderr_file);
  EXPECT_NE(err.find("asgd: error: interrupted;"), std::string::npos) << err;
  const auto rows = csv_rows(out / "results.csv");
  EXPECT_GE(rows.size(), 2u);   // the finished run(s)
  EXPECT_LT(rows.size(), 41u);  // not all forty
  EXPECT_NE(slurp(out / "report.html").find("interrupted after"), std::string::npos);
}

}  // namespace
