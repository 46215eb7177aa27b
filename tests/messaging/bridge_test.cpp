// The bridge end to end: a worker-side remote_shard talking through a
// transport that duplicates, reorders and delays frames to a real shard
// actor behind a shard_server.

#include "messaging/bridge.hpp"

#include <gtest/gtest.h>

#include "actors/parameter_shard.hpp"

namespace asgd::messaging {
namespace {

TEST(Bridge, AShardBehindAFaultyNetworkAppliesEachPushExactlyOnceAndAnswersEveryOne) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};

  ShardSetup ss;
  ss.range = {0, 4};
  ss.initial.assign(4, 100.0f);
  ss.optimizer = {"sgd", 1.0f, 0.0f, 0.0f};
  ss.workers = 1;
  auto core = ShardCore::make(std::move(ss));
  ASSERT_TRUE(core.ok());
  auto shard = sys.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
  auto server = std::make_shared<caf::actor>();
  BridgeOptions so;
  so.listen = "tcp://127.0.0.1:0";
  so.name = "test shard";
  auto shard_side = Bridge::start(so, [server](Inbound&& in) { post_to_shard_server(*server, std::move(in)); });
  ASSERT_TRUE(shard_side.ok()) << shard_side.status().to_string();
  *server = sys.spawn(shard_server, *shard_side, shard);

  FaultPlan faults;
  faults.duplicate = 0.5;
  faults.reorder = 0.3;
  faults.delay = 0.3;
  faults.delay_by = std::chrono::milliseconds(5);
  faults.seed = 7;
  BridgeOptions wo;
  wo.name = "test worker";
  auto worker_side = Bridge::start(wo, nullptr, make_faulty_transport(make_zmq_transport(), faults));
  ASSERT_TRUE(worker_side.ok());
  auto peer = (*worker_side)->connect((*shard_side)->endpoint());
  ASSERT_TRUE(peer.ok());
  auto remote = sys.spawn(remote_shard, *worker_side, *peer, 0u);

  caf::scoped_actor self{sys};
  constexpr int kPushes = 40;
  for (int k = 0; k < kPushes; ++k) {
    PushRequest req{0, static_cast<Clock>(k), static_cast<Clock>(k), 1, true, {1.0f, 1.0f, 1.0f, 1.0f}};
    ShardReply reply;
    self->request(remote, std::chrono::seconds(10), push_atom::value, std::move(req))
        .receive([&](ShardReply& r) { reply = std::move(r); },
                 [&](caf::error& e) { FAIL() << "push " << k << ": " << sys.render(e); });
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

  (*worker_side)->stop();
  (*shard_side)->stop();
  for (auto& a : {remote, *server, shard}) self->send_exit(a, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace asgd::messaging
