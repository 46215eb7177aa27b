// The in-process collective of the decentralized policies, call by call:
// when an all-reduce completes and what it computes, and when a gossip wait
// is answered and with which copies.

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "messaging/collective.hpp"

namespace asgd::messaging {
namespace {

// A Ready that counts its calls.
struct Flag {
  int calls = 0;
  Collective::Ready ready() {
    return [this] { ++calls; };
  }
};

TEST(LocalCollective, AnAllReduceCompletesWhenEveryRankIsInWithTheSampleWeightedMean) {
  auto c = make_local_collective(3);
  const std::vector<float> a{1, 2}, b{4, 8}, d{7, 14};
  Flag fa, fb, fd;
  ASSERT_TRUE(c->allreduce_mean(2, 0, d, 1, fd.ready()).ok());
  ASSERT_TRUE(c->allreduce_mean(0, 0, a, 2, fa.ready()).ok());
  EXPECT_EQ(fa.calls + fd.calls, 0) << "rank 1 is not in yet";
  EXPECT_NE(c->waiting_for(0).find("worker(s) 1 have not contributed"), std::string::npos) << c->waiting_for(0);
  ASSERT_TRUE(c->allreduce_mean(1, 0, b, 1, fb.ready()).ok());
  EXPECT_EQ(fa.calls + fb.calls + fd.calls, 3);
  EXPECT_EQ(c->waiting_for(0), "");
  EXPECT_DOUBLE_EQ(c->total_weight(0), 4.0);
  // (2 * a + b + d) / 4, summed in rank order with float weights as a bsp
  // shard sums a clock.
  std::vector<float> expected(2, 0.0f);
  for (int i = 0; i < 2; ++i) {
    expected[i] += 0.5f * a[i];
    expected[i] += 0.25f * b[i];
    expected[i] += 0.25f * d[i];
  }
  const auto mean = c->mean(1);
  ASSERT_EQ(mean.size(), 2u);
  EXPECT_EQ(mean[0], expected[0]);
  EXPECT_EQ(mean[1], expected[1]);
}

TEST(LocalCollective, AZeroWeightIsNotReadAndARoundOfZeroWeightsHasNoMean) {
  auto c = make_local_collective(2);
  const std::vector<float> nan{std::numeric_limits<float>::quiet_NaN(), 1}, g{2, 4};
  Flag f0, f1;
  ASSERT_TRUE(c->allreduce_mean(0, 5, nan, 0, f0.ready()).ok());
  ASSERT_TRUE(c->allreduce_mean(1, 5, g, 3, f1.ready()).ok());
  ASSERT_EQ(c->mean(0).size(), 2u);
  EXPECT_EQ(c->mean(0)[0], 2.0f);
  ASSERT_TRUE(c->allreduce_mean(0, 6, nan, 0, f0.ready()).ok());
  ASSERT_TRUE(c->allreduce_mean(1, 6, nan, 0, f1.ready()).ok());
  EXPECT_EQ(f0.calls + f1.calls, 4);
  EXPECT_EQ(c->total_weight(0), 0.0);
  EXPECT_TRUE(c->mean(0).empty());
}

TEST(LocalCollective, ARankThatLeavesIsNoLongerWaitedFor) {
  auto c = make_local_collective(2);
  const std::vector<float> g{3};
  Flag f0;
  ASSERT_TRUE(c->allreduce_mean(0, 9, g, 1, f0.ready()).ok());
  EXPECT_EQ(f0.calls, 0);
  c->leave(1);
  EXPECT_EQ(f0.calls, 1);
  EXPECT_EQ(c->mean(0)[0], 3.0f);
  ASSERT_TRUE(c->allreduce_mean(0, 10, g, 1, f0.ready()).ok());
  EXPECT_EQ(f0.calls, 2) << "alone, a rank's round completes at once";
  EXPECT_FALSE(c->allreduce_mean(1, 10, g, 1, f0.ready()).ok()) << "a departed rank cannot call";
}

TEST(LocalCollective, CallsOutOfStepAreRefusedWithTheReason) {
  auto c = make_local_collective(2);
  const std::vector<float> g{1, 2}, h{1};
  Flag f;
  EXPECT_FALSE(c->allreduce_mean(2, 0, g, 1, f.ready()).ok());
  ASSERT_TRUE(c->allreduce_mean(0, 4, g, 1, f.ready()).ok());
  const Status twice = c->allreduce_mean(0, 4, g, 1, f.ready());
  EXPECT_NE(twice.message().find("in flight"), std::string::npos) << twice.to_string();
  const Status other_round = c->allreduce_mean(1, 5, g, 1, f.ready());
  EXPECT_NE(other_round.message().find("round 5 while the others are in round 4"), std::string::npos)
      << other_round.to_string();
  const Status length = c->allreduce_mean(1, 4, h, 1, f.ready());
  EXPECT_NE(length.message().find("1 values to an all-reduce of 2"), std::string::npos) << length.to_string();
  EXPECT_FALSE(c->gossip(1, 1, g, {}, {1}, 0, f.ready()).ok()) << "a rank is not its own peer";
  EXPECT_EQ(f.calls, 0);
}

TEST(LocalCollective, AGossipWaitsForEveryPeersCopyFromTheClockAskedOrLater) {
  auto c = make_local_collective(3);
  const std::vector<float> x0{0}, x1{10}, x2{20};
  Flag f0, f1, f2;
  // Rank 0 at clock 5 with bound 2 needs copies from clock 3 on.
  ASSERT_TRUE(c->gossip(0, 5, x0, {1, 2}, {1, 2}, 3, f0.ready()).ok());
  EXPECT_EQ(f0.calls, 0);
  ASSERT_TRUE(c->gossip(1, 3, x1, {0}, {0}, 1, f1.ready()).ok());
  EXPECT_EQ(f1.calls, 1) << "rank 0's copy of clock 5 is recent enough for rank 1";
  ASSERT_TRUE(c->gossip(2, 2, x2, {0}, {0}, 0, f2.ready()).ok());
  EXPECT_EQ(f2.calls, 1);
  EXPECT_EQ(f0.calls, 0) << "rank 2's copy of clock 2 is too old for clock 5 - 2";
  EXPECT_NE(c->waiting_for(0).find("worker 2 (its copy is from clock 2)"), std::string::npos) << c->waiting_for(0);
  ASSERT_TRUE(c->gossip(2, 3, x2, {0}, {0}, 1, f2.ready()).ok());
  EXPECT_EQ(f0.calls, 1);
  const auto copies = c->peer_copies(0);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].rank, 1u);
  EXPECT_EQ(copies[0].clock, 3u);
  EXPECT_EQ((*copies[0].params)[0], 10.0f);
  EXPECT_EQ(copies[1].rank, 2u);
  EXPECT_EQ(copies[1].clock, 3u);
}

TEST(LocalCollective, AGossipPeerThatLeftIsSkippedUnlessItsLastCopyIsRecentEnough) {
  auto c = make_local_collective(3);
  const std::vector<float> x{1};
  Flag f;
  ASSERT_TRUE(c->gossip(1, 4, x, {0}, {0}, 0, f.ready()).ok());
  c->leave(1);
  ASSERT_TRUE(c->gossip(0, 6, x, {1, 2}, {1, 2}, 4, f.ready()).ok());
  EXPECT_EQ(f.calls, 1);
  c->leave(2);
  EXPECT_EQ(f.calls, 2) << "with both peers gone nothing is left to wait for";
  const auto copies = c->peer_copies(0);
  ASSERT_EQ(copies.size(), 1u) << "rank 1's last copy (clock 4) is recent enough; rank 2 never published";
  EXPECT_EQ(copies[0].rank, 1u);
}

TEST(LocalCollective, RanksOnThreadsAllReduceEveryRoundWithTheSameResult) {
  constexpr int kRanks = 4, kRounds = 200;
  auto c = make_local_collective(kRanks);
  std::vector<std::vector<float>> seen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> g(64);
      for (int round = 0; round < kRounds; ++round) {
        std::fill(g.begin(), g.end(), static_cast<float>(r + round));
        std::atomic<bool> done{false};
        ASSERT_TRUE(c->allreduce_mean(static_cast<Rank>(r), static_cast<Round>(round), g, 1.0,
                                      [&] { done.store(true, std::memory_order_release); })
                        .ok());
        while (!done.load(std::memory_order_acquire)) std::this_thread::yield();
        seen[r].push_back(c->mean(static_cast<Rank>(r))[63]);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(seen[r], seen[0]);
  ASSERT_EQ(seen[0].size(), static_cast<std::size_t>(kRounds));
  EXPECT_FLOAT_EQ(seen[0][10], 10.0f + 1.5f);
}

}  // namespace
}  // namespace asgd::messaging
