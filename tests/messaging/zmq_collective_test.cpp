// The collective across processes over ZeroMQ, its ranks here in one
// process on loopback: the ring all-reduce's result and reproducibility, a
// rank leaving mid-round, gossip's waits, and malformed messages.

#include <gtest/gtest.h>

#include <cmath>

#include <zmq.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "messaging/collective.hpp"
#include "messaging/collective_links.hpp"
#include "messaging/collective_wire.hpp"
#include "messaging/wire.hpp"
#include "collective_helpers.hpp"

namespace asgd::messaging {
namespace {

using namespace std::chrono_literals;

using asgd_test::random_vectors;
using asgd_test::Signal;

// The ring over tcp (shared memory off: these ranks share a host, and
// tests/messaging/shm_allreduce_test.cpp tests that path).
std::shared_ptr<NetworkCollective> ring_rank() {
  auto c = make_zmq_collective("tcp://127.0.0.1:*");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  (*c)->set_shared_memory(false);
  return *c;
}

std::vector<std::shared_ptr<NetworkCollective>> group(Rank n) { return asgd_test::collective_group(n, ring_rank); }

// Every rank contributes data[r] with weight r + 1 to `round`; the means.
std::vector<std::vector<float>> allreduce(std::vector<std::shared_ptr<NetworkCollective>>& g,
                                          const std::vector<std::vector<float>>& data, Round round) {
  std::vector<Signal> done(g.size());
  for (Rank r = 0; r < g.size(); ++r)
    EXPECT_TRUE(g[r]->allreduce_mean(r, round, data[r], r + 1.0, done[r].ready()).ok());
  std::vector<std::vector<float>> means;
  for (Rank r = 0; r < g.size(); ++r) {
    EXPECT_TRUE(done[r].wait_for(1)) << "rank " << r << " waits for " << g[r]->waiting_for(r);
    const auto m = g[r]->mean(r);
    means.emplace_back(m.begin(), m.end());
  }
  return means;
}

// ZeroMQ hands a message's bytes over at any address (small ones sit in its
// receive buffer): misaligned values are copied out as they were, and no
// values (a leave, an empty chunk's piece) are none at every address, with
// nothing copied (a copy into an empty vector's null data() is undefined
// even for no bytes: the sanitizer build caught it under mpirun).
TEST(CollectiveWire, ValuesAtAnyAddressReadAsTheyWereSentAndNoValuesAsNone) {
  namespace cw = asgd::messaging::collective_wire;
  const std::array<float, 2> sent = {1.5f, -2.25f};
  alignas(8) std::array<std::byte, 16> buffer{};
  for (std::size_t at = 0; at < 4; ++at) {
    std::memcpy(buffer.data() + at, sent.data(), sizeof sent);
    cw::Header h;
    h.count = sent.size();
    std::vector<float> scratch;
    const auto values = cw::read_values(h, {buffer.data() + at, sizeof sent}, scratch);
    ASSERT_EQ(values.size(), 2u) << "at offset " << at;
    EXPECT_EQ(values[0], 1.5f);
    EXPECT_EQ(values[1], -2.25f);
    h.count = 0;
    std::vector<float> none;
    EXPECT_TRUE(cw::read_values(h, {buffer.data() + at, std::size_t{0}}, none).empty()) << "at offset " << at;
  }
}

TEST(ZmqCollective, ARingAllReduceGivesEveryRankTheSameWeightedMean) {
  for (Rank n : {2u, 3u, 5u}) {
    auto g = group(n);
    const std::size_t len = 100'003;  // chunks of unequal length
    for (Round round = 0; round < 3; ++round) {
      const auto data = random_vectors(n, len, static_cast<unsigned>(round + 10 * n));
      const auto means = allreduce(g, data, round);
      double total = 0;
      for (Rank r = 0; r < n; ++r) total += r + 1.0;
      ASSERT_EQ(means[0].size(), len);
      for (std::size_t i = 0; i < len; i += 997) {
        double expected = 0;
        for (Rank r = 0; r < n; ++r) expected += (r + 1.0) * data[r][i];
        EXPECT_NEAR(means[0][i], expected / total, 1e-5) << n << " ranks, value " << i;
      }
      for (Rank r = 1; r < n; ++r) EXPECT_TRUE(means[r] == means[0]) << "rank " << r << " got other bits";
      EXPECT_DOUBLE_EQ(g[0]->total_weight(0), total);
    }
  }
}

// Over two ranks (each chunk's mean written by one, copied by the other)
// and three.
TEST(ZmqCollective, InHalfPrecisionEveryRankGetsTheSameBitsAndTheMeanToAboutThreeDigits) {
  for (const Rank n : {Rank{2}, Rank{3}}) {
    std::vector<std::shared_ptr<NetworkCollective>> g;
    std::vector<std::string> endpoints;
    for (Rank r = 0; r < n; ++r) {
      g.push_back(ring_rank());
      endpoints.push_back(g.back()->endpoint());
    }
    for (Rank r = 0; r < n; ++r) {
      g[r]->set_half_precision(true);
      ASSERT_TRUE(g[r]->connect(r, endpoints).ok());
    }
    const auto data = random_vectors(n, 300'007, 11);  // pieces of 256K floats, and a rest
    const auto means = allreduce(g, data, 0);
    for (Rank r = 1; r < n; ++r) EXPECT_TRUE(means[r] == means[0]) << n << " ranks: rank " << r << " got other bits";
    double worst = 0;
    for (std::size_t i = 0; i < data[0].size(); ++i) {
      double exact = 0;
      for (Rank r = 0; r < n; ++r) exact += (r + 1.0) * data[r][i];  // weights r + 1
      exact /= n * (n + 1) / 2.0;
      worst = std::max(worst, std::abs(means[0][i] - exact));
    }
    EXPECT_LT(worst, 0.01) << n << " ranks: the largest error of a mean of normal values";
    EXPECT_GT(worst, 0.0) << n << " ranks: nothing was rounded: the values did not go as float16";
  }
}

// A value past half precision's range: its chunk goes as float32, the same
// bits to every rank (it was infinite in every copy, and the job diverged).
TEST(ZmqCollective, InHalfPrecisionAValuePastItsRangeStaysFiniteAndTheSameOnEveryRank) {
  std::vector<std::shared_ptr<NetworkCollective>> g;
  std::vector<std::string> endpoints;
  for (Rank r = 0; r < 2; ++r) {
    g.push_back(ring_rank());
    endpoints.push_back(g.back()->endpoint());
  }
  for (Rank r = 0; r < 2; ++r) {
    g[r]->set_half_precision(true);
    ASSERT_TRUE(g[r]->connect(r, endpoints).ok());
  }
  auto data = random_vectors(2, 1000, 5);
  data[0][10] = 1e6f;
  const auto means = allreduce(g, data, 0);
  EXPECT_TRUE(means[1] == means[0]) << "other bits";
  ASSERT_GT(means[0].size(), 10u);
  EXPECT_TRUE(std::isfinite(means[0][10]));
  EXPECT_NEAR(means[0][10], (1.0 * 1e6 + 2.0 * data[1][10]) / 3.0, 1.0);  // weights r + 1
}

TEST(ZmqCollective, TheSameInputsGiveTheSameBitsInAnotherGroup) {
  const auto data = random_vectors(4, 50'000, 3);
  auto a = group(4);
  auto b = group(4);
  EXPECT_TRUE(allreduce(a, data, 7)[2] == allreduce(b, data, 7)[2]);
}

TEST(ZmqCollective, AZeroWeightSendsZerosAndARankAloneHasItsOwnMean) {
  const std::vector<float> nan(10, std::numeric_limits<float>::quiet_NaN()), x(10, 4.0f);
  Signal s0, s1;
  auto g = group(2);  // after what its threads may still use: destroyed first
  ASSERT_TRUE(g[0]->allreduce_mean(0, 0, nan, 0, s0.ready()).ok());
  ASSERT_TRUE(g[1]->allreduce_mean(1, 0, x, 2, s1.ready()).ok());
  ASSERT_TRUE(s0.wait_for(1));
  ASSERT_TRUE(s1.wait_for(1));
  EXPECT_EQ(g[0]->mean(0)[3], 4.0f);
  g[1]->leave(1);
  ASSERT_TRUE(g[0]->allreduce_mean(0, 1, x, 1, s0.ready()).ok());
  ASSERT_TRUE(s0.wait_for(2)) << g[0]->waiting_for(0);
  EXPECT_EQ(g[0]->mean(0)[3], 4.0f);
}

TEST(ZmqCollective, ARoundBegunWithARankThatThenLeavesIsDoneAgainWithoutIt) {
  const auto data = random_vectors(4, 1'000, 5);
  auto g = group(4);  // after what its threads may still use: destroyed first
  allreduce(g, data, 0);
  // Ranks 0-2 begin round 1 with rank 3 still in; then rank 3 leaves.
  std::vector<Signal> done(3);
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 1, data[r], 1.0, done[r].ready()).ok());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(done[0].calls, 0);
  EXPECT_NE(g[0]->waiting_for(0).find("the all-reduce of step 1"), std::string::npos) << g[0]->waiting_for(0);
  g[3]->leave(3);
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(done[r].wait_for(1)) << r << ": " << g[r]->waiting_for(r);
  EXPECT_NEAR(g[1]->mean(1)[17], (data[0][17] + data[1][17] + data[2][17]) / 3.0, 1e-6);
  EXPECT_DOUBLE_EQ(g[1]->total_weight(1), 3.0);
}

TEST(ZmqCollective, AGossipWaitsForEachPeersCopyFromTheClockAskedOrLater) {
  const std::vector<float> x0{0, 0}, x1{10, 10}, x2{20, 20};
  Signal s0, s1, s2;
  auto g = group(3);  // after what its threads may still use: destroyed first
  // Rank 0 at clock 5, bound 2: copies from clock 3 on from ranks 1 and 2.
  ASSERT_TRUE(g[0]->gossip(0, 5, x0, {1, 2}, {1, 2}, 3, s0.ready()).ok());
  ASSERT_TRUE(g[1]->gossip(1, 3, x1, {0, 2}, {0, 2}, 0, s1.ready()).ok());
  ASSERT_TRUE(g[2]->gossip(2, 2, x2, {0, 1}, {0, 1}, 0, s2.ready()).ok());
  ASSERT_TRUE(s1.wait_for(1)) << g[1]->waiting_for(1);
  ASSERT_TRUE(s2.wait_for(1)) << g[2]->waiting_for(2);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(s0.calls, 0) << "rank 2's copy of clock 2 is too old for clock 5 - 2";
  EXPECT_NE(g[0]->waiting_for(0).find("worker 2 (its copy is from clock 2)"), std::string::npos) << g[0]->waiting_for(0);
  ASSERT_TRUE(g[2]->gossip(2, 3, x2, {0, 1}, {0, 1}, 0, s2.ready()).ok());
  ASSERT_TRUE(s0.wait_for(1)) << g[0]->waiting_for(0);
  const auto copies = g[0]->peer_copies(0);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].rank, 1u);
  EXPECT_EQ(copies[0].clock, 3u);
  EXPECT_EQ((*copies[1].params)[1], 20.0f);
  // A peer that leaves is no longer waited for.
  ASSERT_TRUE(s1.wait_for(1));
  ASSERT_TRUE(g[0]->gossip(0, 9, x0, {1, 2}, {1, 2}, 8, s0.ready()).ok());
  g[1]->leave(1);
  g[2]->leave(2);
  ASSERT_TRUE(s0.wait_for(2)) << g[0]->waiting_for(0);
  EXPECT_TRUE(g[0]->peer_copies(0).empty());
}

TEST(ZmqCollective, ARankWhoseProcessDiedIsDroppedWhenTheOthersAreToldAndTheRoundCompletes) {
  const auto data = random_vectors(3, 500, 8);
  std::vector<Signal> done(2);
  auto g = group(3);  // after what its threads may still use: destroyed first
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 0, data[r], 1.0, done[r].ready()).ok());
  g[2].reset();  // rank 2 dies without a word
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(done[0].calls, 0);
  g[0]->leave(2);  // what the coordinator tells the survivors
  g[1]->leave(2);
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(done[r].wait_for(1)) << g[r]->waiting_for(r);
  EXPECT_NEAR(g[0]->mean(0)[9], (data[0][9] + data[1][9]) / 2.0, 1e-6);
}

// A rank that dies mid-round may have sent one neighbour all it needed and
// another not. Here rank 1 is played by the test, on the wire: it sends rank
// 2 its ring steps 0 and 2 of round 0, so that rank 0 finishes the round and
// rank 2 waits for step 3, then dies. Told of the death, rank 2 starts the
// round again without it; rank 0, which finished it, sends rank 2 its result,
// and both take the same step.
TEST(ZmqCollective, ARoundOneRankFinishedBeforeADeathIsFinishedByTheOthersWithItsResult) {
  zmq::context_t ctx;
  zmq::socket_t fake_in(ctx, zmq::socket_type::pull);
  fake_in.set(zmq::sockopt::linger, 0);
  fake_in.bind("tcp://127.0.0.1:*");
  std::vector<std::shared_ptr<NetworkCollective>> g(3);
  for (Rank r : {0u, 2u}) g[r] = ring_rank();
  const std::vector<std::string> endpoints = {g[0]->endpoint(), fake_in.get(zmq::sockopt::last_endpoint),
                                              g[2]->endpoint()};
  ASSERT_TRUE(g[0]->connect(0, endpoints).ok());
  ASSERT_TRUE(g[2]->connect(2, endpoints).ok());
  zmq::socket_t to_rank2(ctx, zmq::socket_type::push);
  to_rank2.set(zmq::sockopt::linger, 1000);
  to_rank2.connect(g[2]->endpoint());
  // The header as docs/wire-protocol.md lays it out (64 bytes).
  auto send_piece = [&](std::uint32_t step, std::uint32_t chunk, const std::vector<float>& values, double weight) {
    std::array<std::byte, 64> h{};
    auto put = [&](std::size_t at, auto v) { std::memcpy(h.data() + at, &v, sizeof v); };
    put(0, std::uint32_t{0x4C4F4341});
    put(4, std::uint16_t{5});
    put(6, std::uint16_t{1});  // a chunk
    put(8, std::uint16_t{1});   // from rank 1
    put(10, std::uint16_t{0});  // float32 values
    put(12, step);
    put(16, std::uint64_t{0});  // round 0
    put(24, std::uint64_t{0b111});
    put(32, std::uint64_t{values.size()});
    put(40, std::uint64_t{0});  // offset
    put(48, chunk);
    put(52, crc32c(std::as_bytes(std::span(values))));
    put(56, weight);
    ASSERT_TRUE(to_rank2.send(zmq::buffer(h), zmq::send_flags::sndmore));
    ASSERT_TRUE(to_rank2.send(zmq::buffer(values), zmq::send_flags::none));
  };
  const std::vector<float> x0{1, 2, 3, 4, 5, 6}, x2{10, 20, 30, 40, 50, 60};
  Signal s0, s2;
  ASSERT_TRUE(g[0]->allreduce_mean(0, 0, x0, 1.0, s0.ready()).ok());
  ASSERT_TRUE(g[2]->allreduce_mean(2, 0, x2, 1.0, s2.ready()).ok());
  // Six values in three chunks of two. From its left neighbour, rank 1,
  // rank 2 takes chunk 1 at step 0 (rank 1's own: weight 1) and chunk 0 at
  // step 1 (ranks 0 and 1 folded: weight 2), both in reduce-scatter, then
  // chunk 2 at step 2 (a mean, with the total weight 3), which it passes on
  // to rank 0, and chunk 1 at step 3, which never comes.
  send_piece(0, 1, {100, 1}, 1.0);
  send_piece(1, 0, {9, 9}, 2.0);
  send_piece(2, 2, {7, 3}, 3.0);
  ASSERT_TRUE(s0.wait_for(1)) << "rank 0 " << g[0]->waiting_for(0);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(s2.calls, 0) << "rank 2 still waits for step 3 from rank 1";
  EXPECT_NE(g[2]->waiting_for(2).find("ring step 4 of 4 from worker 1"), std::string::npos) << g[2]->waiting_for(2);
  g[0]->leave(1);  // rank 1 died: what the coordinator tells the others
  g[2]->leave(1);
  ASSERT_TRUE(s2.wait_for(1)) << "rank 2 " << g[2]->waiting_for(2);
  const auto m0 = g[0]->mean(0), m2 = g[2]->mean(2);
  EXPECT_TRUE(std::equal(m0.begin(), m0.end(), m2.begin(), m2.end())) << "the copies would take different steps";
  EXPECT_EQ(g[2]->total_weight(2), g[0]->total_weight(0));
}

TEST(ZmqCollective, MalformedMessagesAreDroppedAndCountedAndTheRoundStillCompletes) {
  auto g = group(2);
  zmq::context_t ctx;
  zmq::socket_t evil(ctx, zmq::socket_type::push);
  evil.set(zmq::sockopt::linger, 0);
  evil.connect(g[0]->endpoint());
  (void)evil.send(zmq::str_buffer("one part only"), zmq::send_flags::none);
  std::vector<char> header(64, 0);
  (void)evil.send(zmq::buffer(header), zmq::send_flags::sndmore);  // no magic
  (void)evil.send(zmq::str_buffer("abcd"), zmq::send_flags::none);
  const auto data = random_vectors(2, 64, 9);
  const auto means = allreduce(g, data, 0);
  EXPECT_NEAR(means[0][5], (data[0][5] + 2 * data[1][5]) / 3.0, 1e-6);
  for (int i = 0; i < 100 && g[0]->rejected() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(g[0]->rejected(), 2u);
}

// A rank that takes none of its messages (stopped, swapping, in a
// debugger) fills its queue; the I/O thread, which serves every other rank
// too, then waits kSendWait for it once, drops what it cannot send, counts
// it, and sends to it again once it reads. Rank 1 is a socket here that
// reads nothing (a receive queue of one message) until the test lets it.
TEST(ZmqCollective, ARankThatTakesNothingCostsOneSendWaitAndItsMessagesAreCountedNotAHang) {
  zmq::context_t ctx;
  zmq::socket_t stuck(ctx, zmq::socket_type::pull);
  stuck.set(zmq::sockopt::linger, 0);
  stuck.set(zmq::sockopt::rcvhwm, 1);
  stuck.bind("tcp://127.0.0.1:*");
  auto rank0 = ring_rank();
  ASSERT_TRUE(rank0->connect(0, {rank0->endpoint(), stuck.get(zmq::sockopt::last_endpoint)}).ok());
  // Reads what waits until a copy of clock `clock` came: false if it never does.
  const auto drain_until = [&](Round clock) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < until) {
      zmq::message_t part;
      if (!stuck.recv(part, zmq::recv_flags::dontwait)) {
        std::this_thread::sleep_for(1ms);
        continue;
      }
      collective_wire::Header h;
      if (part.size() == sizeof h && (std::memcpy(&h, part.data(), sizeof h), h.round == clock)) return true;
    }
    return false;
  };
  const std::vector<float> copy(16 << 10, 0.5f);  // 64 KiB: ZeroMQ's 1000 queued and the kernel's buffers fill in ~70 MB
  Signal sent;
  Round clock = 0;
  const auto limit = messaging::kSendWait + 3s;
  while (rank0->unsent() == 0 && clock < 5000) {
    ASSERT_TRUE(rank0->gossip(0, clock, copy, {1}, {}, 0, sent.ready()).ok());
    if (!sent.wait_for(static_cast<int>(++clock), limit)) {
      ADD_FAILURE() << "gossip " << clock - 1 << " still not sent after " << limit.count() << " ms";
      drain_until(~Round{0});  // lets a blocked send go, so that the collective can end
      return;
    }
  }
  ASSERT_EQ(rank0->unsent(), 1u) << "no send found the queue full in " << clock << " copies";
  // Stuck: the next copies are dropped at once, not after another wait each.
  const auto begun = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(rank0->gossip(0, clock, copy, {1}, {}, 0, sent.ready()).ok());
    ASSERT_TRUE(sent.wait_for(static_cast<int>(++clock), limit));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - begun, messaging::kSendWait / 2);
  EXPECT_EQ(rank0->unsent(), 6u);
  // It reads again: what was queued comes, and so does the next copy.
  ASSERT_TRUE(drain_until(clock - 7)) << "the copies queued before it stopped reading are delivered";
  ASSERT_TRUE(rank0->gossip(0, clock, copy, {1}, {}, 0, sent.ready()).ok());
  ASSERT_TRUE(sent.wait_for(static_cast<int>(++clock), limit));
  EXPECT_TRUE(drain_until(clock - 1)) << "a copy sent once it reads again is delivered";
  EXPECT_EQ(rank0->unsent(), 6u);
}

TEST(ZmqCollective, CallsOutOfStepAreRefused) {
  const std::vector<float> x(4, 1.0f);
  Signal s;
  auto g = group(2);  // after what its threads may still use: destroyed first
  EXPECT_FALSE(g[0]->allreduce_mean(1, 0, x, 1, s.ready()).ok()) << "rank 0's object is rank 0's only";
  ASSERT_TRUE(g[0]->allreduce_mean(0, 0, x, 1, s.ready()).ok());
  EXPECT_FALSE(g[0]->allreduce_mean(0, 0, x, 1, s.ready()).ok()) << "a call already in flight";
  EXPECT_FALSE(g[1]->connect(1, {g[0]->endpoint(), g[1]->endpoint()}).ok()) << "connected already";
  auto lone = make_zmq_collective("tcp://127.0.0.1:*");
  ASSERT_TRUE(lone.ok());
  EXPECT_FALSE((*lone)->allreduce_mean(0, 0, x, 1, s.ready()).ok()) << "not connected yet";
  EXPECT_FALSE((*lone)->connect(0, std::vector<std::string>(65, (*lone)->endpoint())).ok()) << "over 64 ranks";
  EXPECT_EQ(make_zmq_collective("tcp://256.0.0.1:1").status().code(), StatusCode::io_error);
}

}  // namespace
}  // namespace asgd::messaging
