// WorkerCore under the decentralized policies, driven message by message:
// several cores share one in-process collective and the test decides who
// steps when (a seeded schedule), with no actor system and no threads.

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "actors/worker.hpp"
#include "actors/worker_core.hpp"

namespace asgd {
namespace {

namespace act = worker_action;

constexpr std::size_t kBatch = 4;

data::Batch batch(std::uint64_t seed) {
  data::Batch b;
  b.size = kBatch;
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (std::size_t i = 0; i < kBatch * 28 * 28; ++i) b.x.push_back(pixel(rng));
  for (std::size_t i = 0; i < kBatch; ++i) b.y.push_back(static_cast<std::int32_t>((seed + i) % 10));
  return b;
}

template <class A>
bool has(const WorkerActions& out) {
  for (const auto& a : out)
    if (std::holds_alternative<A>(a)) return true;
  return false;
}

// One worker: its core, whether the collective has called it back, and
// whether its step's publication awaits the shard's answer.
struct Peer {
  std::optional<WorkerCore> core;
  std::shared_ptr<bool> exchanged = std::make_shared<bool>(false);
  bool publishing = false;
  WorkerActions out;
};

struct Group {
  Group(const std::string& policy, std::uint32_t n) : collective(messaging::make_local_collective(n)), peers(n) {
    auto model = Model::build("mlp", {1, 28, 28}, 10);
    EXPECT_TRUE(model.ok());
    for (std::uint32_t w = 0; w < n; ++w) {
      WorkerSetup s;
      s.id = w;
      s.model = "mlp";
      s.sample_shape = {1, 28, 28};
      s.policy.name = policy;
      s.policy.options["publish-steps"] = 1;  // every step publishes: act() expects it
      s.optimizer = {"sgd", 0.05f, 0.0f, 0.0f};
      s.ranges = partition_keys(model->num_params(), 1);
      s.collective = collective;
      s.exchanged = [flag = peers[w].exchanged] { *flag = true; };
      auto core = WorkerCore::make(s, [now = now] { return *now; });
      EXPECT_TRUE(core.ok()) << core.status().to_string();
      peers[w].core.emplace(std::move(core).value());
      // Started, with the shard's parameters (the same for all) in.
      WorkerActions out;
      peers[w].core->start(out);
      ShardReply r;
      r.params = std::vector<float>(model->params().begin(), model->params().end());
      peers[w].core->reply(0, r, out);
    }
  }

  // Worker w takes one action: computes a step on a new batch, or, when
  // its exchange is done, finishes it. False when it can do neither
  // (waiting for its peers).
  bool act(std::uint32_t w) {
    Peer& p = peers[w];
    p.out.clear();
    if (*p.exchanged) {
      *p.exchanged = false;
      p.core->exchanged(p.out);
      EXPECT_TRUE(has<act::Push>(p.out)) << "publish-steps 1: every step publishes";
      ShardReply ack;  // the shard took the parameters
      ack.outcome = static_cast<std::uint8_t>(PushOutcome::applied);
      p.out.clear();
      p.core->reply(0, ack, p.out);
      EXPECT_TRUE(has<act::NextStep>(p.out));
      return true;
    }
    if (waiting(w)) return false;
    p.core->batch(batch(w * 1000 + p.core->step()), p.out);
    EXPECT_FALSE(has<act::Fail>(p.out));
    return true;
  }
  bool waiting(std::uint32_t w) const { return !collective->waiting_for(w).empty(); }

  std::shared_ptr<WorkerCore::Instant> now = std::make_shared<WorkerCore::Instant>(std::chrono::hours(1));
  std::shared_ptr<messaging::Collective> collective;
  std::vector<Peer> peers;
};

TEST(WorkerExchange, GossipNeverUsesACopyStalerThanItsBoundWhateverTheScheduleAndCountsEachOne) {
  constexpr std::uint32_t kWorkers = 3, kBound = 2;
  Group g("gossip:2", kWorkers);
  std::mt19937 schedule(7);
  // Worker 0 is picked far more often than the others: it runs ahead until
  // its bound holds it.
  std::discrete_distribution<std::uint32_t> pick({6.0, 1.0, 1.0});
  bool held = false;
  for (int i = 0; i < 600; ++i) {
    const std::uint32_t w = pick(schedule);
    if (!g.act(w)) {
      held = true;
      ASSERT_NE(g.collective->waiting_for(w).find("a copy from clock"), std::string::npos);
    }
  }
  EXPECT_TRUE(held) << "the fast worker never had to wait for a peer";
  for (std::uint32_t w = 0; w < kWorkers; ++w) {
    const auto& h = g.peers[w].core->report().staleness_histogram;
    ASSERT_FALSE(h.empty()) << "worker " << w << " recorded no staleness";
    EXPECT_LE(h.size(), kBound + 1) << "worker " << w << " used a copy staler than " << kBound;
    std::uint64_t used = 0;
    for (auto n : h) used += n;
    // Each exchange on a ring of three uses both neighbours' copies.
    EXPECT_EQ(used, 2 * g.peers[w].core->step()) << "worker " << w;
  }
  EXPECT_GT(g.peers[0].core->report().staleness_histogram.back(), 0u) << "the bound was never reached";
}

TEST(WorkerExchange, AllReduceKeepsEveryCopyEqualAndWaitsForTheSlowest) {
  Group g("allreduce", 2);
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(g.act(0));      // computes and contributes
    EXPECT_TRUE(g.waiting(0));  // until worker 1 is in
    ASSERT_FALSE(g.act(0));
    ASSERT_TRUE(g.act(1));
    ASSERT_TRUE(g.act(0));  // both finish the step
    ASSERT_TRUE(g.act(1));
  }
  const auto a = g.peers[0].core->model().params(), b = g.peers[1].core->model().params();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "the copies drifted apart";
  EXPECT_EQ(g.peers[0].core->report().updates, 5u);
}

TEST(WorkerExchange, AWorkerThatDoesNotContributeFailsTheOthersStepNamingItAtTheTimeout) {
  Group g("allreduce", 2);
  ASSERT_TRUE(g.act(0));
  WorkerActions out;
  *g.now += std::chrono::seconds(59);
  g.peers[0].core->check_overdue(out);
  EXPECT_FALSE(has<act::Fail>(out)) << "not overdue yet";
  out.clear();
  *g.now += std::chrono::seconds(2);  // past the default --rpc-timeout of 60 s
  g.peers[0].core->check_overdue(out);
  ASSERT_TRUE(has<act::Fail>(out));
  const auto& fail = std::get<act::Fail>(out.back());
  EXPECT_EQ(fail.code, StatusCode::timeout);
  EXPECT_NE(fail.message.find("the all-reduce of step 0: worker(s) 1 have not contributed"), std::string::npos)
      << fail.message;
  // A failed worker leaves the collective: the other goes on alone.
  ASSERT_TRUE(g.act(1));
  EXPECT_TRUE(*g.peers[1].exchanged);
}

TEST(WorkerExchange, ADecentralizedPolicyWithoutACollectiveIsRefused) {
  WorkerSetup s;
  s.model = "mlp";
  s.sample_shape = {1, 28, 28};
  s.policy.name = "allreduce";
  s.ranges = partition_keys(235146, 2);  // the mlp's parameters
  const auto core = WorkerCore::make(s);
  ASSERT_FALSE(core.ok());
  EXPECT_NE(core.status().message().find("needs the collective"), std::string::npos) << core.status().to_string();
}

// A worker process takes the shards' ranges from the coordinator's
// assignment: ranges that do not cut the model's parameters into
// consecutive pieces (a gap, an overlap, short of the end, past it) would
// push and read values past the model's end, and are refused. (None: a
// worker that only measures its step, for --worker-weights auto.)
TEST(WorkerExchange, KeyRangesThatDoNotCutTheModelIntoConsecutivePiecesAreRefused) {
  for (const std::vector<KeyRange>& ranges :
       std::vector<std::vector<KeyRange>>{{{0, 10}}, {{0, 100000}, {100001, 235146}},
                                          {{0, 100000}, {90000, 235146}}, {{0, 300000}}, {{1, 235146}}}) {
    WorkerSetup s;
    s.model = "mlp";
    s.sample_shape = {1, 28, 28};
    s.ranges = ranges;
    const auto core = WorkerCore::make(s);
    ASSERT_FALSE(core.ok());
    EXPECT_NE(core.status().message().find("do not cut the model's 235146 parameters into consecutive pieces"),
              std::string::npos)
        << core.status().to_string();
  }
  WorkerSetup s;
  s.model = "mlp";
  s.sample_shape = {1, 28, 28};
  s.ranges = {{0, 100000}, {100000, 235146}};
  EXPECT_TRUE(WorkerCore::make(s).ok());
}

}  // namespace
}  // namespace asgd
