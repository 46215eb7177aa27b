// examples/example_service as a user meets it: a separate process on a port
// of its own, driven over HTTP, stopped with SIGTERM.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dataset/idx.hpp"
#include "http_client.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using asgd_test::http;
using asgd_test::HttpReply;

#ifdef ASGD_EXAMPLE_SERVICE_PATH
constexpr const char* kServicePath = ASGD_EXAMPLE_SERVICE_PATH;
#else
constexpr const char* kServicePath = nullptr;  // built without Boost
#endif

// The service as a child process: its stdout is read on a thread of ours
// (the first line gives the port; the rest is kept for failure messages).
// `idle_timeout_s` > 0 passes --idle-timeout; `max_files` > 0 limits the
// descriptors the service may open (RLIMIT_NOFILE).
class ServiceProcess {
 public:
  explicit ServiceProcess(int idle_timeout_s = 0, rlim_t max_files = 0, const std::string& work_dir = "") {
    int out[2];
    if (::pipe(out) != 0) return;
    const std::string idle = std::to_string(idle_timeout_s);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      if (max_files > 0) {
        const rlimit limit{max_files, max_files};
        ::setrlimit(RLIMIT_NOFILE, &limit);
      }
      if (idle_timeout_s > 0)
        ::execl(kServicePath, kServicePath, "0", "--idle-timeout", idle.c_str(), static_cast<char*>(nullptr));
      else if (!work_dir.empty())
        ::execl(kServicePath, kServicePath, "0", work_dir.c_str(), static_cast<char*>(nullptr));
      else
        ::execl(kServicePath, kServicePath, "0", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    reader_ = std::thread([this, fd = out[0]] {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard lock(mu_);
        output_.append(buf, static_cast<std::size_t>(n));
      }
      ::close(fd);
    });
  }

  // A service the test did not stop gets SIGTERM first, so that it removes
  // its temporary folder, and SIGKILL if it does not exit within 10 s.
  ~ServiceProcess() {
    if (pid_ > 0 && !status_ && !stop(SIGTERM, std::chrono::seconds(10))) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  // The port from "listening on 127.0.0.1:PORT"; 0 if it did not come.
  int port(std::chrono::seconds timeout = std::chrono::seconds(20)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mu_);
        if (const auto eol = output_.find('\n'); eol != std::string::npos) {
          const std::string prefix = "listening on 127.0.0.1:";
          if (output_.rfind(prefix, 0) != 0) return 0;
          return std::stoi(output_.substr(prefix.size(), eol - prefix.size()));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

  // Sends `signal` and waits for the exit; the wait status, or none after
  // `timeout`.
  std::optional<int> stop(int signal, std::chrono::seconds timeout) {
    ::kill(pid_, signal);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) return status_ = status;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

  std::string output() {
    std::lock_guard lock(mu_);
    return output_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::thread reader_;
  std::mutex mu_;
  std::string output_;
};

// Waits for the service's job to leave "training"; the last /status.
json wait_for_job(int port, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  json status;
  while (Clock::now() < deadline) {
    status = http(port, "GET", "/status").body_json();
    if (status.value("state", "") != "training") return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return status;
}

// Whether the service closed `fd` (a read sees the end) within `timeout`.
bool closed_by_peer(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}

TEST(ExampleService, ClosesAConnectionThatStaysIdlePastTheIdleTimeout) {
  if (!kServicePath) GTEST_SKIP() << "example_service was not built (no Boost)";
  ServiceProcess service(/*idle_timeout_s=*/1);
  const int port = service.port();
  ASSERT_GT(port, 0) << service.output();
  const int fd = asgd_test::connect_loopback(port);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(closed_by_peer(fd, std::chrono::milliseconds(5000))) << "an idle connection was kept past 1 s";
  ::close(fd);
  EXPECT_EQ(http(port, "GET", "/status").status, 200);
}

// Seconds past a day were taken, and past 9.2e9 overflowed the timer into
// the past: every connection closed at once.
TEST(ExampleService, RefusesAnIdleTimeoutOutOfRange) {
  if (!kServicePath) GTEST_SKIP() << "example_service was not built (no Boost)";
  for (const char* seconds : {"9223372037", "86401", "0", "inf"}) {
    const int status = std::system(
        (std::string("timeout 10 ") + kServicePath + " 0 --idle-timeout " + seconds + " > /dev/null 2>&1").c_str());
    ASSERT_TRUE(WIFEXITED(status)) << seconds;
    EXPECT_EQ(WEXITSTATUS(status), 2) << "--idle-timeout " << seconds;
  }
}

// From the embedding audit (2026-11-29): `0 --idle-timeout=10` started
// with a work folder named "--idle-timeout=10" (an unknown flag became
// WORK_DIR); the joined form is a flag now, and any other is refused.
TEST(ExampleService, RefusesUnknownFlagsAndTakesTheJoinedIdleTimeout) {
  if (!kServicePath) GTEST_SKIP() << "example_service was not built (no Boost)";
  asgd_test::TempDir dir("flags");
  const auto text_of = [&](const char* name) {
    std::ifstream in(dir.path() / name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto run = [&](const std::string& args) {
    const int status = std::system(("cd " + dir.path().string() + " && timeout 2 " + kServicePath + " " + args +
                                    " > out.txt 2> err.txt").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  for (const char* wrong : {"0 --idle-timout 10", "0 -v", "0 work --verbose", "--port 0"}) {
    EXPECT_EQ(run(wrong), 2) << wrong;
    EXPECT_NE(text_of("err.txt").find("unknown flag"), std::string::npos) << wrong;
  }
  EXPECT_EQ(run("0 --idle-timeout"), 2);
  EXPECT_EQ(run("0 --idle-timeout=0"), 2);
  EXPECT_EQ(run("--help"), 0);
  EXPECT_NE(text_of("out.txt").find("usage:"), std::string::npos);
  EXPECT_EQ(run("0 work --idle-timeout=10"), 124) << "it served until timeout stopped it";
  EXPECT_NE(text_of("out.txt").find("listening on 127.0.0.1:"), std::string::npos);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find('-'), std::string::npos) << entry.path();
}

TEST(ExampleService, RunningOutOfDescriptorsDoesNotMakeItDeaf) {
  if (!kServicePath) GTEST_SKIP() << "example_service was not built (no Boost)";
  ServiceProcess service(/*idle_timeout_s=*/1, /*max_files=*/64);
  const int port = service.port();
  ASSERT_GT(port, 0) << service.output();
  // Twice as many idle connections as it has descriptors: it runs out.
  std::vector<int> idle;
  for (int i = 0; i < 128; ++i)
    if (const int fd = asgd_test::connect_loopback(port); fd >= 0) idle.push_back(fd);
  EXPECT_GT(idle.size(), 64u);
  // The idle ones time out and give their descriptors back, while this
  // side still holds them open: the service answers again.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  bool answered = false;
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (!answered && Clock::now() < deadline) {
    answered = http(port, "GET", "/status").status == 200;
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(answered) << "no answer after the descriptors ran out: " << service.output();
  for (const int fd : idle) ::close(fd);
  EXPECT_EQ(http(port, "GET", "/status").status, 200);
}

// Sends `parts` to the service on one connection, each after the service
// answered the one before (or 0.5 s passed), and returns all it answered.
std::string exchange(int port, const std::vector<std::string>& parts) {
  const int fd = asgd_test::connect_loopback(port);
  if (fd < 0) return "";
  timeval tv{0, 500000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string answer;
  char buf[8192];
  for (const std::string& part : parts) {
    if (::send(fd, part.data(), part.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(part.size())) break;
    if (const ssize_t n = ::recv(fd, buf, sizeof buf, 0); n > 0) answer.append(buf, static_cast<std::size_t>(n));
  }
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return answer;
}

TEST(ExampleService, AnswersBadRequestsWithJsonErrors) {
  if (kServicePath == nullptr) GTEST_SKIP() << "example_service was not built (no Boost)";
  ServiceProcess service;
  const int port = service.port();
  ASSERT_GT(port, 0) << "no 'listening on 127.0.0.1:PORT' line; output:\n" << service.output();

  auto status = http(port, "GET", "/status");
  EXPECT_EQ(status.status, 200);
  EXPECT_EQ(status.body_json().value("state", ""), "idle");

  auto check = [&](const std::string& method, const std::string& path, const std::string& body, int code,
                   const std::string& message_part) {
    const HttpReply r = http(port, method, path, body);
    EXPECT_EQ(r.status, code) << method << " " << path << " " << body << " -> " << r.body;
    EXPECT_NE(r.body_json().value("error", "").find(message_part), std::string::npos)
        << method << " " << path << " -> " << r.body;
  };
  check("GET", "/nowhere", "", 404, "no such path");
  // A byte that is not UTF-8 in the path: a 404 like any other, not an abort.
  check("GET", "/\xff", "", 404, "no such path");
  check("GET", "/train", "", 405, "use POST");
  check("POST", "/status", "", 405, "use GET");
  check("POST", "/predict", R"({"pixels": [[0.5]]})", 503, "no trained model yet");
  check("POST", "/train", "{not json", 400, "not valid JSON");
  check("POST", "/train", R"({"epochs": "three"})", 400, "epochs");
  check("POST", "/train", R"({"workers": 0})", 400, "--workers");
  check("POST", "/train", R"({"colour": "blue"})", 400, "unknown setting 'colour'");
  check("POST", "/train", R"({"data_dir": "/nonexistent-data"})", 400, "data_dir /nonexistent-data is not a folder");
  check("POST", "/train", std::string(9u << 20, ' '), 413, "larger than 8 MiB");

  // What is not HTTP it reads gets a JSON 400 (the connection was closed
  // without a word).
  for (const std::string raw : {"GARBAGE\r\n\r\n", "GET /status HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"}) {
    const std::string answer = exchange(port, {raw});
    EXPECT_EQ(answer.rfind("HTTP/1.1 400 Bad Request", 0), 0u) << answer;
    EXPECT_NE(answer.find("{\"error\":\"not an HTTP/1.1 request this service reads"), std::string::npos) << answer;
  }
  // A client that asks before sending its body (curl past 1 MiB) is told to
  // go on at once; it waited a second for the answer before.
  const std::string body = R"({"pixels": [[0.5]]})";
  const auto start = std::chrono::steady_clock::now();
  const std::string asked = exchange(port, {"POST /predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                            "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n",
                                            body});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(800)) << asked;
  EXPECT_EQ(asked.rfind("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503", 0), 0u) << asked;

  const auto exit = service.stop(SIGTERM, std::chrono::seconds(20));
  ASSERT_TRUE(exit.has_value()) << "the service did not exit within 20 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << "wait status " << *exit;
}

TEST(ExampleService, TrainsOnRequestAndClassifiesMnistDigits) {
  if (kServicePath == nullptr) GTEST_SKIP() << "example_service was not built (no Boost)";
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  auto images = data::read_idx_images(mnist / "t10k-images-idx3-ubyte.gz");
  auto labels = data::read_idx_labels(mnist / "t10k-labels-idx1-ubyte.gz", 10);
  ASSERT_TRUE(images.ok() && labels.ok()) << images.status().to_string() << labels.status().to_string();

  const asgd_test::TempDir work;
  ServiceProcess service(0, 0, work.path().string());
  const int port = service.port();
  ASSERT_GT(port, 0) << "no 'listening on 127.0.0.1:PORT' line; output:\n" << service.output();

  const json settings = {{"model", "mlp"},   {"epochs", 1},   {"workers", 2},
                         {"dataset", "mnist"}, {"data_dir", mnist.string()}, {"lr", 0.02}};
  const auto started = http(port, "POST", "/train", settings.dump());
  ASSERT_EQ(started.status, 202) << started.body;
  EXPECT_EQ(http(port, "POST", "/train", settings.dump()).status, 409) << "a second job while one runs";

  const json status = wait_for_job(port, std::chrono::seconds(180));
  ASSERT_EQ(status.value("state", ""), "done")
      << "waited up to 180 s for /status to report the job done; last /status: " << status.dump()
      << "\nservice output:\n" << service.output();
  EXPECT_EQ(status.value("epochs_done", 0), 1);
  EXPECT_GT(status["last_epoch"].value("samples_per_s", 0.0), 0.0);
  EXPECT_GT(status.value("final_test_accuracy", 0.0), 0.85);
  EXPECT_EQ(status.value("model_version", 0), 1);
  // docs/user-guide.md names every field /status sends.
  std::ifstream guide_file(std::string(ASGD_SOURCE_DIR) + "/docs/user-guide.md");
  const std::string guide((std::istreambuf_iterator<char>(guide_file)), std::istreambuf_iterator<char>());
  const auto from = guide.find("`GET /status` reports");
  ASSERT_NE(from, std::string::npos) << "docs/user-guide.md no longer describes GET /status";
  const std::string described = guide.substr(from, guide.find("/predict`", from) - from);
  std::vector<std::string> keys;
  for (const auto& [key, value] : status.items()) {
    keys.push_back(key);
    if (value.is_object())
      for (const auto& [inner, unused] : value.items()) keys.push_back(inner);
  }
  for (const auto& key : keys)
    EXPECT_NE(described.find("`" + key + "`"), std::string::npos) << "/status sends '" << key
                                                                  << "', which the user guide does not name";

  constexpr std::size_t kImages = 20, kPixels = 28 * 28;
  json pixels = json::array();
  for (std::size_t i = 0; i < kImages; ++i) {
    json row = json::array();
    for (std::size_t j = 0; j < kPixels; ++j) row.push_back(images->pixels[i * kPixels + j] / 255.0);
    pixels.push_back(std::move(row));
  }
  const auto answer = http(port, "POST", "/predict", json{{"pixels", pixels}}.dump());
  ASSERT_EQ(answer.status, 200) << answer.body;
  const json reply = answer.body_json();
  ASSERT_EQ(reply["classes"].size(), kImages) << answer.body;
  EXPECT_EQ(reply.value("model_version", 0), 1);
  std::size_t right = 0;
  for (std::size_t i = 0; i < kImages; ++i) right += reply["classes"][i].get<int>() == (*labels)[i];
  EXPECT_GE(right, 15u) << "classes " << reply["classes"].dump();

  const auto wrong_shape = http(port, "POST", "/predict", R"({"pixels": [[0.1, 0.2]]})");
  EXPECT_EQ(wrong_shape.status, 400) << wrong_shape.body;
  const auto out_of_range = http(port, "POST", "/predict", json{{"pixels", {std::vector<double>(kPixels, 255.0)}}}.dump());
  EXPECT_EQ(out_of_range.status, 400) << out_of_range.body;

  // A second job's model replaces the first: the first's folder goes (each
  // job's stayed, 2.8 MB apiece for a service that trains job after job).
  ASSERT_EQ(http(port, "POST", "/train", settings.dump()).status, 202);
  const json second = wait_for_job(port, std::chrono::seconds(180));
  ASSERT_EQ(second.value("state", ""), "done") << second.dump() << "\nservice output:\n" << service.output();
  EXPECT_EQ(second.value("model_version", 0), 2);
  EXPECT_FALSE(std::filesystem::exists(work.path() / "job-1")) << "the replaced model's folder stayed";
  EXPECT_TRUE(std::filesystem::exists(work.path() / "job-2" / "model.ckpt"));

  const auto exit = service.stop(SIGTERM, std::chrono::seconds(20));
  ASSERT_TRUE(exit.has_value()) << "the service did not exit within 20 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << "wait status " << *exit;
}

TEST(ExampleService, SigtermDuringTrainingStopsTheJobAndExitsCleanly) {
  if (kServicePath == nullptr) GTEST_SKIP() << "example_service was not built (no Boost)";
  ASGD_REQUIRE_DATASET(mnist, "mnist");
  ServiceProcess service;
  const int port = service.port();
  ASSERT_GT(port, 0) << "no 'listening on 127.0.0.1:PORT' line; output:\n" << service.output();
  const json settings = {{"epochs", 50}, {"data_dir", mnist.string()}};
  ASSERT_EQ(http(port, "POST", "/train", settings.dump()).status, 202);

  const auto exit = service.stop(SIGTERM, std::chrono::seconds(30));
  ASSERT_TRUE(exit.has_value()) << "the service did not exit within 30 s of SIGTERM during training; output:\n"
                                << service.output();
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << "wait status " << *exit;
}

}  // namespace
}  // namespace asgd
