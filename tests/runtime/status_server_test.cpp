// The job's status server (--status-port): what a scraper and a browser get.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "cli/cli_run.hpp"
#include "http_client.hpp"
#include "actors/live_status.hpp"
#include "runtime/status_server.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

using asgd_test::http;
using Clock = std::chrono::steady_clock;

LiveSnapshot two_workers() {
  LiveSnapshot s;
  s.state = "training";
  s.policy = "ssp:2";
  s.model = "mlp";
  s.dataset = "mnist";
  s.workers = 2;
  s.shards = 1;
  s.epochs = 3;
  s.samples = 42;
  s.updates = 7;
  s.train_loss = 0.5;
  s.worker = {LiveWorker{0, 12, 1, 21, 4, 1.0, 0.25, 1, true, false, 0.1},
              LiveWorker{1, 10, 1, 21, 3, 2.0, 0.5, 0, true, false, 0.2}};
  s.shard = {LiveShard{0, 101770, 7, 1, 2, 0, 0, 3}};
  return s;
}

// The value of an unlabelled or labelled sample line, or -1.
double sample_value(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// A server on a free loopback port serving two_workers() and `page`.
std::unique_ptr<StatusServer> serve_two_workers(std::shared_ptr<LiveStatus> live, const std::string& page) {
  live->update([](LiveSnapshot& s) { s = two_workers(); });
  auto server = StatusServer::start("127.0.0.1", 0, std::move(live), page);
  EXPECT_TRUE(server.ok()) << server.status().to_string();
  return server ? std::move(server).value() : nullptr;
}

TEST(StatusServer, ServesMetricsStatusAndThePageAndRefusesTheRest) {
  auto live = std::make_shared<LiveStatus>();
  const auto server = serve_two_workers(live, "<html>live</html>");
  ASSERT_TRUE(server);
  const int port = server->port();
  ASSERT_GT(port, 0);

  const auto metrics = http(port, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.headers.find("text/plain; version=0.0.4"), std::string::npos) << metrics.headers;
  EXPECT_EQ(sample_value(metrics.body, "asgd_samples_total"), 42);
  EXPECT_EQ(sample_value(metrics.body, "asgd_updates_total"), 7);
  EXPECT_EQ(sample_value(metrics.body, "asgd_rejected_messages_total"), 3);  // 1 rejected push + 2 dropped frames
  EXPECT_EQ(sample_value(metrics.body, "asgd_worker_clock{worker=\"1\"}"), 10);
  EXPECT_EQ(sample_value(metrics.body, "asgd_shard_queue_depth{shard=\"0\"}"), 3);
  EXPECT_NE(metrics.body.find("# TYPE asgd_samples_total counter"), std::string::npos);
  EXPECT_NE(metrics.body.find("asgd_job_info{policy=\"ssp:2\",model=\"mlp\""), std::string::npos);
  // Every sample line is "name[{labels}] value", as the exposition format asks.
  const std::regex line(R"(([a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? [-+0-9.eEInfNa]+)|(# (HELP|TYPE) .*))");
  std::istringstream lines(metrics.body);
  for (std::string l; std::getline(lines, l);) EXPECT_TRUE(std::regex_match(l, line)) << l;

  const auto status = http(port, "GET", "/status");
  ASSERT_EQ(status.status, 200);
  const auto j = status.body_json();
  EXPECT_EQ(j, to_json(two_workers()));
  ASSERT_EQ(j["worker"].size(), 2u);
  EXPECT_EQ(j["worker"][1]["clock"], 10);
  EXPECT_EQ(j["shard"][0]["keys"], 101770);
  EXPECT_EQ(j["val_accuracy"], nullptr);

  const auto page = http(port, "GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.headers.find("text/html"), std::string::npos);
  EXPECT_EQ(page.body, "<html>live</html>");

  EXPECT_EQ(http(port, "GET", "/nope").status, 404);
  EXPECT_EQ(http(port, "POST", "/status", "{}").status, 405);
  // Over 16 KiB: said (the connection was closed without an answer).
  EXPECT_EQ(http(port, "GET", "/" + std::string(100'000, 'a')).status, 431);
  EXPECT_EQ(http(port, "POST", "/status", std::string(100'000, 'b')).status, 413);

  // Not HTTP: said (it was closed without a word).
  EXPECT_EQ(asgd_test::http_raw(port, "hello there\r\n\r\n").status, 400);
  EXPECT_EQ(asgd_test::http_raw(port, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\r\n\r\n", 13)).status, 400);
  // Another method is refused from its header: a client that waits for
  // "100 Continue" before its body is answered at once (it waited 10 s).
  const auto asked = Clock::now();
  EXPECT_EQ(asgd_test::http_raw(port, "POST /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n"
                                      "Expect: 100-continue\r\n\r\n").status,
            405);
  EXPECT_LT(Clock::now() - asked, std::chrono::seconds(2));
  // A loopback server answers loopback names only: a page of another site
  // whose name resolves to 127.0.0.1 (DNS rebinding) sends its own.
  EXPECT_EQ(http(port, "GET", "/status", "", "evil.example.com").status, 403);
  EXPECT_EQ(http(port, "GET", "/status", "", "127.0.0.1.evil.example.com:" + std::to_string(port)).status, 403);
  for (const std::string& host : std::vector<std::string>{"localhost:" + std::to_string(port), "127.0.0.2", "[::1]:80", "app.localhost",
                                                                    "LOCALHOST", "localhost.:8080"})
    EXPECT_EQ(http(port, "GET", "/status", "", host).status, 200) << host;
  EXPECT_EQ(asgd_test::http_raw(port, "GET /status HTTP/1.0\r\n\r\n").status, 200) << "no Host: a local client";
  EXPECT_NE(status.headers.find("X-Content-Type-Options: nosniff"), std::string::npos) << status.headers;

  // A later snapshot is what the next scrape sees.
  live->update([](LiveSnapshot& s) { s.samples = 100; });
  EXPECT_EQ(sample_value(http(port, "GET", "/metrics").body, "asgd_samples_total"), 100);
}

TEST(StatusServer, HistoryKeepsAPointEachTimeTrainingMovesOnAndThinsALongRun) {
  auto live = std::make_shared<LiveStatus>();
  live->update([](LiveSnapshot& s) { s.state = "starting"; });  // before training: nothing to draw
  for (double t : {0.5, 1.0, 1.0, 1.5}) {
    live->update([t](LiveSnapshot& s) {
      s.state = "training";
      s.wall_s = t;
      s.samples_per_s = 1000 * t;
      s.epoch = t < 1.2 ? 1 : 2;
      if (t > 1.2) s.val_accuracy = 0.9;
    });
  }
  auto server = StatusServer::start("127.0.0.1", 0, live, "");
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const auto reply = http((*server)->port(), "GET", "/history");
  ASSERT_EQ(reply.status, 200);
  const auto points = reply.body_json()["points"];
  ASSERT_EQ(points.size(), 3u) << "one point per moment the clock moved: " << points.dump();
  EXPECT_EQ(points[0]["t"], 0.5);
  EXPECT_EQ(points[0]["acc"], nullptr);
  EXPECT_EQ(points[2]["epoch"], 2);
  EXPECT_EQ(points[2]["acc"], 0.9);
  EXPECT_EQ(points[2]["rate"], 1500);

  for (std::size_t i = 0; i < LiveStatus::kMaxHistory; ++i)
    live->update([i](LiveSnapshot& s) { s.wall_s = 2.0 + static_cast<double>(i); });
  const auto kept = live->history();
  EXPECT_LE(kept.size(), LiveStatus::kMaxHistory);
  EXPECT_GE(kept.size(), LiveStatus::kMaxHistory / 2);
  EXPECT_EQ(kept.front().wall_s, 0.5) << "the run's start stays";
  EXPECT_EQ(kept.back().wall_s, 2.0 + static_cast<double>(LiveStatus::kMaxHistory - 1)) << "and its newest point";
}

// Descriptors this process has open.
std::size_t open_descriptors() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Clients that connect and send nothing took a descriptor each from the
// job, until it could not open its checkpoint files and failed: the server
// holds 32 at most, the rest wait to be accepted, and it still answers
// once the idle ones time out or go.
TEST(StatusServer, IdleConnectionsTakeAtMostThirtyTwoDescriptorsAndTheServerAnswersWhenTheyGo) {
  const auto server = serve_two_workers(std::make_shared<LiveStatus>(), "");
  ASSERT_TRUE(server);
  const int port = server->port();
  const std::size_t before = open_descriptors();
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = asgd_test::connect_loopback(port);
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server accepts what it will
  const std::size_t server_side = open_descriptors() - before - idle.size();
  EXPECT_LE(server_side, 32u + 2u) << "descriptors the server took for 200 idle clients";
  EXPECT_GE(server_side, 30u);
  for (int fd : idle) ::close(fd);
  const auto asked = Clock::now();
  const auto reply = http(port, "GET", "/status");
  EXPECT_EQ(reply.status, 200);
  EXPECT_LT(Clock::now() - asked, std::chrono::seconds(5)) << "the closed clients' places were not given back";
}

TEST(StatusServer, LabelValuesAreEscaped) {
  LiveSnapshot s = two_workers();
  s.model = "a\"b\\c\nd";
  const std::string text = to_prometheus(s);
  EXPECT_NE(text.find(R"(model="a\"b\\c\nd")"), std::string::npos) << text;
}

TEST(StatusServer, APortInUseIsRefusedNamingTheFlag) {
  auto live = std::make_shared<LiveStatus>();
  auto first = StatusServer::start("127.0.0.1", 0, live, "");
  ASSERT_TRUE(first.ok());
  auto second = StatusServer::start("127.0.0.1", (*first)->port(), live, "");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(second.status().message().find("--status-port"), std::string::npos) << second.status().message();
  auto bad = StatusServer::start("not-an-address", 0, live, "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--status-address"), std::string::npos);
  // A coordinator process finds it before anyone registers (it let every
  // process join, then sent them all away).
  const auto started = std::chrono::steady_clock::now();
  const auto coordinator = asgd_test::asgd("coordinator --workers 1 --join-timeout 30 --status-port " +
                                           std::to_string((*first)->port()));
  EXPECT_EQ(coordinator.exit_code, 2) << coordinator.err;
  EXPECT_NE(coordinator.err.find("cannot listen on 127.0.0.1:" + std::to_string((*first)->port())), std::string::npos)
      << coordinator.err;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << "it waited for registrations";
}

// Acceptance: during a real run, two scrapes of /metrics show the sample
// and update counters growing, and /status lists every worker.
TEST(StatusServer, DuringATrainingRunTheCountersGrowAndStatusListsEveryWorker) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const int port = asgd_test::free_port();
  ASSERT_GT(port, 0);
  auto run = std::async(std::launch::async, [&] {
    return asgd_test::asgd("train --data-dir " + dir.string() + " --workers 3 --epochs 4 --batch 16 --status-port " +
                           std::to_string(port));
  });
  // Waits until /metrics shows `series` above `above`; its value then, or -1.
  auto wait_for = [&](const std::string& series, double above, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      const auto r = http(port, "GET", "/metrics");
      if (r.status == 200) {
        const double v = sample_value(r.body, series);
        if (v > above) return v;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1.0;
  };
  const double samples1 = wait_for("asgd_samples_total", 0, std::chrono::seconds(60));
  ASSERT_GT(samples1, 0) << "no samples on /metrics within 60 s";
  const double updates1 = wait_for("asgd_updates_total", 0, std::chrono::seconds(10));
  ASSERT_GT(updates1, 0);
  const auto status = http(port, "GET", "/status").body_json();
  const double samples2 = wait_for("asgd_samples_total", samples1, std::chrono::seconds(10));
  const double updates2 = wait_for("asgd_updates_total", updates1, std::chrono::seconds(10));
  EXPECT_GT(samples2, samples1) << "the sample counter did not grow within 10 s";
  EXPECT_GT(updates2, updates1) << "the update counter did not grow within 10 s";

  ASSERT_EQ(status["worker"].size(), 3u) << status.dump();
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(status["worker"][w]["worker"], w);
    EXPECT_TRUE(status["worker"][w]["alive"].get<bool>());
  }
  EXPECT_EQ(status["state"], "training");
  EXPECT_EQ(status["workers"], 3);
  EXPECT_EQ(status["total_samples"], 4 * 55000);

  // Opened after the second epoch, the page gets both epochs from /history
  // (the job has a fourth, so the server is still there to ask).
  const auto third_by = Clock::now() + std::chrono::seconds(60);
  auto epoch_now = [&] {
    const auto s = http(port, "GET", "/status").body_json();
    return s.is_object() ? s.value("epoch", 0) : 99;  // no answer: the job has ended
  };
  while (Clock::now() < third_by && epoch_now() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto history = http(port, "GET", "/history");
  ASSERT_EQ(history.status, 200) << "the job ended before its third epoch was seen";
  const nlohmann::json points = history.body_json()["points"];
  std::set<int> epochs;
  for (const auto& p : points) epochs.insert(p["epoch"].get<int>());
  EXPECT_TRUE(epochs.count(1) && epochs.count(2)) << history.body;
  ASSERT_FALSE(points.empty());
  EXPECT_LT(points[0]["t"].get<double>(), 1.0) << "from the start of training";

  const auto done = run.get();
  EXPECT_EQ(done.exit_code, 0) << done.err;
}

}  // namespace
}  // namespace asgd
