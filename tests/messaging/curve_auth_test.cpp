// CURVE keys and the authenticated transport: key files, the allow-list
// folder, and a ZeroMQ transport that admits only allowed keys, refuses and
// counts everyone else, and encrypts what it carries.

#include "messaging/curve_auth.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.hpp>

#include <atomic>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "captured_log.hpp"
#include "messaging/curve_keys.hpp"
#include "messaging/hostile_peer.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

namespace asgd::messaging {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kArrives = 10s;       // long enough for anything sent to arrive on a loaded machine
constexpr auto kNothingComes = 500ms;  // how long to listen before concluding nothing is coming

using asgd_test::curve_keypair;

CurveOptions curve(const CurveKeypair& own, std::vector<CurveKey> allowed) {
  return asgd_test::curve_options(own, std::move(allowed));
}

Part text(std::string_view s) { return Part::copy_of(std::as_bytes(std::span(s.data(), s.size()))); }
std::string text_of(const Part& p) { return {reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size()}; }

void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

using asgd_test::eventually;

using asgd_test::CapturedLog;

std::string bare(const std::string& endpoint) {
  auto s = split_server_key(endpoint);
  EXPECT_TRUE(s.ok());
  return s.ok() ? s->first : endpoint;
}

// ---------------------------------------------------------------------------
// Keys and key files.

TEST(CurveKeys, AKeyRoundTripsThroughZ85AndAnythingElseIsNotAKey) {
  ASSERT_TRUE(curve_supported());
  const CurveKeypair k = curve_keypair();
  const std::string z = to_z85(k.public_key);
  EXPECT_EQ(z.size(), 40u);
  EXPECT_EQ(from_z85(z), k.public_key);
  EXPECT_EQ(curve_public_key(k.secret_key).value(), k.public_key);
  EXPECT_FALSE(from_z85(z.substr(0, 39)));
  EXPECT_FALSE(from_z85(z + "0"));
  EXPECT_FALSE(from_z85(std::string(40, ' ')));
  EXPECT_FALSE(from_z85(std::string(39, 'a') + "~"));
  EXPECT_EQ(key_fingerprint(k.public_key), z.substr(0, 12));
}

TEST(CurveKeys, GeneratedFilesReadBackTheSecretIsOwnerOnlyAndNothingIsReplacedWithoutForce) {
  const asgd_test::TempDir dir;
  const fs::path keys = dir / "keys";
  const CurveKeypair k = curve_keypair();
  auto files = write_key_files(keys, "host-a", k, false);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  EXPECT_EQ(files->secret, keys / "host-a.key");
  EXPECT_EQ(files->public_, keys / "host-a.pub");
  struct stat st {};
  ASSERT_EQ(::stat(files->secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(keys.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "a folder created for a secret is its owner's only";

  auto secret = read_secret_key_file(files->secret);
  ASSERT_TRUE(secret.ok()) << secret.status().to_string();
  EXPECT_EQ(secret->secret_key, k.secret_key);
  EXPECT_EQ(secret->public_key, k.public_key);
  EXPECT_EQ(read_public_key_file(files->public_).value(), k.public_key);

  auto again = write_key_files(keys, "host-a", curve_keypair(), false);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(again.status().message().find("host-a.key exists"), std::string::npos) << again.status().message();
  EXPECT_EQ(read_public_key_file(files->public_).value(), k.public_key) << "the refused write changed nothing";

  const CurveKeypair replacement = curve_keypair();
  ASSERT_TRUE(write_key_files(keys, "host-a", replacement, true).ok());
  EXPECT_EQ(read_public_key_file(files->public_).value(), replacement.public_key);
  ASSERT_EQ(::stat(files->secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  for (const char* bad : {"", "../up", ".hidden", "a/b", "sp ace"})
    EXPECT_EQ(write_key_files(keys, bad, k, false).status().code(), StatusCode::invalid_argument) << bad;
}

TEST(CurveKeys, AKeyFileThatIsNotOneKeyIsRefusedNamingTheFileAndLine) {
  const asgd_test::TempDir dir;
  const std::string key = to_z85(curve_keypair().public_key);
  write(dir / "commented.pub", "# a comment\n\n  " + key + "  \r\n# another\n");
  EXPECT_TRUE(read_public_key_file(dir / "commented.pub").ok());

  write(dir / "two.pub", key + "\n" + key + "\n");
  write(dir / "none.pub", "# nothing here\n");
  // (Cut at the end: a Z85 key's first character is never '#', which would
  // make the line a comment, but its second one can be: 1 run in 85.)
  write(dir / "short.pub", "# c\n" + key.substr(0, key.size() - 1) + "\n");
  const std::pair<const char*, const char*> cases[] = {
      {"two.pub", "two.pub: line 2: a second key"},
      {"none.pub", "none.pub: holds no key"},
      {"short.pub", "short.pub: line 2 is not a CURVE key"},
  };
  for (const auto& [file, needle] : cases) {
    auto r = read_public_key_file(dir / file);
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  auto missing = read_secret_key_file(dir / "missing.key");
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
  EXPECT_NE(missing.status().message().find("missing.key"), std::string::npos);
  auto pub_as_secret = read_secret_key_file(dir / "commented.pub");
  EXPECT_NE(pub_as_secret.status().message().find("a public key file"), std::string::npos);
}

TEST(CurveKeys, AnAuthFolderAllowsEveryPubAndFindsThisProcesssOneKey) {
  const asgd_test::TempDir dir;
  const CurveKeypair self = curve_keypair(), other = curve_keypair(), coordinator = curve_keypair();
  ASSERT_TRUE(write_key_files(dir.path(), "self", self, false).ok());
  write(dir / "other.pub", to_z85(other.public_key) + "\n");
  auto o = load_auth_keys({dir.path().string(), "", ""});
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->public_key, self.public_key);
  EXPECT_EQ(o->secret_key, self.secret_key);
  EXPECT_EQ(o->allowed.size(), 2u);
  EXPECT_FALSE(o->server_key) << "no coordinator.pub, no --coordinator-key";

  write(dir / "coordinator.pub", to_z85(coordinator.public_key) + "\n");
  o = load_auth_keys({dir.path().string(), "", ""});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->server_key, coordinator.public_key);
  EXPECT_EQ(o->allowed.size(), 3u);

  // Several secret keys: which is ours must be said.
  ASSERT_TRUE(write_key_files(dir.path(), "second", curve_keypair(), false).ok());
  auto several = load_auth_keys({dir.path().string(), "", ""});
  EXPECT_EQ(several.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(several.status().message().find("several secret keys (second.key, self.key)"), std::string::npos)
      << several.status().message();
  o = load_auth_keys({dir.path().string(), (dir / "self.key").string(), ""});
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->public_key, self.public_key);

  // A broken .pub anywhere in the folder is an error, not a silent skip.
  write(dir / "broken.pub", "not a key\n");
  auto broken = load_auth_keys({dir.path().string(), (dir / "self.key").string(), ""});
  EXPECT_EQ(broken.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(broken.status().message().find("broken.pub"), std::string::npos) << broken.status().message();

  auto nowhere = load_auth_keys({(dir / "nowhere").string(), "", ""});
  EXPECT_EQ(nowhere.status().code(), StatusCode::not_found);
  EXPECT_NE(nowhere.status().message().find("no such folder"), std::string::npos);
  const asgd_test::TempDir empty("_empty");
  auto nobody = load_auth_keys({empty.path().string(), "", ""});
  EXPECT_NE(nobody.status().message().find("no *.pub file"), std::string::npos) << nobody.status().message();
}

TEST(CurveKeys, AnEndpointCarriesItsServersKeyAndGivesItBack) {
  const CurveKeypair k = curve_keypair();
  const std::string e = with_server_key("tcp://10.0.0.7:6000", k.public_key);
  auto s = split_server_key(e);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->first, "tcp://10.0.0.7:6000");
  EXPECT_EQ(s->second, k.public_key);
  s = split_server_key("ipc:///tmp/x");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->first, "ipc:///tmp/x");
  EXPECT_FALSE(s->second);
  EXPECT_EQ(split_server_key("tcp://h:1 curve:short").status().code(), StatusCode::invalid_argument);
}

TEST(CurveKeys, ALogBudgetLetsAFewLinesThroughAMinuteAndSaysHowManyItHeldBack) {
  LogBudget budget(3, std::chrono::minutes(1));
  const auto t0 = LogBudget::Clock::now();
  std::uint64_t left_out = 99;
  int logged = 0;
  for (int i = 0; i < 1000; ++i)
    if (budget.allow(t0 + std::chrono::milliseconds(i), left_out)) ++logged;
  EXPECT_EQ(logged, 3);
  EXPECT_EQ(left_out, 0u);
  EXPECT_EQ(budget.held_back(), 997u);
  ASSERT_TRUE(budget.allow(t0 + std::chrono::minutes(1) + std::chrono::seconds(1), left_out));
  EXPECT_EQ(left_out, 997u);
  EXPECT_EQ(budget.held_back(), 0u);
}

// ---------------------------------------------------------------------------
// The transport.

// A server with CURVE and the client keys it allows.
struct CurveLink {
  CurveKeypair server_keys = curve_keypair();
  CurveKeypair client_keys = curve_keypair();
  std::unique_ptr<Transport> server;
  std::string endpoint;  // as bound: carries the server's key
  explicit CurveLink(const std::string& where = "tcp://127.0.0.1:0") {
    server = make_zmq_transport({}, curve(server_keys, {client_keys.public_key}), "test");
    auto bound = server->bind(where);
    EXPECT_TRUE(bound.ok()) << bound.status().to_string();
    if (bound.ok()) endpoint = *bound;
  }
  std::unique_ptr<Transport> client(const CurveKeypair& keys) const {
    return make_zmq_transport({}, curve(keys, {server_keys.public_key}));
  }
};

// Everything `t` receives within `window`, as text of the first part.
std::vector<std::string> drain(Transport& t, std::chrono::milliseconds window) {
  std::vector<std::string> out;
  const auto until = Clock::now() + window;
  while (Clock::now() < until) {
    auto in = t.receive(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
    EXPECT_TRUE(in.ok());
    if (in.ok() && *in) out.push_back(text_of((**in).message.at(0)));
  }
  return out;
}

TEST(CurveTransport, AnAllowedClientIsAdmittedBothWaysAndCounted) {
  const asgd_test::TempDir dir;
  for (const std::string& where : std::vector<std::string>{"tcp://127.0.0.1:0", "ipc://" + (dir / "s").string()}) {
    CurveLink l(where);
    EXPECT_NE(l.endpoint.find(" curve:" + to_z85(l.server_keys.public_key)), std::string::npos) << l.endpoint;
    auto client = l.client(l.client_keys);
    auto peer = client->connect(l.endpoint);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    ASSERT_TRUE(client->send(*peer, {text("hello")}).value());
    auto in = l.server->receive(std::chrono::duration_cast<std::chrono::milliseconds>(kArrives));
    ASSERT_TRUE(in.ok() && *in) << where;
    EXPECT_EQ(text_of((**in).message.at(0)), "hello");
    ASSERT_TRUE(l.server->send((**in).from, {text("welcome")}).value());
    auto back = client->receive(std::chrono::duration_cast<std::chrono::milliseconds>(kArrives));
    ASSERT_TRUE(back.ok() && *back);
    EXPECT_EQ(text_of((**back).message.at(0)), "welcome");
    EXPECT_TRUE(eventually([&] { return l.server->stats().auth_accepted == 1; }));
    EXPECT_EQ(l.server->stats().auth_rejected, 0u);
  }
}

TEST(CurveTransport, AClientWithAKeyNotAllowedAndAPlainTextClientGetNothingThroughAndAreCountedAndLogged) {
  CapturedLog log;
  CurveLink l;
  const CurveKeypair rogue_keys = curve_keypair();
  auto rogue = l.client(rogue_keys);  // knows the server's key, holds a key the server does not allow
  auto plain = make_zmq_transport();
  auto good = l.client(l.client_keys);
  auto rogue_peer = rogue->connect(l.endpoint);
  auto plain_peer = plain->connect(bare(l.endpoint));
  auto good_peer = good->connect(l.endpoint);
  ASSERT_TRUE(rogue_peer.ok() && plain_peer.ok() && good_peer.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(rogue->send(*rogue_peer, {text("rogue")}).ok());
    EXPECT_TRUE(plain->send(*plain_peer, {text("plain")}).ok());
  }
  ASSERT_TRUE(good->send(*good_peer, {text("good")}).value());
  EXPECT_EQ(drain(*l.server, kNothingComes), std::vector<std::string>{"good"});
  EXPECT_TRUE(eventually([&] { return l.server->stats().auth_rejected >= 2; }))
      << "rejected " << l.server->stats().auth_rejected;
  EXPECT_EQ(l.server->stats().auth_accepted, 1u);
  EXPECT_FALSE(*rogue->receive(kNothingComes));
  EXPECT_FALSE(*plain->receive(10ms));
  rogue.reset();
  plain.reset();
  good.reset();
  l.server.reset();  // its gatekeeper thread logs no more
  EXPECT_GE(log.count("test: refused a connection from 127.0.0.1 with key " + key_fingerprint(rogue_keys.public_key) +
                      ": its key is not in the allow-list"),
            1u)
      << log.all();
  // The plain-text client fails before ZAP is asked (it hangs up, or the
  // server finds it is not a CURVE client): the line names its address and
  // port or, when it hung up before the server could read them (about one
  // run in 40 on the 2-core VM), the endpoint it came in on.
  EXPECT_GE(log.count("test: refused a connection from 127.0.0.1:") +
                log.count("test: refused a connection from a peer that left at once, on tcp://127.0.0.1:"),
            1u)
      << log.all();
}

// The client learns that the server refused its key (the server's ZAP
// answer comes back in the handshake), once per connection, naming it:
// the bridge tells whoever waits on that peer instead of letting them wait
// out their timeouts.
TEST(CurveTransport, AClientWhoseKeyIsRefusedIsToldOnceWhichConnectionAndWhy) {
  CurveLink l;
  auto rogue = l.client(curve_keypair());
  auto good = l.client(l.client_keys);
  ASSERT_TRUE(good->connect(l.endpoint).ok());
  auto rogue_peer = rogue->connect(l.endpoint);
  ASSERT_TRUE(rogue_peer.ok());
  EXPECT_TRUE(rogue->send(*rogue_peer, {text("rogue")}).ok());
  std::vector<Refusal> told;
  const auto until = Clock::now() + kArrives;
  while (told.empty() && Clock::now() < until) {
    auto in = rogue->receive(200ms);
    ASSERT_TRUE(in.ok());
    EXPECT_FALSE(*in);
    told = rogue->take_refusals();
  }
  ASSERT_EQ(told.size(), 1u) << "no refusal within " << kArrives.count() << " s";
  EXPECT_EQ(told[0].peer, *rogue_peer);
  EXPECT_EQ(told[0].endpoint, bare(l.endpoint));
  EXPECT_EQ(told[0].zap_status, 400);
  EXPECT_EQ(rogue->stats().refused_by_peers, 1u);
  // Once: nothing more is reported for that connection.
  EXPECT_TRUE(rogue->send(*rogue_peer, {text("rogue")}).ok());
  EXPECT_FALSE(*rogue->receive(300ms));
  EXPECT_TRUE(rogue->take_refusals().empty());
  EXPECT_EQ(rogue->stats().refused_by_peers, 1u);
  EXPECT_FALSE(*good->receive(10ms));
  EXPECT_TRUE(good->take_refusals().empty());
  EXPECT_EQ(good->stats().refused_by_peers, 0u);
}

TEST(CurveTransport, AFloodOfRefusedAttemptsIsCountedInFullButLogsOnlyAFewLines) {
  CapturedLog log;
  CurveLink l;
  constexpr int kRogues = 100;
  {
    // Plain-text peers that keep trying.
    zmq::context_t ctx;
    std::vector<zmq::socket_t> rogues;
    for (int i = 0; i < kRogues; ++i) {
      rogues.emplace_back(ctx, zmq::socket_type::dealer);
      rogues.back().set(zmq::sockopt::linger, 0);
      rogues.back().set(zmq::sockopt::reconnect_ivl, 10);
      rogues.back().connect(bare(l.endpoint));
    }
    // Each at least once; how often they retry is up to libzmq.
    EXPECT_TRUE(eventually([&] { return l.server->stats().auth_rejected >= kRogues; }))
        << "rejected " << l.server->stats().auth_rejected;
  }
  const std::uint64_t rejected = l.server->stats().auth_rejected;
  l.server.reset();
  const std::size_t lines = log.count("test: refused a connection");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 5u) << log.all();
  EXPECT_EQ(log.count("further refused connections were counted, not logged"), 1u) << log.all();
  EXPECT_GE(rejected, static_cast<std::uint64_t>(kRogues));
}

TEST(CurveTransport, FiftyConnectionsOfRandomBytesAreEachCountedOnceAndLoggedAFewTimes) {
  CapturedLog log;
  CurveLink l;
  constexpr int kConnections = 50;
  std::mt19937 random(17);
  for (int i = 0; i < kConnections; ++i) {
    asgd_test::RawConnection junk(bare(l.endpoint));
    ASSERT_GE(junk.fd(), 0);
    unsigned char bytes[64];
    for (auto& b : bytes) b = static_cast<unsigned char>(random());
    ASSERT_TRUE(junk.send_all(bytes, sizeof bytes));
  }  // each hangs up at once
  EXPECT_TRUE(eventually([&] { return l.server->stats().refused >= kConnections; }))
      << "refused " << l.server->stats().refused;
  std::this_thread::sleep_for(kNothingComes);  // a second count of any of them would show now
  EXPECT_EQ(l.server->stats().refused, static_cast<std::uint64_t>(kConnections));
  EXPECT_EQ(l.server->stats().auth_rejected, static_cast<std::uint64_t>(kConnections));
  // The endpoint still admits its client.
  auto good = l.client(l.client_keys);
  auto peer = good->connect(l.endpoint);
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(good->send(*peer, {text("good")}).value());
  EXPECT_EQ(drain(*l.server, kNothingComes), std::vector<std::string>{"good"});
  good.reset();
  l.server.reset();
  const std::size_t lines = log.count("test: refused a connection from ");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 5u) << log.all();
  EXPECT_EQ(log.count("further refused connections were counted, not logged"), 1u) << log.all();
}

TEST(CurveTransport, TwoTransportsInOneProcessEachKeepTheirOwnAllowList) {
  CurveLink a, b;  // each allows its own client key only
  auto client = make_zmq_transport({}, curve(a.client_keys, {a.server_keys.public_key, b.server_keys.public_key}));
  auto to_a = client->connect(a.endpoint);
  auto to_b = client->connect(b.endpoint);
  ASSERT_TRUE(to_a.ok() && to_b.ok());
  ASSERT_TRUE(client->send(*to_a, {text("for a")}).value());
  (void)client->send(*to_b, {text("for b")});
  EXPECT_EQ(drain(*a.server, kNothingComes), std::vector<std::string>{"for a"});
  EXPECT_TRUE(drain(*b.server, 10ms).empty());
  EXPECT_TRUE(eventually([&] { return b.server->stats().auth_rejected >= 1; }));
  EXPECT_EQ(a.server->stats().auth_rejected, 0u);
}

TEST(CurveTransport, AClientRefusesAServerItCannotAuthenticate) {
  CurveLink l;
  const CurveKeypair stranger = curve_keypair();
  // A server key outside the allow-list.
  auto wary = make_zmq_transport({}, curve(l.client_keys, {stranger.public_key}));
  auto r = wary->connect(l.endpoint);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("is not in the allow-list"), std::string::npos) << r.status().message();
  // No key at all.
  auto client = l.client(l.client_keys);
  r = client->connect(bare(l.endpoint));
  EXPECT_NE(r.status().message().find("the server's public key is not known"), std::string::npos)
      << r.status().message();
  // A default server key stands in for an endpoint that carries none.
  CurveOptions with_default = curve(l.client_keys, {l.server_keys.public_key});
  with_default.server_key = l.server_keys.public_key;
  auto defaulted = make_zmq_transport({}, with_default);
  auto ok = defaulted->connect(bare(l.endpoint));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  ASSERT_TRUE(defaulted->send(*ok, {text("hi")}).value());
  EXPECT_EQ(drain(*l.server, kNothingComes), std::vector<std::string>{"hi"});
  // A plain transport told of a CURVE server says what it lacks.
  r = make_zmq_transport()->connect(l.endpoint);
  EXPECT_NE(r.status().message().find("needs --auth-keys"), std::string::npos) << r.status().message();
}

// A TCP relay to `target_port` that keeps every byte it forwards: what
// someone on the wire between two processes sees.
class WireTap {
 public:
  explicit WireTap(int target_port) : target_(target_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listen_, 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~WireTap() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  int port() const { return port_; }
  std::string seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void run() {
    int client = -1;
    while (!stop_ && client < 0) {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) client = ::accept(listen_, nullptr, nullptr);
    }
    if (client < 0) return;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(target_));
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      char buf[65536];
      while (!stop_) {
        pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
        if (::poll(p, 2, 50) <= 0) continue;
        bool closed = false;
        for (int i = 0; i < 2; ++i) {
          if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
          const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
          if (n <= 0) {
            closed = true;
            break;
          }
          {
            std::lock_guard lock(mu_);
            seen_.append(buf, static_cast<std::size_t>(n));
          }
          (void)!::write(i == 0 ? server : client, buf, static_cast<std::size_t>(n));
        }
        if (closed) break;
      }
    }
    ::close(server);
    ::close(client);
  }

  int target_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string seen_;
  std::thread thread_;
};

TEST(CurveTransport, WhatCrossesTheWireIsEncrypted) {
  const std::string secret = "gradient-values-nobody-else-should-read-0123456789";
  for (const bool with_curve : {false, true}) {
    const CurveKeypair server_keys = curve_keypair(), client_keys = curve_keypair();
    auto server =
        with_curve ? make_zmq_transport({}, curve(server_keys, {client_keys.public_key})) : make_zmq_transport();
    auto bound = server->bind("tcp://127.0.0.1:0");
    ASSERT_TRUE(bound.ok());
    const std::string at = bare(*bound);
    WireTap tap(std::stoi(at.substr(at.rfind(':') + 1)));
    const std::string via = "tcp://127.0.0.1:" + std::to_string(tap.port());
    auto client =
        with_curve ? make_zmq_transport({}, curve(client_keys, {server_keys.public_key})) : make_zmq_transport();
    auto peer = client->connect(with_curve ? with_server_key(via, server_keys.public_key) : via);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    ASSERT_TRUE(client->send(*peer, {text(secret)}).value());
    auto in = server->receive(std::chrono::duration_cast<std::chrono::milliseconds>(kArrives));
    ASSERT_TRUE(in.ok() && *in) << "through the tap, curve " << with_curve;
    EXPECT_EQ(text_of((**in).message.at(0)), secret);
    ASSERT_TRUE(server->send((**in).from, {text("reply:" + secret)}).value());
    auto back = client->receive(std::chrono::duration_cast<std::chrono::milliseconds>(kArrives));
    ASSERT_TRUE(back.ok() && *back);
    const std::string wire = tap.seen();
    EXPECT_GT(wire.size(), 2 * secret.size());
    if (with_curve)
      EXPECT_EQ(wire.find(secret), std::string::npos) << "the payload crossed the wire in the clear";
    else
      EXPECT_NE(wire.find(secret), std::string::npos) << "without CURVE the tap should see it: the tap is broken";
    client.reset();
    server.reset();
  }
}

}  // namespace
}  // namespace asgd::messaging
