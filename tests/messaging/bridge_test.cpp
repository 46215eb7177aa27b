// The bridge end to end: a worker-side remote_shard talking through a
// transport that duplicates, reorders and delays frames to a real shard
// actor behind a shard_server.

#include "messaging/bridge.hpp"

#include <gtest/gtest.h>

#include <ctime>
#include <future>
#include <thread>

#include "actors/parameter_shard.hpp"
#include "messaging/served_shard.hpp"
#include "test_helpers.hpp"

namespace asgd::messaging {
namespace {

// A worker's side of a served shard: its bridge (over `transport`; null:
// ZeroMQ) and the remote_shard standing in for the shard.
struct WorkerSide {
  std::shared_ptr<Bridge> bridge;
  caf::actor remote;
};

Result<WorkerSide> worker_side_of(caf::actor_system& sys, const asgd_test::ServedShard& served, BridgeOptions options,
                                  std::unique_ptr<Transport> transport = nullptr) {
  auto bridge = Bridge::start(std::move(options), nullptr, std::move(transport));
  if (!bridge) return bridge.status();
  auto peer = (*bridge)->connect(served.bridge->endpoint());
  if (!peer) return peer.status();
  return WorkerSide{*bridge, sys.spawn(remote_shard, *bridge, *peer, 0u)};
}

// Push k of a gradient of `n` ones; its reply (empty after a failure, which
// the test records).
ShardReply push_ones(caf::scoped_actor& self, const caf::actor& remote, int k, std::size_t n) {
  PushRequest req{0, static_cast<Clock>(k), static_cast<Clock>(k), 1, true, std::vector<float>(n, 1.0f)};
  ShardReply reply;
  self->request(remote, std::chrono::seconds(10), push_atom::value, std::move(req))
      .receive([&](ShardReply& r) { reply = std::move(r); },
               [&](caf::error& e) { ADD_FAILURE() << "push " << k << ": " << self->system().render(e); });
  return reply;
}

TEST(Bridge, AShardBehindAFaultyNetworkAppliesEachPushExactlyOnceAndAnswersEveryOne) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  BridgeOptions so;
  so.name = "test shard";
  auto served = asgd_test::ServedShard::start(sys, 4, so);
  ASSERT_TRUE(served.ok()) << served.status().to_string();

  FaultPlan faults;
  faults.duplicate = 0.5;
  faults.reorder = 0.3;
  faults.delay = 0.3;
  faults.delay_by = std::chrono::milliseconds(5);
  faults.seed = 7;
  BridgeOptions wo;
  wo.name = "test worker";
  auto worker = worker_side_of(sys, *served, wo, make_faulty_transport(make_zmq_transport(), faults));
  ASSERT_TRUE(worker.ok()) << worker.status().to_string();
  auto& remote = worker->remote;

  caf::scoped_actor self{sys};
  constexpr int kPushes = 40;
  for (int k = 0; k < kPushes; ++k) {
    const ShardReply reply = push_ones(self, remote, k, 4);
    ASSERT_EQ(reply.params.size(), 4u);
    // sgd with lr 1 and a gradient of ones: exactly one step per push.
    EXPECT_EQ(reply.params[0], 100.0f - static_cast<float>(k + 1)) << "push " << k;
  }
  ShardStats stats;
  self->request(remote, std::chrono::seconds(10), stats_atom::value)
      .receive([&](ShardStats& s) { stats = std::move(s); }, [&](caf::error& e) { FAIL() << sys.render(e); });
  EXPECT_EQ(stats.updates_applied, static_cast<std::uint64_t>(kPushes));
  EXPECT_GT(stats.duplicate_requests, 0u) << "the fault plan duplicated no push: the test proves nothing";
  EXPECT_EQ(stats.malformed_frames, 0u);

  worker->bridge->stop();
  served->stop();
  self->send_exit(remote, caf::exit_reason::user_shutdown);
}

// A shard process serving one shard of `size` parameters (all 100) with
// sgd at lr 1, and a worker-side bridge connected to it.
struct BigShard {
  explicit BigShard(caf::actor_system& sys, std::size_t size, std::unique_ptr<Transport> worker_transport = nullptr) {
    BridgeOptions so;
    so.name = "test shard";
    auto s = asgd_test::ServedShard::start(sys, size, so);
    EXPECT_TRUE(s.ok());
    served = *s;
    shard_side = served.bridge;
    BridgeOptions wo;
    wo.name = "test worker";
    auto w = Bridge::start(wo, nullptr, std::move(worker_transport));
    EXPECT_TRUE(w.ok());
    worker_side = *w;
    auto p = worker_side->connect(shard_side->endpoint());
    EXPECT_TRUE(p.ok());
    peer = *p;
    remote = sys.spawn(remote_shard, worker_side, peer, 0u);
  }
  ~BigShard() {
    worker_side->stop();
    served.stop();
    caf::anon_send_exit(remote, caf::exit_reason::user_shutdown);
  }
  ShardStats stats(caf::scoped_actor& self) {
    ShardStats out;
    self->request(remote, std::chrono::seconds(10), stats_atom::value)
        .receive([&](ShardStats& st) { out = std::move(st); }, [&](caf::error&) { ADD_FAILURE() << "no stats"; });
    return out;
  }
  asgd_test::ServedShard served;
  caf::actor remote;
  std::shared_ptr<Bridge> shard_side, worker_side;
  PeerId peer;
};

// A shard process dies holding a push it never answered; its replacement
// listens elsewhere. reconnect() sends the push there, once, and the
// worker's request is answered as if nothing had happened.
TEST(Bridge, AReconnectSendsTheUnansweredRequestsToTheRestartedShardOnce) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  BridgeOptions dying_options;
  dying_options.listen = "tcp://127.0.0.1:0";
  dying_options.name = "dying shard";
  auto dying = Bridge::start(dying_options, [](Inbound&&) {});  // reads, never answers
  ASSERT_TRUE(dying.ok());
  BridgeOptions wo;
  wo.name = "test worker";
  auto worker_side = Bridge::start(wo, nullptr);
  ASSERT_TRUE(worker_side.ok());
  auto peer = (*worker_side)->connect((*dying)->endpoint());
  ASSERT_TRUE(peer.ok());
  auto remote = sys.spawn(remote_shard, *worker_side, *peer, 0u);
  auto answered = std::async(std::launch::async, [&] {
    caf::scoped_actor asker{sys};
    ShardReply reply;
    asker->request(remote, std::chrono::seconds(20), push_atom::value,
                   PushRequest{0, 0, 0, 1, true, {1.0f, 1.0f, 1.0f, 1.0f}})
        .receive([&](ShardReply& r) { reply = std::move(r); },
                 [&](caf::error& e) { ADD_FAILURE() << "the push was not answered: " << sys.render(e); });
    return reply;
  });
  ASSERT_TRUE(asgd_test::eventually([&] { return (*dying)->stats().frames_in >= 1; }));
  (*dying)->stop();

  BridgeOptions so;
  so.name = "restarted shard";
  auto restarted = asgd_test::ServedShard::start(sys, 4, so);
  ASSERT_TRUE(restarted.ok());

  auto resent = (*worker_side)->reconnect(*peer, restarted->bridge->endpoint());
  ASSERT_TRUE(resent.ok()) << resent.status().to_string();
  EXPECT_EQ(*resent, 1u);
  const ShardReply reply = answered.get();
  ASSERT_EQ(reply.params.size(), 4u);
  EXPECT_EQ(reply.params[0], 99.0f);  // one sgd step with lr 1
  caf::scoped_actor self{sys};
  self->request(remote, std::chrono::seconds(10), stats_atom::value)
      .receive([&](ShardStats& st) { EXPECT_EQ(st.updates_applied, 1u); },
               [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
  EXPECT_EQ((*worker_side)->stats().resent, 1u);
  EXPECT_FALSE((*worker_side)->reconnect("c:9", restarted->bridge->endpoint()).ok());

  (*worker_side)->stop();
  restarted->stop();
  self->send_exit(remote, caf::exit_reason::user_shutdown);
}

TEST(Bridge, AppliesABigPushFromTheBufferItArrivedInOncePerRequestAndAnswersWithCheckedParameters) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  // Over kBorrowFromBytes, so the shard reads the gradient where ZeroMQ put it.
  constexpr std::size_t kSize = 3 * kBorrowFromBytes / sizeof(float) + 5;
  FaultPlan faults;
  faults.duplicate = 0.5;  // a duplicate's buffer is read again after the first was applied
  faults.seed = 11;
  BigShard big(sys, kSize, make_faulty_transport(make_zmq_transport(), faults));
  caf::scoped_actor self{sys};
  constexpr int kPushes = 6;
  for (int k = 0; k < kPushes; ++k) {
    std::vector<float> g(kSize);
    for (std::size_t i = 0; i < kSize; ++i) g[i] = static_cast<float>(i % 5);
    PushRequest req{0, static_cast<Clock>(k), static_cast<Clock>(k), 1, true, std::move(g)};
    ShardReply reply;
    self->request(big.remote, std::chrono::seconds(10), push_atom::value, std::move(req))
        .receive([&](ShardReply& r) { reply = std::move(r); },
                 [&](caf::error& e) { FAIL() << "push " << k << ": " << sys.render(e); });
    ASSERT_EQ(reply.params.size(), kSize);
    for (std::size_t i = 0; i < kSize; i += 997)
      ASSERT_EQ(reply.params[i], 100.0f - static_cast<float>((k + 1) * static_cast<int>(i % 5))) << "push " << k;
  }
  const ShardStats stats = big.stats(self);
  EXPECT_EQ(stats.updates_applied, static_cast<std::uint64_t>(kPushes));
  EXPECT_EQ(stats.malformed_frames, 0u);
}

TEST(Bridge, DropsABigPushWhoseTensorWasDamagedWithoutApplyingAnyOfIt) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  constexpr std::size_t kSize = 2 * kBorrowFromBytes / sizeof(float);
  BigShard big(sys, kSize);
  Message frame = encode(PushRequest{0, 0, 0, 1, true, {}}, 1, std::vector<float>(kSize, 1.0f));
  ASSERT_EQ(frame.size(), 2u);
  std::vector<std::byte> damaged(frame[1].bytes.begin(), frame[1].bytes.end());
  damaged[damaged.size() - 3] ^= std::byte{0x10};  // the last value: a reader that used bytes before the check would have applied the rest
  frame[1] = Part::take(std::move(damaged));
  big.worker_side->send(big.peer, std::move(frame));
  caf::scoped_actor self{sys};
  // The stats request is sent after the damaged frame on the same connection, so it is read after it.
  const ShardStats stats = big.stats(self);
  EXPECT_EQ(stats.malformed_frames, 1u);
  EXPECT_EQ(stats.updates_applied, 0u);
  ShardReply snap;
  self->request(big.served.shard, std::chrono::seconds(10), snapshot_atom::value)
      .receive([&](ShardReply& r) { snap = std::move(r); }, [&](caf::error& e) { FAIL() << sys.render(e); });
  ASSERT_EQ(snap.params.size(), kSize);
  EXPECT_EQ(snap.params.front(), 100.0f);
  EXPECT_EQ(snap.params.back(), 100.0f);
}

}  // namespace
}  // namespace asgd::messaging

namespace asgd::messaging {
namespace {

double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

TEST(Bridge, BridgesThatBusyPollAnswerEveryRoundTripAndSleepOnceTheTrafficStops) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  const auto polling = [](const char* name) {
    BridgeOptions o;
    o.name = name;
    o.busy_poll = std::chrono::milliseconds(2);
    return o;
  };
  auto served = asgd_test::ServedShard::start(sys, 16, polling("polling shard"));
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  auto worker = worker_side_of(sys, *served, polling("polling worker"));
  ASSERT_TRUE(worker.ok()) << worker.status().to_string();
  caf::scoped_actor self{sys};
  constexpr int kPushes = 50;
  for (int k = 0; k < kPushes; ++k) {
    const ShardReply reply = push_ones(self, worker->remote, k, 16);
    ASSERT_EQ(reply.params.size(), 16u);
    ASSERT_EQ(reply.params[3], 100.0f - static_cast<float>(k + 1)) << "push " << k;  // sgd at lr 1, once each
  }
  // Quiet now: both I/O threads poll 2 ms more, then sleep. Two threads
  // that kept polling would spend about as much CPU as the wall time of
  // the window, each.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double cpu0 = process_cpu_s();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(process_cpu_s() - cpu0, 0.1) << "the bridges kept polling with no traffic";
  worker->bridge->stop();
  served->stop();
  self->send_exit(worker->remote, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace asgd::messaging
