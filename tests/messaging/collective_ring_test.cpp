// The ring all-reduce's arithmetic on its own (messaging/collective_ring.hpp):
// m RingReduce objects pass their pieces through a queue, in any order the
// test picks, and every rank must end with the same bits: each chunk's
// weighted mean folded in ring order.

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "messaging/collective_ring.hpp"
#include "messaging/collective_wire.hpp"
#include "collective_helpers.hpp"

namespace asgd::messaging {
namespace {

struct Sent {
  Rank to;
  RingReduce::Piece piece;
  std::vector<float> values;  // a copy: the sender's buffer changes
};

// Runs one round over ranks 0..m-1 with data[r] and weights[r], the pieces
// delivered in the order they were sent or (shuffle) in a random order, a
// piece that is not yet wanted kept waiting.
std::vector<std::vector<float>> run_round(std::vector<RingReduce>& ranks, const std::vector<std::vector<float>>& data,
                                          const std::vector<double>& weights, bool shuffle, unsigned seed) {
  const auto m = static_cast<Rank>(ranks.size());
  std::deque<Sent> queue;
  const RingReduce::Send send = [&](Rank to, const RingReduce::Piece& p, const RingReduce::Buffer&) {
    queue.push_back({to, p, std::vector<float>(p.values.begin(), p.values.end())});
  };
  std::vector<Rank> ring(m);
  for (Rank r = 0; r < m; ++r) ring[r] = r;
  for (Rank r = 0; r < m; ++r) ranks[r].begin(ring, r, data[r], weights[r], false, send);
  std::mt19937 rng(seed);
  for (bool taken = true; taken && !queue.empty();) {
    // Each turn offers the waiting pieces in a random order (or in arrival
    // order) and delivers the first one its rank takes.
    std::vector<std::size_t> order(queue.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (shuffle) std::shuffle(order.begin(), order.end(), rng);
    taken = false;
    for (std::size_t at : order) {
      RingReduce::Piece p = queue[at].piece;
      const std::vector<float> values = queue[at].values;
      p.values = values;
      const Rank to = queue[at].to;
      if (ranks[to].take(p, send)) {  // may append to the queue: `at` stays valid, the copies above are ours
        queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(at));
        taken = true;
        break;
      }
    }
  }
  EXPECT_TRUE(queue.empty()) << queue.size() << " pieces never taken";
  std::vector<std::vector<float>> means;
  for (auto& r : ranks) {
    EXPECT_TRUE(r.done());
    means.emplace_back(r.mean().begin(), r.mean().end());
  }
  return means;
}

// The mean as the ring computes it: chunk c's mean starts at rank c as its
// values and goes round the ring, each rank folding its values in by
// weight ((w x value + W x mean) / (W + w)).
std::vector<float> reference(const std::vector<std::vector<float>>& data, const std::vector<double>& weights) {
  const std::size_t m = data.size(), len = data[0].size();
  std::vector<float> out(len);
  for (std::size_t c = 0; c < m; ++c)
    for (std::size_t i = c * len / m; i < (c + 1) * len / m; ++i) {
      float mean = weights[c] > 0 ? data[c][i] : 0.0f;
      double folded = weights[c];
      for (std::size_t k = 1; k < m; ++k) {
        const std::size_t r = (c + k) % m;
        const double w = weights[r];
        if (w > 0 && folded > 0)
          mean = static_cast<float>(w / (folded + w)) * data[r][i] + static_cast<float>(folded / (folded + w)) * mean;
        else if (w > 0)
          mean = data[r][i];
        folded += w;
      }
      out[i] = mean;
    }
  return out;
}

using asgd_test::random_vectors;

TEST(RingReduce, EveryRankGetsTheRingOrderedWeightedMeanBitForBitInAnyArrivalOrder) {
  const std::size_t piece = collective_wire::kPiece;
  for (std::size_t m : {2, 3, 5})
    for (std::size_t len : {std::size_t{3}, std::size_t{1000}, 2 * piece * m + 7}) {
      const auto data = random_vectors(m, len, static_cast<unsigned>(m * 7 + len));
      std::vector<double> weights;
      for (std::size_t r = 0; r < m; ++r) weights.push_back(static_cast<double>(r + 1) * 16);
      const auto want = reference(data, weights);
      for (bool shuffle : {false, true}) {
        std::vector<RingReduce> ranks(m);
        const auto means = run_round(ranks, data, weights, shuffle, 3);
        for (std::size_t r = 0; r < m; ++r) {
          ASSERT_EQ(means[r].size(), len);
          EXPECT_EQ(means[r], want) << m << " ranks, " << len << " values, rank " << r << (shuffle ? ", shuffled" : "");
          EXPECT_EQ(ranks[r].total(), (m * (m + 1) / 2) * 16.0);
        }
      }
    }
}

// Under --compress fp16 every piece goes as float16: what travels is a
// mean, as large as the values, never weight x values (a step's 27,500
// samples made sums of gradients near 10 overflow float16's 65,504).
TEST(RingReduce, ThePiecesCarryMeansNeverWeightTimesValues) {
  const std::size_t m = 3, len = 3000;
  const auto data = asgd_test::random_vectors(m, len, 11);
  float bound = 0;  // the largest value anywhere: a mean's bound
  for (const auto& d : data)
    for (float v : d) bound = std::max(bound, std::abs(v));
  std::vector<RingReduce> ranks(m);
  std::vector<Rank> ring{0, 1, 2};
  float largest = 0;
  std::deque<Sent> queue;
  const RingReduce::Send send = [&](Rank to, const RingReduce::Piece& p, const RingReduce::Buffer&) {
    for (float v : p.values) largest = std::max(largest, std::abs(v));
    queue.push_back({to, p, std::vector<float>(p.values.begin(), p.values.end())});
  };
  for (Rank r = 0; r < m; ++r) ranks[r].begin(ring, r, data[r], 27500.0 * (r + 1), true, send);
  while (!queue.empty()) {
    Sent s = std::move(queue.front());
    queue.pop_front();
    s.piece.values = s.values;
    ASSERT_TRUE(ranks[s.to].take(s.piece, send));
  }
  EXPECT_LE(largest, bound * 1.0001f) << "a piece carried more than a mean";
  for (auto& r : ranks) {
    ASSERT_TRUE(r.done());
    EXPECT_EQ(r.total(), 27500.0 * 6);
  }
}

TEST(RingReduce, ARankOfWeightZeroAddsNothingAndItsDataIsNotRead) {
  auto data = random_vectors(3, 50, 1);
  std::fill(data[1].begin(), data[1].end(), std::numeric_limits<float>::quiet_NaN());  // its loss was not finite
  std::vector<RingReduce> ranks(3);
  const auto means = run_round(ranks, data, {2.0, 0.0, 6.0}, false, 0);
  for (std::size_t i = 0; i < 50; ++i) EXPECT_FLOAT_EQ(means[0][i], (2 * data[0][i] + 6 * data[2][i]) / 8);
  EXPECT_EQ(means[0], means[2]);
  EXPECT_EQ(ranks[1].total(), 8.0);
}

TEST(RingReduce, NoWeightAnywhereGivesAnEmptyMeanAndARankAloneItsOwnData) {
  const auto data = random_vectors(2, 10, 2);
  std::vector<RingReduce> ranks(2);
  const auto means = run_round(ranks, data, {0.0, 0.0}, false, 0);
  EXPECT_TRUE(means[0].empty());
  EXPECT_EQ(ranks[0].total(), 0.0);
  RingReduce alone;
  alone.begin({4}, 4, data[0], 3.0, false, [](Rank, const RingReduce::Piece&, const RingReduce::Buffer&) {
    ADD_FAILURE() << "a rank alone sends nothing";
  });
  ASSERT_TRUE(alone.done());
  for (std::size_t i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(alone.mean()[i], data[0][i]);
}

TEST(RingReduce, APieceOutOfPlaceIsRefusedAndChangesNothing) {
  const auto data = random_vectors(2, 8, 3);
  std::vector<RingReduce> ranks(2);
  std::vector<RingReduce::Piece> sent;
  std::vector<std::vector<float>> copies;
  const RingReduce::Send keep = [&](Rank, const RingReduce::Piece& p, const RingReduce::Buffer&) {
    sent.push_back(p);
    copies.emplace_back(p.values.begin(), p.values.end());
  };
  ranks[0].begin({0, 1}, 0, data[0], 1.0, false, keep);
  ranks[1].begin({0, 1}, 1, data[1], 1.0, false, keep);
  ASSERT_EQ(sent.size(), 2u);
  RingReduce::Piece from1 = sent[1];  // rank 1's chunk 1, for rank 0 at step 0
  from1.values = copies[1];
  RingReduce::Piece wrong = from1;
  wrong.step = 1;
  EXPECT_FALSE(ranks[0].take(wrong, keep));
  wrong = from1;
  wrong.chunk = 0;
  EXPECT_FALSE(ranks[0].take(wrong, keep));
  wrong = from1;
  wrong.values = std::span<const float>(copies[1]).first(1);
  EXPECT_FALSE(ranks[0].take(wrong, keep));
  EXPECT_EQ(ranks[0].expect(), 0u);
  EXPECT_TRUE(ranks[0].take(from1, keep));
  EXPECT_EQ(ranks[0].expect(), 1u);
}

TEST(RingReduce, AHeldMeanIsNotWrittenOverByTheNextRound) {
  const auto a = random_vectors(2, 20, 4), b = random_vectors(2, 20, 5);
  std::vector<RingReduce> ranks(2);
  run_round(ranks, a, {1.0, 1.0}, false, 0);
  const RingReduce::Buffer kept = ranks[0].result();
  const std::vector<float> before = *kept;
  run_round(ranks, b, {1.0, 1.0}, false, 0);
  EXPECT_EQ(*kept, before);
  EXPECT_NE(ranks[0].result(), kept);
}

}  // namespace
}  // namespace asgd::messaging
