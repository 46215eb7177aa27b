// A shard's bridge reads at most BridgeOptions::max_unanswered requests
// ahead of its answers: at the limit it leaves the rest in ZeroMQ's queues
// (the sender's sends back up), and reads again as replies leave.

#include <gtest/gtest.h>

#include <thread>

#include "actors/parameter_shard.hpp"
#include "messaging/bridge.hpp"
#include "messaging/served_shard.hpp"
#include "test_helpers.hpp"

namespace asgd::messaging {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct BoundedShard {
  BoundedShard(caf::actor_system& sys, std::size_t size, std::size_t max_unanswered, PolicyConfig policy = {},
               std::uint32_t workers = 1, TransportLimits limits = {}) {
    BridgeOptions so;
    so.name = "test shard";
    so.max_unanswered = max_unanswered;
    so.limits = limits;
    // The workers here are bare ZeroMQ transports that read replies only,
    // not the offer of shared memory a bridge sends first.
    so.shared_memory = false;
    // The shard on CAF's threads (where it also runs in a shard process
    // while a tick or a burst longer than its turn has it there): requests
    // then wait in its mailbox, unanswered, while the bridge reads on,
    // which is what the limit bounds. On the I/O thread the shard answers
    // each as it is read.
    auto s = asgd_test::ServedShard::start(sys, size, so, std::move(policy), workers, true);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    served = *s;
    shard = served.shard;
    bridge = served.bridge;
  }
  ~BoundedShard() { served.stop(); }
  // Waits (a little) for every slot to come back: the last ones go when
  // ZeroMQ has sent their replies.
  std::uint64_t unanswered_after_settling() const {
    const auto until = SteadyClock::now() + std::chrono::seconds(5);
    while (bridge->stats().unanswered > 0 && SteadyClock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return bridge->stats().unanswered;
  }
  asgd_test::ServedShard served;
  caf::actor shard;
  std::shared_ptr<Bridge> bridge;
};

// A worker's side without a bridge: a bare transport, so that it can send
// every push at once without waiting for a reply.
struct RawWorker {
  explicit RawWorker(const std::string& endpoint, TransportLimits limits = {})
      : transport(make_zmq_transport(limits)) {
    auto p = transport->connect(endpoint);
    EXPECT_TRUE(p.ok());
    peer = *p;
  }
  void send(Message m) {
    const auto until = SteadyClock::now() + std::chrono::seconds(10);
    while (true) {
      auto sent = transport->send(peer, m);
      ASSERT_TRUE(sent.ok()) << sent.status().to_string();
      if (*sent) return;
      ASSERT_LT(SteadyClock::now(), until) << "the shard never read again";
      (void)transport->receive(std::chrono::milliseconds(1));  // would block: the shard is not reading
    }
  }
  // The next reply's decoded fields (nullopt after 10 s without one).
  std::optional<std::pair<std::uint64_t, ShardReply>> reply() {
    const auto until = SteadyClock::now() + std::chrono::seconds(10);
    while (SteadyClock::now() < until) {
      auto in = transport->receive(std::chrono::milliseconds(100));
      if (!in.ok() || !*in) continue;
      Frame f;
      ShardReply r;
      EXPECT_EQ(parse_frame((*in)->message, f), FrameError::none);
      EXPECT_EQ(decode(f, r), FrameError::none);
      return std::make_pair(f.header.request_id, std::move(r));
    }
    return std::nullopt;
  }
  std::unique_ptr<Transport> transport;
  PeerId peer;
};

TEST(BridgeBackpressure, AShardAtItsLimitStopsReadingAndStillAnswersEveryPushOnceAsRepliesLeave) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  // Over kBorrowFromBytes: each reply goes out from the push's own buffer,
  // and its slot comes back only once ZeroMQ has sent it.
  constexpr std::size_t kSize = 2 * kBorrowFromBytes / sizeof(float);
  constexpr std::size_t kLimit = 4;
  BoundedShard shard(sys, kSize, kLimit);
  RawWorker worker(shard.bridge->endpoint());
  constexpr int kPushes = 64;
  for (int k = 0; k < kPushes; ++k)
    worker.send(encode(PushRequest{0, static_cast<Clock>(k), static_cast<Clock>(k), 1, true, {}}, k + 1,
                       std::vector<float>(kSize, 1.0f)));
  worker.send(encode(PushRequest{0, 99, 99, 1, true, {}}, 1, std::vector<float>(kSize, 1.0f)));  // id 1 again
  std::vector<bool> answered(kPushes + 1, false);
  for (int k = 0; k < kPushes; ++k) {
    auto r = worker.reply();
    ASSERT_TRUE(r) << "only " << k << " of " << kPushes << " pushes were answered";
    ASSERT_GE(r->first, 1u);
    ASSERT_LE(r->first, static_cast<std::uint64_t>(kPushes));
    EXPECT_FALSE(answered[r->first]) << "request " << r->first << " answered twice";
    answered[r->first] = true;
    EXPECT_EQ(r->second.outcome, static_cast<std::uint8_t>(PushOutcome::applied));
  }
  const BridgeStats st = shard.bridge->stats();
  EXPECT_LE(st.unanswered_peak, kLimit);
  EXPECT_GT(st.read_pauses, 0u) << "64 pushes sent at once never filled a limit of 4";
  // The duplicate was dropped unanswered; its slot came back all the same.
  EXPECT_EQ(shard.unanswered_after_settling(), 0u);
  caf::scoped_actor self{sys};
  self->request(shard.shard, std::chrono::seconds(10), stats_atom::value)
      .receive([&](ShardStats& s) { EXPECT_EQ(s.updates_applied, static_cast<std::uint64_t>(kPushes)); },
               [&](caf::error& e) { FAIL() << sys.render(e); });
}

TEST(BridgeBackpressure, ReadsHeldAtABspBarrierKeepTheirSlotsAndAreReleasedWhenTheLastWorkerPushes) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  constexpr std::uint32_t kWorkers = 6;
  PolicyConfig bsp;
  bsp.name = "bsp";
  // Reading resumes at half the limit: that half must hold the barrier.
  BoundedShard shard(sys, 8, 2 * kWorkers + 2, bsp, kWorkers);
  RawWorker worker(shard.bridge->endpoint());
  for (std::uint32_t w = 0; w + 1 < kWorkers; ++w)
    worker.send(encode(PushRequest{w, 0, 0, 1, true, {}}, w + 1, std::vector<float>(8, 1.0f)));
  const auto until = SteadyClock::now() + std::chrono::seconds(5);
  while (shard.bridge->stats().unanswered < kWorkers - 1 && SteadyClock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(shard.bridge->stats().unanswered, kWorkers - 1u) << "the held reads keep their slots";
  worker.send(encode(PushRequest{kWorkers - 1, 0, 0, 1, true, {}}, kWorkers, std::vector<float>(8, 1.0f)));
  for (std::uint32_t w = 0; w < kWorkers; ++w) {
    auto r = worker.reply();
    ASSERT_TRUE(r) << "the barrier released only " << w << " of " << kWorkers << " reads";
    EXPECT_EQ(r->second.outcome, static_cast<std::uint8_t>(PushOutcome::aggregated));
  }
  EXPECT_EQ(shard.unanswered_after_settling(), 0u);
}

// A peer that sends requests and never reads the replies fills its own
// queue at the shard, and then the shard's backlog; replies to every other
// peer still go out past them (ZeroMQ reports a full queue per peer).
TEST(BridgeBackpressure, APeerThatNeverReadsItsRepliesDoesNotHoldUpTheRepliesToAnotherPeer) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  // 4 MiB a reply: a few fill the loopback socket's buffers.
  constexpr std::size_t kSize = std::size_t{1} << 20;
  TransportLimits shard_queues;
  shard_queues.send_high_water_mark = 2;
  BoundedShard shard(sys, kSize, kDefaultMaxUnanswered, {}, 1, shard_queues);
  // Its sends never block (so RawWorker::send never reads a reply).
  TransportLimits stuck_queues;
  stuck_queues.receive_high_water_mark = 2;
  RawWorker stuck(shard.bridge->endpoint(), stuck_queues);
  constexpr std::uint64_t kPulls = 32;
  for (std::uint64_t k = 0; k < kPulls; ++k) stuck.send(encode(PullRequest{0, 0}, k + 1));
  // Every pull read and answered; most of the answers wait for `stuck`.
  ASSERT_TRUE(asgd_test::eventually([&] { return shard.bridge->stats().frames_in >= kPulls; }))
      << "the shard read " << shard.bridge->stats().frames_in << " of " << kPulls << " pulls";
  ASSERT_TRUE(asgd_test::eventually([&] { return shard.bridge->stats().unanswered < kPulls; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_GT(shard.bridge->stats().unanswered, 0u) << "the stuck peer's queue never filled: the test proves nothing";

  RawWorker other(shard.bridge->endpoint());
  other.send(encode(PullRequest{0, 0}, 1000));
  const auto r = other.reply();
  ASSERT_TRUE(r) << "no reply within 10 s: the stuck peer's replies held it up ("
                 << shard.bridge->stats().unanswered << " unanswered)";
  EXPECT_EQ(r->first, 1000u);

  // Once `stuck` reads, it gets every reply, each once.
  std::vector<bool> answered(kPulls + 1, false);
  for (std::uint64_t k = 0; k < kPulls; ++k) {
    auto mine = stuck.reply();
    ASSERT_TRUE(mine) << "only " << k << " of " << kPulls << " pulls were answered";
    ASSERT_LE(mine->first, kPulls);
    EXPECT_FALSE(answered[mine->first]) << "request " << mine->first << " answered twice";
    answered[mine->first] = true;
  }
  EXPECT_EQ(shard.unanswered_after_settling(), 0u);
}

}  // namespace
}  // namespace asgd::messaging
