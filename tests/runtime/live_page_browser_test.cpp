// The status server's live page in a real browser (headless Chromium),
// served by a tiny HTTP server here with a /status object as the job's
// status server returns it. Skips when Chromium is not installed.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/cli_run.hpp"
#include "runtime/live_page.hpp"
#include "temp_dir.hpp"

namespace {

struct Reply {
  int code = 200;
  std::string type = "text/html; charset=utf-8";
  std::string body;
};

// Answers GET requests on 127.0.0.1 from a handler, one connection at a time.
class TinyHttpServer {
 public:
  explicit TinyHttpServer(std::function<Reply(const std::string& path)> handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 16) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyHttpServer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) continue;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(conn, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<std::size_t>(n));
      }
      const auto first = request.find(' ');
      const auto second = request.find(' ', first + 1);
      const std::string path =
          first == std::string::npos || second == std::string::npos ? "/" : request.substr(first + 1, second - first - 1);
      ++requests_;
      const Reply reply = handler_(path);
      const std::string head = "HTTP/1.1 " + std::to_string(reply.code) + (reply.code == 200 ? " OK" : " Error") +
                               "\r\nContent-Type: " + reply.type + "\r\nContent-Length: " +
                               std::to_string(reply.body.size()) + "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n";
      const std::string all = head + reply.body;
      for (std::size_t sent = 0; sent < all.size();) {
        const ssize_t n = ::send(conn, all.data() + sent, all.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<std::size_t>(n);
      }
      ::close(conn);
    }
  }

  std::function<Reply(const std::string&)> handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

// The DOM after `budget_ms` of virtual time (timers run, fetches finish).
std::string dump_dom(const std::string& chromium, const std::string& url, int budget_ms) {
  const asgd_test::TempDir profile("_profile");
  const std::string dom = (profile / "dom.html").string();
  const std::string cmd = chromium + " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" +
                          (profile / "p").string() + " --virtual-time-budget=" + std::to_string(budget_ms) +
                          " --dump-dom '" + url + "' >" + dom + " 2>" + (profile / "err").string();
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << asgd_test::slurp(profile / "err");
  return asgd_test::slurp(dom);
}

nlohmann::json render_status(const std::string& dom) {
  static const std::regex pre(R"(<pre id="asgd-render-status"[^>]*>([^<]*)</pre>)");
  std::smatch m;
  if (!std::regex_search(dom, m, pre)) {
    ADD_FAILURE() << "no render status in the page:\n" << dom.substr(0, 2000);
    return {};
  }
  std::string text = m[1];
  for (const auto& [entity, ch] : {std::pair{"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}})
    for (std::size_t at; (at = text.find(entity)) != std::string::npos;) text.replace(at, std::strlen(entity), ch);
  return nlohmann::json::parse(text);
}

nlohmann::json status_at(double wall_s) {
  nlohmann::json s = nlohmann::json::parse(R"({"state":"training","policy":"ssp:3","model":"mlp","dataset":"mnist","workers":2,
    "shards":1,"epochs":3,"epoch":2,"progress":0.41,"eta_s":17.2,"samples":67650,"total_samples":165000,
    "samples_per_s":10234.5,"updates":3456,"train_loss":0.31,"val_accuracy":0.95,"rejected":0,
    "worker":[{"worker":0,"clock":812,"epoch":2,"samples":52000,"staleness":1.5,"wait_s":0.2,"alive":true,"last_seen_s":0.3},
              {"worker":1,"clock":790,"epoch":2,"samples":51000,"staleness":1.1,"wait_s":0.4,"alive":false,"last_seen_s":9.5}],
    "shard":[{"shard":0,"keys":101770,"updates_applied":1600,"rejected":0,"held":0,"queue":0}]})");
  s["wall_s"] = wall_s;
  s["train_loss"] = 0.31 - wall_s / 100;
  return s;
}

TEST(LivePageInBrowser, DrawsEveryChartFromItsPollsOfStatus) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  std::atomic<int> polls{0};
  TinyHttpServer server([&](const std::string& path) {
    if (path == "/") return Reply{200, "text/html; charset=utf-8", asgd::pages::live_status_page_html()};
    if (path == "/status") return Reply{200, "application/json", status_at(10.0 + polls++).dump()};
    return Reply{404, "text/plain", "not found"};
  });
  const std::string dom = dump_dom(chromium, "http://127.0.0.1:" + std::to_string(server.port()) + "/", 3500);
  const nlohmann::json s = render_status(dom);
  EXPECT_EQ(s["errors"], nlohmann::json::array()) << s.dump(2);
  EXPECT_TRUE(s["reachable"].get<bool>()) << s.dump(2);
  EXPECT_GE(polls.load(), 3);  // once a second: it kept polling
  ASSERT_EQ(s["charts"].size(), 5u) << s.dump(2);
  for (const auto& chart : s["charts"]) {
    EXPECT_GE(chart["points"].get<int>(), 1) << chart.dump();
    EXPECT_TRUE(chart["painted"].get<bool>()) << chart.dump();
  }
  for (const auto& chart : s["charts"]) {
    if (chart["id"] == "rate") {
      EXPECT_GE(chart["points"].get<int>(), 3) << "the page keeps a history of its polls";
    }
  }
  EXPECT_NE(dom.find(">2 / 3<"), std::string::npos);      // epoch/epochs
  EXPECT_NE(dom.find(">41.0%<"), std::string::npos);      // progress
  EXPECT_NE(dom.find("no (lost)"), std::string::npos);   // worker 1 is not alive
  EXPECT_NE(dom.find("101,770"), std::string::npos);     // the shard's keys
  EXPECT_EQ(dom.find("id=\"unreachable\" class=\"shown\""), std::string::npos);
}

// Opened after the second epoch, the page draws the run from its start:
// the status server's /history, then its own polls.
TEST(LivePageInBrowser, OpenedLateItDrawsTheWholeRunFromTheHistory) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  nlohmann::json history = {{"points", nlohmann::json::array()}};
  for (int i = 0; i < 40; ++i)  // two epochs of 20 s, a point a second; evaluated after the first
    history["points"].push_back({{"t", 0.5 + i}, {"rate", 9000 + 10 * i}, {"loss", 1.0 - 0.02 * i},
                                 {"acc", i < 20 ? nlohmann::json(nullptr) : nlohmann::json(0.97)},
                                 {"epoch", i < 20 ? 1 : 2}});
  std::atomic<int> polls{0};
  TinyHttpServer server([&](const std::string& path) {
    if (path == "/") return Reply{200, "text/html; charset=utf-8", asgd::pages::live_status_page_html()};
    if (path == "/history") return Reply{200, "application/json", history.dump()};
    if (path == "/status") {
      auto s = status_at(41.0 + polls++);
      s["val_accuracy"] = 0.99;
      return Reply{200, "application/json", s.dump()};
    }
    return Reply{404, "text/plain", "not found"};
  });
  const std::string dom = dump_dom(chromium, "http://127.0.0.1:" + std::to_string(server.port()) + "/", 2500);
  const nlohmann::json s = render_status(dom);
  EXPECT_EQ(s["errors"], nlohmann::json::array()) << s.dump(2);
  for (const auto& chart : s["charts"]) {
    if (chart["id"] == "rate" || chart["id"] == "loss") {
      EXPECT_GE(chart["points"].get<int>(), 41) << "both epochs, then the polls: " << chart.dump();
    }
    if (chart["id"] == "acc") {
      EXPECT_GE(chart["points"].get<int>(), 21) << chart.dump();
      EXPECT_EQ(chart["y_max"], 1) << "accuracy never reads above 1: " << chart.dump();
    }
  }
}

TEST(LivePageInBrowser, SaysJobNotReachableWhenStatusFailsAndKeepsPolling) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  std::atomic<int> polls{0};
  TinyHttpServer server([&](const std::string& path) {
    if (path == "/") return Reply{200, "text/html; charset=utf-8", asgd::pages::live_status_page_html()};
    ++polls;
    return Reply{503, "text/plain", "gone"};
  });
  const std::string dom = dump_dom(chromium, "http://127.0.0.1:" + std::to_string(server.port()) + "/", 2500);
  const nlohmann::json s = render_status(dom);
  EXPECT_FALSE(s["reachable"].get<bool>()) << s.dump(2);
  EXPECT_GE(polls.load(), 2);
  EXPECT_NE(dom.find("id=\"unreachable\" class=\"shown\""), std::string::npos);
  EXPECT_NE(dom.find("job not reachable"), std::string::npos);
  // A failed fetch is the page's business, not a script error.
  for (const auto& e : s["errors"]) EXPECT_EQ(e.get<std::string>().find("TypeError"), std::string::npos) << e;
}

}  // namespace
