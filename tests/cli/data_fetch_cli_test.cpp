// asgd data fetch against a real HTTP server on 127.0.0.1 (file_server.py,
// started by each test) serving the datasets in ASGD_DATA_DIR: checksums,
// a corrupt copy, an interrupted download resumed, no server at all.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli/cli_run.hpp"
#include "dataset/cifar_files.hpp"
#include "http_client.hpp"
#include "runtime/asgd_processes.hpp"
#include "test_data.hpp"

namespace asgd_test {
namespace {

namespace fs = std::filesystem;

const char* kMnistFiles[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                             "t10k-labels-idx1-ubyte.gz"};

// tests/cli/file_server.py serving `root`, stopped when this goes.
class FileServer {
 public:
  FileServer(const fs::path& root, const fs::path& log, long cut_first = 0, bool endless = false) {
    int out[2];
    if (::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      const std::string script = std::string(ASGD_SOURCE_DIR) + "/tests/cli/file_server.py";
      const std::string cut = std::to_string(cut_first);
      ::execl("/usr/bin/python3", "python3", script.c_str(), root.c_str(), "--log", log.c_str(), "--cut-first",
              cut.c_str(), endless ? "--endless" : static_cast<char*>(nullptr), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    // The port, up to its newline; the pipe stays open while the server
    // lives, so no write of its ever meets a closed pipe.
    stdout_ = out[0];
    std::string line;
    pollfd p{stdout_, POLLIN, 0};
    char c = 0;
    while (line.find('\n') == std::string::npos && ::poll(&p, 1, 10000) == 1 && ::read(stdout_, &c, 1) == 1) line += c;
    port_ = std::atoi(line.c_str());
  }
  ~FileServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_ >= 0) ::close(stdout_);
  }
  FileServer(const FileServer&) = delete;
  FileServer& operator=(const FileServer&) = delete;
  int port() const { return port_; }
  std::string url(const std::string& folder) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + folder + "/";
  }

 private:
  pid_t pid_ = -1;
  int stdout_ = -1;
  int port_ = 0;
};

bool same_bytes(const fs::path& a, const fs::path& b) { return slurp(a) == slurp(b); }

TEST(DataFetch, GetsEveryMnistFileFromAMirrorAndThenFindsThemValid) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir tmp;
  FileServer server(mnist.parent_path(), tmp / "requests.log");
  ASSERT_GT(server.port(), 0);
  const fs::path dir = tmp / "data" / "mnist";
  const CliRun r = asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  for (const char* name : kMnistFiles) {
    EXPECT_TRUE(same_bytes(dir / name, mnist / name)) << name;
    EXPECT_FALSE(fs::exists(dir / (std::string(name) + ".part"))) << name;
    EXPECT_NE(r.out.find(std::string(name) + ": "), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("sha256 ok"), std::string::npos) << r.out;
  // A second run checks what is there and asks the server for nothing.
  const std::string before = slurp(tmp / "requests.log");
  const CliRun again = asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + dir.string());
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("already here"), std::string::npos) << again.out;
  EXPECT_EQ(slurp(tmp / "requests.log"), before);
  // What it fetched trains.
  const CliRun train = asgd("train --data-dir " + dir.string() + " --epochs 1 --workers 1");
  EXPECT_EQ(train.exit_code, 0) << train.err;
}

TEST(DataFetch, ACorruptCopyOnTheServerFailsNamingTheFileAndLeavesNothingUnderItsName) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir tmp;
  const fs::path served = tmp / "served" / "mnist";
  fs::create_directories(served);
  for (const char* name : kMnistFiles) fs::copy_file(mnist / name, served / name);
  {  // one byte changed in the middle of the test labels
    std::fstream f(served / "t10k-labels-idx1-ubyte.gz", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    f.put('\x5a');
  }
  FileServer server(tmp / "served", tmp / "requests.log");
  ASSERT_GT(server.port(), 0);
  const fs::path dir = tmp / "mnist";
  const CliRun r = asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + dir.string());
  expect_one_line_error(r, 1, "t10k-labels-idx1-ubyte.gz: no good copy");
  EXPECT_NE(r.err.find("sha256"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "t10k-labels-idx1-ubyte.gz"));
  EXPECT_FALSE(fs::exists(dir / "t10k-labels-idx1-ubyte.gz.part"));
  EXPECT_TRUE(same_bytes(dir / "train-images-idx3-ubyte.gz", mnist / "train-images-idx3-ubyte.gz"));
}

// A mirror that sends more than a file has (no length, no end) is cut off
// at the file's size: the disk does not fill, and nothing is kept.
TEST(DataFetch, AMirrorThatSendsWithoutEndIsCutOffAtTheFilesSize) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir tmp;
  FileServer server(mnist.parent_path(), tmp / "requests.log", 0, /*endless=*/true);
  ASSERT_GT(server.port(), 0);
  const fs::path dir = tmp / "mnist";
  const auto start = std::chrono::steady_clock::now();
  const CliRun r = asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + dir.string());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_one_line_error(r, 1, "train-images-idx3-ubyte.gz");
  EXPECT_NE(r.err.find("sent more than the file's 9912422 bytes"), std::string::npos) << r.err;
  // A bad copy, not the network (it said to check the network or a proxy).
  EXPECT_NE(r.err.find("no good copy"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("check the network"), std::string::npos) << r.err;
  EXPECT_LT(took, 60.0);
  EXPECT_FALSE(fs::exists(dir / "train-images-idx3-ubyte.gz"));
  EXPECT_FALSE(fs::exists(dir / "train-images-idx3-ubyte.gz.part"));
}

TEST(DataFetch, AnInterruptedDownloadResumesWhereItStopped) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir tmp;
  constexpr long kCut = 1000000;
  FileServer server(mnist.parent_path(), tmp / "requests.log", kCut);
  ASSERT_GT(server.port(), 0);
  const fs::path dir = tmp / "mnist";
  const std::string cmd = "data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + dir.string();
  const CliRun first = asgd(cmd);
  expect_one_line_error(first, 1, "train-images-idx3-ubyte.gz: could not download it");
  EXPECT_EQ(fs::file_size(dir / "train-images-idx3-ubyte.gz.part"), static_cast<std::uintmax_t>(kCut));
  EXPECT_FALSE(fs::exists(dir / "train-images-idx3-ubyte.gz"));
  const CliRun second = asgd(cmd);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("train-images-idx3-ubyte.gz: resumed after 1.0 MB"), std::string::npos) << second.out;
  EXPECT_NE(slurp(tmp / "requests.log").find("GET /mnist/train-images-idx3-ubyte.gz bytes=1000000-"),
            std::string::npos);
  for (const char* name : kMnistFiles) EXPECT_TRUE(same_bytes(dir / name, mnist / name)) << name;
}

// Ctrl-C while a server has sent nothing yet (a socket that takes the
// connection and never answers): nothing to keep, so no empty .part is
// left, and the message does not say what arrived is kept.
TEST(DataFetch, InterruptedBeforeAnyByteArrivedItKeepsNoEmptyPart) {
  asgd_test::HeldPort listener;  // the kernel completes connections; nobody answers
  ASSERT_NE(listener.port, 0);
  TempDir tmp;
  const fs::path dir = tmp / "mnist";
  const pid_t pid = start_asgd({"data", "fetch", "mnist", "--mirror",
                                "http://127.0.0.1:" + std::to_string(listener.port) + "/", "--data-dir",
                                dir.string()},
                               tmp / "fetch.log");
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(eventually([&] { return fs::exists(dir / "train-images-idx3-ubyte.gz.part"); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const auto code = wait_exit(pid, std::chrono::seconds(30));
  listener.release();
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, 1);
  const std::string said = read_file(tmp / "fetch.log");
  EXPECT_NE(said.find("train-images-idx3-ubyte.gz: interrupted before any of it arrived"), std::string::npos) << said;
  EXPECT_FALSE(fs::exists(dir / "train-images-idx3-ubyte.gz.part"));
}

TEST(DataFetch, NoServerOrNoSuchFileFailsInOneLineThatSaysWhatToDo) {
  TempDir tmp;
  // Port 1 on loopback: nothing listens there.
  const CliRun offline = asgd("data fetch fashion-mnist --mirror http://127.0.0.1:1/ --data-dir " + (tmp / "f").string());
  expect_one_line_error(offline, 1, "train-images-idx3-ubyte.gz: could not download it: http://127.0.0.1:1/");
  EXPECT_NE(offline.err.find("--mirror"), std::string::npos) << offline.err;
  FileServer server(tmp.path(), tmp / "requests.log");
  ASSERT_GT(server.port(), 0);
  const CliRun missing = asgd("data fetch mnist --mirror " + server.url("nothing") + " --data-dir " + (tmp / "m").string());
  expect_one_line_error(missing, 1, "(HTTP 404)");
  EXPECT_FALSE(fs::exists(tmp / "m" / "train-images-idx3-ubyte.gz.part"));
  const CliRun unknown = asgd("data fetch imagenet");
  expect_one_line_error(unknown, 2, "no such dataset (known: mnist, fashion-mnist, cifar10)");
}

// What a user meets around a download, each said for what it is: a
// damaged .part from an earlier run (resumed, it failed its check and the
// good server was blamed: now fetched whole once more), a file that cannot
// be written here (it was "check the network"), a second fetch into the
// same folder (they broke each other's files), an endless --stall-timeout
// (inf was taken as 1 s).
TEST(DataFetch, ADamagedPartAFileThatCannotBeWrittenAndASecondFetchAreSaidForWhatTheyAre) {
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  TempDir tmp;
  FileServer server(mnist.parent_path(), tmp / "requests.log");
  ASSERT_GT(server.port(), 0);
  const fs::path dir = tmp / "data" / "mnist";
  fs::create_directories(dir);
  const std::string fetch = "data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + dir.string();
  std::ofstream(dir / "t10k-labels-idx1-ubyte.gz.part") << std::string(3000, 'x');
  const CliRun damaged = asgd(fetch);
  ASSERT_EQ(damaged.exit_code, 0) << damaged.err << damaged.out;
  EXPECT_NE(damaged.out.find("t10k-labels-idx1-ubyte.gz: the resumed copy failed its check: fetching it whole"),
            std::string::npos)
      << damaged.out;
  EXPECT_TRUE(same_bytes(dir / "t10k-labels-idx1-ubyte.gz", mnist / "t10k-labels-idx1-ubyte.gz"));

  const fs::path other = tmp / "other";
  fs::create_directories(other / "train-images-idx3-ubyte.gz.part");  // a folder where the download goes
  const CliRun unwritable = asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + other.string());
  expect_one_line_error(unwritable, 1, "train-images-idx3-ubyte.gz: cannot write " +
                                           (other / "train-images-idx3-ubyte.gz.part").string() + ": Is a directory");
  EXPECT_EQ(unwritable.err.find("check the network"), std::string::npos) << unwritable.err;
  // A folder where the file goes is said before the download, not after it.
  fs::remove_all(other / "train-images-idx3-ubyte.gz.part");
  fs::create_directories(other / "train-images-idx3-ubyte.gz");
  expect_one_line_error(asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + other.string()), 1,
                        "train-images-idx3-ubyte.gz: " + (other / "train-images-idx3-ubyte.gz").string() +
                            " is in the way (not a regular file)");
  EXPECT_FALSE(fs::exists(other / "train-images-idx3-ubyte.gz.part")) << "nothing downloaded";
  fs::remove_all(other / "train-images-idx3-ubyte.gz");

  const int held = ::open(other.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  expect_one_line_error(asgd("data fetch mnist --mirror " + server.url("mnist") + " --data-dir " + other.string()), 1,
                        "another asgd data fetch is writing " + other.string());
  ::close(held);
  expect_one_line_error(asgd(fetch + " --stall-timeout inf"), 2, "--stall-timeout");
  // The parser's complaints name the command they are about (they named
  // asgd data, whose --help does not list fetch's flags).
  expect_one_line_error(asgd(fetch + " --mirorr x"), 2,
                        "unknown flag --mirorr; did you mean --mirror? (asgd data fetch --help lists them)");
  expect_one_line_error(asgd("data lst"), 2, "unknown command lst; the commands: fetch (asgd data --help");
  // --mirror "$UNSET" went to the official servers on the internet.
  expect_one_line_error(asgd(fetch + " --mirror ''"), 2, "--mirror: an empty URL");
  // A typo in the URL said "check the network" (exit 1); a bound said
  // "not in range 0.001000 to 86400.000000".
  expect_one_line_error(asgd(fetch + " --mirror notaurl"), 2, "--mirror: 'notaurl' is not a URL this can download from");
  expect_one_line_error(asgd(fetch + " --stall-timeout 86401"), 2,
                        "--stall-timeout: expected a number of seconds from 0.001 to 86400, got 86401");
}

// CIFAR-10's six batches already here, each of its size: the archive is
// not needed. The fetch downloaded it again (and failed offline) when it
// had been removed after unpacking.
TEST(DataFetch, Cifar10BatchesAlreadyUnpackedNeedNoArchive) {
  const TempDir dir;
  write_cifar10(dir.path(), 10000);  // the official batches' sizes
  const CliRun r = asgd("data fetch cifar10 --data-dir " + dir.path().string() + " --mirror file:///nonexistent/");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("the 6 unpacked files are here, each checked"), std::string::npos) << r.out << r.err;
  EXPECT_FALSE(fs::exists(dir.path() / "cifar-10-binary.tar.gz"));
}

}  // namespace
}  // namespace asgd_test
