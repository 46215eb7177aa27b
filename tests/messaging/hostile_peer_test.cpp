// Strangers at the bound endpoint. Without --auth-keys anyone who can reach
// it can complete ZeroMQ's handshake; what such a peer may then make this
// process hold is bounded by the endpoint's part limit and connection
// limit, and every connection refused or dropped is counted and logged,
// while peers that simply leave are not.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "captured_log.hpp"
#include "messaging/bridge.hpp"
#include "messaging/hostile_peer.hpp"
#include "messaging/transport.hpp"
#include "messaging/wire.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

namespace asgd::messaging {
namespace {

using namespace std::chrono_literals;
using asgd_test::CapturedLog;
using asgd_test::eventually;
using asgd_test::RawConnection;
using asgd_test::resident_bytes;

constexpr std::uint64_t kAnnounced = 500ull << 20;  // the part each hostile peer says it is sending
constexpr std::size_t kSent = 64u << 20;            // how much of it each tries to send

Part text(std::string_view s) { return Part::copy_of(std::as_bytes(std::span(s.data(), s.size()))); }
std::string text_of(const Part& p) { return {reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size()}; }

// The first message `t` receives within 10 s, as text of its first part;
// "" when none came.
std::string next_text(Transport& t, std::chrono::milliseconds within = 10s) {
  auto in = t.receive(within);
  EXPECT_TRUE(in.ok()) << in.status().to_string();
  return in.ok() && *in ? text_of((**in).message.at(0)) : "";
}

// A transport bound to tcp loopback that takes control messages only.
struct Server {
  std::unique_ptr<Transport> transport;
  std::string endpoint;
  explicit Server(TransportLimits limits = control_only(), const std::string& where = "tcp://127.0.0.1:0") {
    transport = make_zmq_transport(limits, std::nullopt, "test");
    auto bound = transport->bind(where);
    EXPECT_TRUE(bound.ok()) << bound.status().to_string();
    if (bound.ok()) endpoint = *bound;
  }
  static TransportLimits control_only() {
    TransportLimits l;
    l.bound_max_part_bytes = largest_part(0);
    return l;
  }
  // A message from a well-behaved client arrives: the endpoint still serves.
  void serves_a_client(const std::string& what) const {
    auto client = make_zmq_transport();
    auto peer = client->connect(endpoint);
    ASSERT_TRUE(peer.ok()) << peer.status().to_string();
    ASSERT_TRUE(client->send(*peer, {text(what)}).value());
    EXPECT_EQ(next_text(*transport), what);
  }
};

// `n` hostile peers of `endpoint` (announce_and_stall).
std::size_t attack(const std::string& endpoint, int n, std::vector<RawConnection>& peers) {
  return asgd_test::announce_and_stall(endpoint, n, kAnnounced, kSent, peers);
}

TEST(HostilePeers, FourPeersThatAnnounceAHalfGigabytePartLeaveMemoryFlatAndAreCountedAndLogged) {
  CapturedLog log;
  Server s;
  s.serves_a_client("before");  // ZeroMQ's own buffers are in place before the baseline
  const std::size_t before = resident_bytes();
  std::vector<RawConnection> peers;
  const std::size_t taken = attack(s.endpoint, 4, peers);
  ASSERT_TRUE(eventually([&] { return s.transport->stats().refused == 4; })) << s.transport->stats().refused;
  const std::size_t after = resident_bytes();
  RecordProperty("resident_kb_before", std::to_string(before / 1024));
  RecordProperty("resident_kb_after", std::to_string(after / 1024));
  EXPECT_LE(after, before + before / 10) << "resident " << before / 1e6 << " MB -> " << after / 1e6 << " MB; "
                                         << taken / 1e6 << " MB taken from the peers";
  for (auto& p : peers) EXPECT_TRUE(p.closed_by_peer(5s)) << "the server dropped every one of them";
  EXPECT_EQ(s.transport->stats().refused_over_limit, 0u);
  s.serves_a_client("after");
  EXPECT_EQ(s.transport->stats().refused, 4u);
  s.transport.reset();  // its gatekeeper logs no more
  EXPECT_EQ(log.count("test: refused a connection from 127.0.0.1:"), 4u) << log.all();
  EXPECT_EQ(log.count("it began a part larger than this endpoint's limit of " + std::to_string(largest_part(0)) +
                      " bytes"),
            4u)
      << log.all();
}

// What the test above guards against: where the limit allows the part, the
// same peer makes the server hold what it sent.
TEST(HostilePeers, APartHalfSentUnderTheLimitIsHeldByTheServer) {
  Server s(TransportLimits{});
  s.serves_a_client("before");
  const std::size_t before = resident_bytes();
  std::vector<RawConnection> peers;
  const std::size_t taken = attack(s.endpoint, 1, peers);
  EXPECT_GT(taken, kSent / 2) << "the server read on";
  EXPECT_TRUE(eventually([&] { return resident_bytes() > before + kSent / 2; }))
      << "resident " << before / 1e6 << " MB -> " << resident_bytes() / 1e6 << " MB";
  EXPECT_EQ(s.transport->stats().refused, 0u);
}

TEST(HostilePeers, ConnectionsOverTheLimitAreClosedAtOnceAndCountedAndTheOthersKeepTheirs) {
  CapturedLog log;
  TransportLimits three = Server::control_only();
  three.bound_max_connections = 3;
  Server s(three);
  std::vector<RawConnection> held;
  for (int i = 0; i < 3; ++i) {
    held.emplace_back(s.endpoint);
    ASSERT_TRUE(held.back().null_handshake()) << "peer " << i;
  }
  std::vector<RawConnection> more;
  for (int i = 0; i < 5; ++i) more.emplace_back(s.endpoint);
  for (auto& p : more) EXPECT_TRUE(p.closed_by_peer(5s)) << "closed as one too many";
  EXPECT_TRUE(eventually([&] { return s.transport->stats().refused_over_limit == 5; }))
      << s.transport->stats().refused_over_limit;
  for (auto& p : held) EXPECT_FALSE(p.closed_by_peer(10ms)) << "the first three keep their connections";
  EXPECT_EQ(s.transport->stats().refused, 5u);
  EXPECT_EQ(log.count("test: refused a connection from 127.0.0.1:"), 5u) << log.all();
  EXPECT_EQ(log.count("more than 3 connections at once, this endpoint's limit"), 5u) << log.all();
  held.clear();  // room again
  EXPECT_TRUE(eventually([&] {
    RawConnection again(s.endpoint);
    return again.null_handshake() && !again.closed_by_peer(50ms);
  }));
}

TEST(HostilePeers, PeersThatLeaveAreNotRefused) {
  Server s;
  {
    // A ZeroMQ client that sends and goes, and one written by hand that
    // sends a whole message and hangs up.
    s.serves_a_client("hello");
    RawConnection raw(s.endpoint);
    ASSERT_TRUE(raw.null_handshake());
    const unsigned char hi[] = {0x00, 0x02, 'h', 'i'};  // a short, final frame
    ASSERT_TRUE(raw.send_all(hi, sizeof hi));
    EXPECT_EQ(next_text(*s.transport), "hi");
    RawConnection idle(s.endpoint);
    ASSERT_TRUE(idle.null_handshake());
  }
  // Then something that is not ZeroMQ: its refusal, counted after the
  // ends above, shows they were looked at.
  {
    RawConnection junk(s.endpoint);
    const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_TRUE(junk.send_all(http.data(), http.size()));
    EXPECT_TRUE(junk.closed_by_peer(5s));
  }
  ASSERT_TRUE(eventually([&] { return s.transport->stats().refused >= 1; }));
  std::this_thread::sleep_for(200ms);  // anything counted late would show now
  EXPECT_EQ(s.transport->stats().refused, 1u);
}

TEST(HostilePeers, NewLimitsListenAgainOnTheSameEndpointAndApplyToWhatConnectsThen) {
  const asgd_test::TempDir dir;
  for (const std::string& where : {std::string("tcp://127.0.0.1:0"), "ipc://" + (dir / "s").string()}) {
    TransportLimits tiny;
    tiny.bound_max_part_bytes = 1024;
    Server s(tiny, where);
    const std::string big(4096, 'x');
    {
      auto client = make_zmq_transport();
      auto peer = client->connect(s.endpoint);
      ASSERT_TRUE(peer.ok());
      ASSERT_TRUE(client->send(*peer, {text(big)}).value());
      ASSERT_TRUE(eventually([&] { return s.transport->stats().refused >= 1; })) << where;
    }
    ASSERT_TRUE(s.transport->set_bound_limits(8192, 16).ok()) << where;
    auto client = make_zmq_transport();
    auto peer = client->connect(s.endpoint);
    ASSERT_TRUE(peer.ok());
    ASSERT_TRUE(client->send(*peer, {text(big)}).value());
    EXPECT_EQ(next_text(*s.transport), big) << where;
    const std::uint64_t refused = s.transport->stats().refused;
    ASSERT_TRUE(client->send(*peer, {text(std::string(10000, 'y'))}).value());  // over the new limit
    EXPECT_TRUE(eventually([&] { return s.transport->stats().refused > refused; })) << where;
  }
}

TEST(HostilePeers, ABridgeCountsWhatItsEndpointRefused) {
  BridgeOptions o;
  o.listen = "tcp://127.0.0.1:0";
  o.name = "bridge";
  o.limits.bound_max_part_bytes = largest_part(0);
  auto bridge = Bridge::start(o, nullptr);
  ASSERT_TRUE(bridge.ok()) << bridge.status().to_string();
  ASSERT_TRUE((*bridge)->set_bound_limits(largest_part(1000), 2).ok());
  std::vector<RawConnection> peers;
  attack((*bridge)->endpoint(), 1, peers);
  for (int i = 0; i < 3; ++i) peers.emplace_back((*bridge)->endpoint());  // the third is over the limit
  EXPECT_TRUE(eventually([&] { return (*bridge)->stats().refused == 2; })) << (*bridge)->stats().refused;
  EXPECT_EQ((*bridge)->stats().refused_over_limit, 1u);
  EXPECT_EQ((*bridge)->stats().auth_rejected, 0u);
  (*bridge)->stop();
}

}  // namespace
}  // namespace asgd::messaging
