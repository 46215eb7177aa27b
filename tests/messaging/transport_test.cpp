// The transport seen from its callers: ZeroMQ over inproc, ipc and tcp
// loopback, and the fault-injecting wrapper around it. Waits are bounded
// receive() timeouts; nothing sleeps to synchronise.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include "messaging/transport.hpp"
#include "test_helpers.hpp"
#include "messaging/transport_helpers.hpp"

namespace asgd::messaging {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using namespace asgd::messaging::testing;

// A bytes owner that tells when it is freed.
struct TrackedFloats {
  std::vector<float> values;
  std::promise<void>* freed;
  ~TrackedFloats() { freed->set_value(); }
};

// A server that binds and a client connected to it, over one endpoint kind.
struct Link {
  std::unique_ptr<Transport> server;
  std::unique_ptr<Transport> client;
  std::string endpoint;  // as bound
  PeerId to_server;      // the client's id for the server
};

// The endpoints each test binds: inproc, ipc in a fresh folder, tcp loopback
// on port 0.
class TransportOver : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override {
    if (!ipc_dir_.empty()) std::filesystem::remove_all(ipc_dir_);
  }

  std::string endpoint() {
    const std::string& kind = GetParam();
    if (kind == "inproc") return "inproc://server";
    if (kind == "tcp") return "tcp://127.0.0.1:0";
    if (ipc_dir_.empty()) {
      // Short on purpose: an ipc path must fit in sockaddr_un (108 bytes).
      std::string tmpl = (std::filesystem::temp_directory_path() / "asgd_ipc_XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
      ipc_dir_ = tmpl;
    }
    return "ipc://" + (ipc_dir_ / "server").string();
  }

  // Over ipc and tcp the client is a second transport. Over inproc it cannot
  // be (inproc does not cross zmq contexts, and each transport has its own),
  // so the server connects to itself: its DEALER reaches its own ROUTER, and
  // the client's limits are the server's.
  Link link(TransportLimits server_limits = {}, TransportLimits client_limits = {}) {
    Link l;
    l.server = make_zmq_transport(server_limits);
    auto bound = l.server->bind(endpoint());
    EXPECT_TRUE(bound.ok()) << bound.status().to_string();
    if (!bound.ok()) return l;
    l.endpoint = *bound;
    if (GetParam() == "inproc") {
      auto id = l.server->connect(l.endpoint);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (id.ok()) l.to_server = *id;
      return l;
    }
    l.client = make_zmq_transport(client_limits);
    auto id = l.client->connect(l.endpoint);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (id.ok()) l.to_server = *id;
    return l;
  }

  static Transport& client_of(Link& l) { return l.client ? *l.client : *l.server; }

 private:
  std::filesystem::path ipc_dir_;
};

TEST_P(TransportOver, DeliversAMultipartMessageAndTheServerRepliesToTheIdItArrivedFrom) {
  Link l = link();
  ASSERT_FALSE(l.to_server.empty());
  Transport& client = client_of(l);
  EXPECT_EQ(l.to_server, "c:0");

  ASSERT_TRUE(sent(client, l.to_server, message_of({"hello", "", "world"})));
  auto in = next(*l.server);
  ASSERT_TRUE(in);
  EXPECT_TRUE(in->from.starts_with("r:")) << in->from;
  EXPECT_EQ(texts_of(in->message), (std::vector<std::string>{"hello", "", "world"}));

  ASSERT_TRUE(sent(*l.server, in->from, message_of({"pong"})));
  auto reply = next(client);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->from, "c:0");
  EXPECT_EQ(texts_of(reply->message), (std::vector<std::string>{"pong"}));

  EXPECT_EQ(l.server->stats().received, l.client ? 1u : 2u);
  EXPECT_EQ(client.stats().sent, l.client ? 1u : 2u);
}

TEST_P(TransportOver, CarriesASixteenMebibytePartIntactAndThenFreesTheSendersBuffer) {
  constexpr std::size_t kFloats = 4u << 20;  // (4Mi,) floats = 16 MiB
  std::promise<void> freed;
  auto done = freed.get_future();
  Link l = link();
  ASSERT_FALSE(l.to_server.empty());
  const float* sent_at = nullptr;
  {
    auto big = std::make_shared<TrackedFloats>();
    big->freed = &freed;
    big->values.resize(kFloats);
    sent_at = big->values.data();
    for (std::size_t i = 0; i < kFloats; ++i) big->values[i] = static_cast<float>(i) * 0.5f;
    Part part;
    part.bytes = std::as_bytes(std::span<const float>(big->values));
    part.owner = std::move(big);
    Message m;
    m.push_back(text("header"));
    m.push_back(std::move(part));
    m.push_back(text("trailer"));
    ASSERT_TRUE(sent(client_of(l), l.to_server, std::move(m)));
  }
  {
    auto in = next(*l.server);
    ASSERT_TRUE(in);
    ASSERT_EQ(in->message.size(), 3u);
    EXPECT_EQ(text_of(in->message[0]), "header");
    EXPECT_EQ(text_of(in->message[2]), "trailer");
    ASSERT_EQ(in->message[1].bytes.size(), kFloats * sizeof(float));
    // The receiver may write over a fresh receive buffer, not over the
    // sender's bytes that inproc hands over.
    EXPECT_EQ(in->message[1].exclusive, GetParam() != "inproc");
    EXPECT_EQ(in->message[1].bytes.data() == reinterpret_cast<const std::byte*>(sent_at), GetParam() == "inproc");
    std::vector<float> got(kFloats);
    std::memcpy(got.data(), in->message[1].bytes.data(), in->message[1].bytes.size());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kFloats; ++i) wrong += got[i] != static_cast<float>(i) * 0.5f;
    EXPECT_EQ(wrong, 0u);
  }
  // Over tcp and ipc the buffer is freed once written; over inproc the
  // receiver held the same bytes until it let go of the message above.
  EXPECT_EQ(done.wait_for(kArrives), std::future_status::ready);
}

TEST_P(TransportOver, DropsAndCountsAMessageOverTheLimitsAndStillDeliversTheNextOne) {
  TransportLimits tight;
  tight.max_parts = 2;
  tight.max_message_bytes = 1024;
  Link l = link(tight);
  ASSERT_FALSE(l.to_server.empty());
  Transport& client = client_of(l);
  const std::string half(600, 'x');
  const std::string exact(512, 'y');

  ASSERT_TRUE(sent(client, l.to_server, message_of({"a", "b", "c"})));  // too many parts
  ASSERT_TRUE(sent(client, l.to_server, message_of({half, half})));     // too many bytes in sum
  ASSERT_TRUE(sent(client, l.to_server, message_of({exact, exact})));   // exactly at both limits
  ASSERT_TRUE(sent(client, l.to_server, message_of({"good"})));

  auto at_limit = next(*l.server);
  ASSERT_TRUE(at_limit);
  EXPECT_EQ(texts_of(at_limit->message), (std::vector<std::string>{exact, exact}));
  auto good = next(*l.server);
  ASSERT_TRUE(good);
  EXPECT_EQ(texts_of(good->message), (std::vector<std::string>{"good"}));
  EXPECT_EQ(l.server->stats().dropped_oversized, 2u);
  EXPECT_EQ(l.server->stats().received, 2u);
}

TEST_P(TransportOver, ReportsWouldBlockAsFalseWhenTheServersQueueIsFullAndDeliversEveryAcceptedMessage) {
  TransportLimits tiny;
  tiny.send_high_water_mark = 1;
  tiny.receive_high_water_mark = 1;
  Link l = link(tiny, tiny);
  ASSERT_FALSE(l.to_server.empty());
  Transport& client = client_of(l);

  // One shared 256 KiB buffer: kernel socket buffers fill after a few dozen.
  auto payload = std::make_shared<std::vector<std::byte>>(256u << 10, std::byte{7});
  const Part body{payload, std::span<const std::byte>(*payload)};
  constexpr int kBound = 10000;
  int accepted = 0;
  bool would_block = false;
  while (accepted < kBound) {
    auto r = client.send(l.to_server, Message{text(std::to_string(accepted)), body});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (!*r) {
      would_block = true;
      break;
    }
    ++accepted;
  }
  ASSERT_TRUE(would_block) << "still accepting after " << kBound << " messages";

  // Every accepted message arrives, in order, and the refused one does not.
  for (int i = 0; i < accepted; ++i) {
    auto in = next(*l.server);
    ASSERT_TRUE(in) << "message " << i << " of " << accepted;
    ASSERT_EQ(in->message.size(), 2u);
    EXPECT_EQ(text_of(in->message[0]), std::to_string(i));
  }
  EXPECT_FALSE(next(*l.server, kNothingComes));
  // With the queue drained, the same send is accepted again.
  EXPECT_TRUE(sent(client, l.to_server, Message{text("again"), body}));
  auto again = next(*l.server);
  ASSERT_TRUE(again);
  EXPECT_EQ(text_of(again->message[0]), "again");
}

TEST_P(TransportOver, ReportsWouldBlockAsFalseWhenTheServerRepliesToAClientThatDoesNotRead) {
  TransportLimits tiny;
  tiny.send_high_water_mark = 1;
  tiny.receive_high_water_mark = 1;
  Link l = link(tiny, tiny);
  ASSERT_FALSE(l.to_server.empty());
  ASSERT_TRUE(sent(client_of(l), l.to_server, message_of({"hi"})));
  auto hello = next(*l.server);
  ASSERT_TRUE(hello);

  auto payload = std::make_shared<std::vector<std::byte>>(256u << 10, std::byte{9});
  const Part body{payload, std::span<const std::byte>(*payload)};
  bool would_block = false;
  for (int i = 0; i < 10000 && !would_block; ++i) {
    auto r = l.server->send(hello->from, Message{body});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    would_block = !*r;
  }
  EXPECT_TRUE(would_block);
}

// send_now() from another thread while the owning thread waits in
// receive(): libzmq handles a socket's pending news in every call on it, so
// a send can take the very signal that a reply came, which the owner's wait
// was to wake on (and libzmq signals a reader only when its queue was
// empty: the replies behind it do not signal either). Requests go out while
// replies to earlier ones arrive, up to 32 in flight. Every reply must
// come, in order, without the owner sleeping through it (a lost wake-up
// costs the owner's whole wait, 30 s here, against the 5 s the replies are
// given).
TEST_P(TransportOver, SendNowFromAnotherThreadWhileTheOwnerWaitsLosesNoMessageAndNoWakeUp) {
  Link l = link();
  ASSERT_FALSE(l.to_server.empty());
  Transport& client = client_of(l);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> replies;
  std::atomic<bool> stop{false};
  // Answers what reached the bound endpoint, and keeps what came back on
  // the connection (over inproc one transport does both).
  auto owner = [&](Transport& t) {
    while (!stop.load()) {
      auto r = t.receive(30s);
      if (!r.ok() || !*r) continue;
      Incoming& in = **r;
      if (in.from.starts_with("r:")) {
        (void)t.send(in.from, Message{text("re " + text_of(in.message.at(0)))});
        continue;
      }
      std::lock_guard lock(mu);
      replies.push_back(text_of(in.message.at(0)));
      cv.notify_all();
    }
  };
  std::vector<std::thread> owners;
  owners.emplace_back(owner, std::ref(client));
  if (l.client) owners.emplace_back(owner, std::ref(*l.server));

  constexpr int kTrips = 5000;
  constexpr std::size_t kInFlight = 32;
  int sent_now = 0;
  bool late = false;
  for (int i = 0; i < kTrips && !late; ++i) {
    sent_now += client.send_now(l.to_server, Message{text(std::to_string(i))});
    std::unique_lock lock(mu);
    late = !cv.wait_for(lock, 5s, [&] { return static_cast<std::size_t>(i + 1) <= replies.size() + kInFlight; });
  }
  {
    std::unique_lock lock(mu);
    late = late || !cv.wait_for(lock, 5s, [&] { return replies.size() >= static_cast<std::size_t>(sent_now); });
  }
  int answered = 0;
  for (std::size_t i = 0; i < replies.size(); ++i) answered += replies[i] == "re " + std::to_string(i);
  stop = true;
  client.wake();
  if (l.client) l.server->wake();
  for (auto& t : owners) t.join();
  EXPECT_FALSE(late) << replies.size() << " replies of " << sent_now;
  EXPECT_EQ(answered, sent_now) << "every message send_now took was answered, in order";
  EXPECT_EQ(sent_now, kTrips);
}

INSTANTIATE_TEST_SUITE_P(Endpoints, TransportOver, ::testing::Values("inproc", "ipc", "tcp"),
                         [](const auto& endpoint_kind) { return endpoint_kind.param; });

// libzmq itself refuses a frame over max_message_bytes (ZMQ_MAXMSGSIZE): over
// tcp and ipc it does so by closing the sender's connection, so that message
// (and whatever the sender had in flight behind it) is lost without being
// counted, and the sender reconnects as a new peer.
TEST(ZmqTransport, AFrameOverTheLimitOverTcpCostsTheSenderItsConnectionAndItReturnsUnderANewId) {
  TransportLimits tight;
  tight.max_message_bytes = 1024;
  auto server = make_zmq_transport(tight);
  auto bound = server->bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok());
  auto client = make_zmq_transport();
  auto id = client->connect(*bound);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sent(*client, *id, message_of({"before"})));
  auto before = next(*server);
  ASSERT_TRUE(before);

  ASSERT_TRUE(sent(*client, *id, message_of({std::string(2000, 'x')})));
  std::optional<Incoming> after;
  for (int i = 0; i < 200 && !after; ++i) {
    ASSERT_TRUE(sent(*client, *id, message_of({"after"})));
    after = next(*server, 20ms);
  }
  ASSERT_TRUE(after) << "the client never came back";
  EXPECT_EQ(texts_of(after->message), (std::vector<std::string>{"after"}));
  EXPECT_NE(after->from, before->from);
  EXPECT_EQ(server->send(before->from, message_of({"gone"})).status().code(), StatusCode::not_found);
  EXPECT_TRUE(asgd_test::eventually([&] { return server->stats().refused == 1; }))
      << "the dropped connection is counted: " << server->stats().refused;
}

TEST(ZmqTransport, PassesALargePartOverInprocWithoutCopyingItAndFreesItWhenTheReceiverLetsGo) {
  std::promise<void> freed;
  auto done = freed.get_future();
  auto t = make_zmq_transport();
  ASSERT_TRUE(t->bind("inproc://zero-copy").ok());
  auto self = t->connect("inproc://zero-copy");
  ASSERT_TRUE(self.ok());
  const std::byte* original = nullptr;
  {
    auto big = std::make_shared<TrackedFloats>();
    big->freed = &freed;
    big->values.assign(1u << 20, 1.5f);
    Part part;
    part.bytes = std::as_bytes(std::span<const float>(big->values));
    part.owner = std::move(big);
    original = part.bytes.data();
    ASSERT_TRUE(sent(*t, *self, Message{std::move(part)}));
  }
  {
    auto in = next(*t);
    ASSERT_TRUE(in);
    ASSERT_EQ(in->message.size(), 1u);
    EXPECT_EQ(in->message[0].bytes.data(), original);
    EXPECT_EQ(done.wait_for(0s), std::future_status::timeout) << "freed while the receiver still holds it";
  }
  EXPECT_EQ(done.wait_for(0s), std::future_status::ready);
}

TEST(ZmqTransport, BindsTcpPortZeroToARealPortThatClientsCanReach) {
  auto server = make_zmq_transport();
  auto bound = server->bind("tcp://*:0");
  ASSERT_TRUE(bound.ok()) << bound.status().to_string();
  const std::string port = bound->substr(bound->rfind(':') + 1);
  EXPECT_NE(port, "0");
  EXPECT_GT(std::stoi(port), 0);

  auto client = make_zmq_transport();
  auto id = client->connect("tcp://127.0.0.1:" + port);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sent(*client, *id, message_of({"reached"})));
  auto in = next(*server);
  ASSERT_TRUE(in);
  EXPECT_EQ(texts_of(in->message), (std::vector<std::string>{"reached"}));
}

TEST(ZmqTransport, TwoTransportsInOneProcessAreIndependent) {
  // Each has its own context, so both can bind the same inproc name and
  // each one's connection reaches only its own server.
  auto a = make_zmq_transport();
  auto b = make_zmq_transport();
  ASSERT_TRUE(a->bind("inproc://same").ok());
  ASSERT_TRUE(b->bind("inproc://same").ok());
  auto to_a = a->connect("inproc://same");
  auto to_b = b->connect("inproc://same");
  ASSERT_TRUE(to_a.ok());
  ASSERT_TRUE(to_b.ok());
  EXPECT_EQ(*to_a, "c:0");
  EXPECT_EQ(*to_b, "c:0");
  ASSERT_TRUE(sent(*a, *to_a, message_of({"for a"})));
  ASSERT_TRUE(sent(*b, *to_b, message_of({"for b"})));

  auto in_a = next(*a);
  ASSERT_TRUE(in_a);
  EXPECT_EQ(texts_of(in_a->message), (std::vector<std::string>{"for a"}));
  b.reset();  // closing one leaves the other working
  EXPECT_FALSE(next(*a, kNothingComes));
  ASSERT_TRUE(sent(*a, *to_a, message_of({"still here"})));
  auto again = next(*a);
  ASSERT_TRUE(again);
  EXPECT_EQ(texts_of(again->message), (std::vector<std::string>{"still here"}));
  EXPECT_EQ(a->stats().sent, 2u);
  EXPECT_EQ(a->stats().received, 2u);
}

TEST(ZmqTransport, ReportsNotFoundForAPeerItDoesNotKnow) {
  auto t = make_zmq_transport();
  EXPECT_EQ(t->send("r:0080000001", message_of({"x"})).status().code(), StatusCode::not_found);  // nothing bound
  ASSERT_TRUE(t->bind("inproc://lonely").ok());
  for (const char* peer : {"r:0080000001", "r:zz", "r:", "c:0", "c:", "c:1x", "someone"}) {
    auto r = t->send(peer, message_of({"x"}));
    EXPECT_EQ(r.status().code(), StatusCode::not_found) << peer << ": " << r.status().to_string();
  }
  // A peer that was there once but has gone is not found either.
  auto client = make_zmq_transport();
  auto bound = t->bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok());
  auto id = client->connect(*bound);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sent(*client, *id, message_of({"hi"})));
  auto hello = next(*t);
  ASSERT_TRUE(hello);
  client.reset();
  // Disconnection is noticed by libzmq's I/O thread; poll until it is.
  Result<bool> r = true;
  for (int i = 0; i < 100 && r.ok(); ++i) {
    r = t->send(hello->from, message_of({"anyone?"}));
    if (r.ok()) {
      EXPECT_FALSE(next(*t, 20ms));
    }
  }
  EXPECT_EQ(r.status().code(), StatusCode::not_found) << r.status().to_string();
  EXPECT_NE(r.status().message().find(hello->from), std::string::npos) << r.status().message();
}

TEST(ZmqTransport, RefusesAMalformedEndpointAndAnEmptyMessageAsInvalidArguments) {
  auto t = make_zmq_transport();
  EXPECT_EQ(t->connect("nonsense").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(t->connect("carrier-pigeon://home").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(t->connect("tcp://127.0.0.1").status().code(), StatusCode::invalid_argument);
  auto id = t->connect("inproc://later");  // inproc may connect before the bind
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "c:0");
  EXPECT_EQ(t->send(*id, Message{}).status().code(), StatusCode::invalid_argument);
}

TEST(ZmqTransport, ReportsAnIoErrorNamingTheEndpointWhenItCannotBind) {
  auto first = make_zmq_transport();
  auto bound = first->bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok());
  auto second = make_zmq_transport();
  auto again = second->bind(*bound);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::io_error);
  EXPECT_NE(again.status().message().find(*bound), std::string::npos) << again.status().message();
}

// A zmq server and a faulty client connected to it over tcp loopback (two
// transports have two contexts, which inproc cannot cross).
struct FaultyLink {
  std::unique_ptr<Transport> server;
  std::unique_ptr<Transport> client;
  PeerId to_server;
};

FaultyLink faulty_link(FaultPlan plan) {
  FaultyLink l;
  l.server = make_zmq_transport();
  auto bound = l.server->bind("tcp://127.0.0.1:0");
  EXPECT_TRUE(bound.ok()) << bound.status().to_string();
  l.client = make_faulty_transport(make_zmq_transport(), plan);
  if (!bound.ok()) return l;
  auto id = l.client->connect(*bound);
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  if (id.ok()) l.to_server = *id;
  return l;
}

// Sends "0", "1", ... through the faulty client and returns what the server
// got: exactly as many messages as the faulty client handed to the wire.
std::vector<std::string> deliver(FaultyLink& l, int n) {
  for (int i = 0; i < n; ++i) EXPECT_TRUE(sent(*l.client, l.to_server, message_of({std::to_string(i)})));
  std::vector<std::string> got;
  const auto on_wire = l.client->stats().sent;
  for (std::uint64_t i = 0; i < on_wire; ++i) {
    auto in = next(*l.server);
    if (!in) break;
    got.push_back(text_of(in->message.at(0)));
  }
  return got;
}

std::vector<std::string> numbers(std::initializer_list<int> ns) {
  std::vector<std::string> out;
  for (int n : ns) out.push_back(std::to_string(n));
  return out;
}

TEST(FaultyTransport, WithoutFaultsPassesEverythingThroughInOrder) {
  FaultyLink l = faulty_link({});
  ASSERT_FALSE(l.to_server.empty());
  EXPECT_EQ(deliver(l, 4), numbers({0, 1, 2, 3}));
  const TransportStats s = l.client->stats();
  EXPECT_EQ(s.sent, 4u);
  EXPECT_EQ(s.injected_drops + s.injected_duplicates + s.injected_reorders + s.injected_delays, 0u);
}

TEST(FaultyTransport, WithDropOneDropsEveryMessageButSaysItWasQueued) {
  FaultPlan plan;
  plan.drop = 1.0;
  FaultyLink l = faulty_link(plan);
  ASSERT_FALSE(l.to_server.empty());
  EXPECT_TRUE(deliver(l, 10).empty());
  EXPECT_FALSE(next(*l.server, kNothingComes));
  EXPECT_EQ(l.client->stats().injected_drops, 10u);
  EXPECT_EQ(l.client->stats().sent, 0u);
}

TEST(FaultyTransport, WithDuplicateOneDeliversEveryMessageTwice) {
  FaultPlan plan;
  plan.duplicate = 1.0;
  FaultyLink l = faulty_link(plan);
  ASSERT_FALSE(l.to_server.empty());
  EXPECT_EQ(deliver(l, 3), numbers({0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(l.client->stats().injected_duplicates, 3u);
}

TEST(FaultyTransport, WithReorderOneSwapsEachPairOfMessages) {
  FaultPlan plan;
  plan.reorder = 1.0;
  plan.delay_by = 1h;  // a held message waits for the next one, however slow the test
  FaultyLink l = faulty_link(plan);
  ASSERT_FALSE(l.to_server.empty());
  EXPECT_EQ(deliver(l, 4), numbers({1, 0, 3, 2}));
  EXPECT_EQ(l.client->stats().injected_reorders, 2u);
}

TEST(FaultyTransport, SendsAHeldMessageFromReceiveWhenNoNextOneComes) {
  FaultPlan plan;
  plan.reorder = 1.0;
  plan.delay_by = 30ms;
  FaultyLink l = faulty_link(plan);
  ASSERT_FALSE(l.to_server.empty());
  ASSERT_TRUE(sent(*l.client, l.to_server, message_of({"alone"})));
  EXPECT_FALSE(next(*l.server, 0ms));  // held until the client is called again
  std::optional<Incoming> in;
  const auto give_up = Clock::now() + kArrives;
  while (!in && Clock::now() < give_up) {
    EXPECT_FALSE(next(*l.client, 10ms));
    in = next(*l.server, 10ms);
  }
  ASSERT_TRUE(in);
  EXPECT_EQ(texts_of(in->message), (std::vector<std::string>{"alone"}));
}

TEST(FaultyTransport, WithDelayOneDeliversEveryMessageLateButDeliversIt) {
  FaultPlan plan;
  plan.delay = 1.0;
  plan.delay_by = 100ms;
  FaultyLink l = faulty_link(plan);
  ASSERT_FALSE(l.to_server.empty());
  const auto start = Clock::now();
  ASSERT_TRUE(sent(*l.client, l.to_server, message_of({"late"})));
  EXPECT_EQ(l.client->stats().sent, 0u);
  ASSERT_TRUE(sent(*l.client, l.to_server, message_of({"later"})));
  EXPECT_EQ(l.client->stats().injected_delays, 2u);

  // Only the client's own calls send; receive() waits until each is due.
  std::vector<std::string> got;
  const auto give_up = start + kArrives;
  while (got.size() < 2 && Clock::now() < give_up) {
    EXPECT_FALSE(next(*l.client, 10ms));
    if (auto in = next(*l.server, 10ms)) {
      EXPECT_GE(Clock::now() - start, plan.delay_by);
      got.push_back(text_of(in->message.at(0)));
    }
  }
  EXPECT_EQ(got, (std::vector<std::string>{"late", "later"}));
}

TEST(FaultyTransport, SendsADelayedMessageWhenItIsDueDuringALongReceive) {
  FaultPlan plan;
  plan.delay = 1.0;
  plan.delay_by = 50ms;
  FaultyLink l = faulty_link(plan);
  ASSERT_FALSE(l.to_server.empty());
  // The server echoes from its own thread (each transport has one owner).
  std::thread echo([server = l.server.get()] {
    auto in = next(*server);
    if (in) {
      EXPECT_TRUE(sent(*server, in->from, std::move(in->message)));
    }
  });
  const auto start = Clock::now();
  EXPECT_TRUE(sent(*l.client, l.to_server, message_of({"echo me"})));
  // One receive call: the delayed message must leave during it, or no echo
  // can come back before its timeout.
  auto back = next(*l.client, kArrives);
  const auto took = Clock::now() - start;
  echo.join();
  ASSERT_TRUE(back);
  EXPECT_EQ(texts_of(back->message), (std::vector<std::string>{"echo me"}));
  EXPECT_GE(took, plan.delay_by);
  EXPECT_LT(took, kArrives / 2);
}

TEST(FaultyTransport, GivesTheSameFaultsForTheSameSeed) {
  FaultPlan plan;
  plan.drop = 0.2;
  plan.duplicate = 0.2;
  plan.reorder = 0.3;
  plan.delay_by = 1h;
  plan.seed = 42;
  auto run = [](FaultPlan p) {
    FaultyLink l = faulty_link(p);
    auto got = deliver(l, 200);
    const TransportStats s = l.client->stats();
    return std::make_pair(got, std::vector<std::uint64_t>{s.sent, s.injected_drops, s.injected_duplicates,
                                                          s.injected_reorders});
  };
  const auto first = run(plan);
  const auto second = run(plan);
  EXPECT_EQ(first, second);
  EXPECT_GT(first.second[1], 0u);
  EXPECT_GT(first.second[2], 0u);
  EXPECT_GT(first.second[3], 0u);
  plan.seed = 43;
  EXPECT_NE(run(plan).first, first.first);
}

TEST(FaultyTransport, PassesBindConnectAndReceiveThroughToTheTransportItWraps) {
  FaultPlan plan;
  plan.drop = 1.0;  // only sending is affected
  auto server = make_faulty_transport(make_zmq_transport(), plan);
  auto bound = server->bind("inproc://wrapped");
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(*bound, "inproc://wrapped");
  auto self = server->connect(*bound);
  ASSERT_TRUE(self.ok());
  EXPECT_EQ(*self, "c:0");
  EXPECT_TRUE(sent(*server, *self, message_of({"dropped"})));
  EXPECT_FALSE(next(*server, kNothingComes));
  EXPECT_EQ(server->stats().injected_drops, 1u);
}

}  // namespace
}  // namespace asgd::messaging
