// The all-reduce through shared memory (messaging/shm_allreduce.hpp), its
// ranks here threads of one process on one host, as the ranks of a job's
// worker processes on one host are: the same bits as the in-process
// collective, ranks that die or never join, and nothing left in /dev/shm.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "messaging/collective.hpp"
#include "messaging/shm_allreduce.hpp"
#include "collective_helpers.hpp"

namespace asgd::messaging {
namespace {

using namespace std::chrono_literals;

using asgd_test::random_vectors;
using asgd_test::Signal;

std::vector<std::shared_ptr<NetworkCollective>> group(Rank n, std::chrono::milliseconds settle = 5s) {
  return asgd_test::collective_group(n, [&] {
    auto c = make_zmq_collective("tcp://127.0.0.1:*");
    EXPECT_TRUE(c.ok());
    (*c)->set_shared_memory(true, settle);
    return *c;
  });
}

// Where a group's segment lives while its ranks join it: /dev/shm/ and the
// name docs/wire-protocol.md gives it (FNV-1a of the endpoints, one per line).
std::filesystem::path segment_of(const std::vector<std::shared_ptr<NetworkCollective>>& g) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& c : g) {
    for (unsigned char ch : c->endpoint()) h = (h ^ ch) * 1099511628211ULL;
    h = (h ^ '\n') * 1099511628211ULL;
  }
  char name[64];
  std::snprintf(name, sizeof name, "asgd-allreduce-%016llx", static_cast<unsigned long long>(h));
  return std::filesystem::path("/dev/shm") / name;
}

TEST(ShmAllreduce, GivesTheSameBitsAsTheInProcessCollectiveRoundAfterRound) {
  for (Rank n : {2u, 3u, 5u}) {
    auto g = group(n);
    EXPECT_TRUE(std::filesystem::exists(segment_of(g))) << "rank 0 creates it when it connects";
    auto local = make_local_collective(n);
    for (Round round = 0; round < 3; ++round) {
      const auto data = random_vectors(n, 1037, 10 * n + static_cast<unsigned>(round));
      std::vector<Signal> done(n), local_done(n);
      for (Rank r = 0; r < n; ++r) {
        const double weight = r == 1 && round == 1 ? 0.0 : 16.0 + r;  // a step dropped for a NaN loss, once
        ASSERT_TRUE(g[r]->allreduce_mean(r, round, data[r], weight, done[r].ready()).ok());
        ASSERT_TRUE(local->allreduce_mean(r, round, data[r], weight, local_done[r].ready()).ok());
      }
      for (Rank r = 0; r < n; ++r) {
        ASSERT_TRUE(done[r].wait_for(1)) << "rank " << r << " waits for " << g[r]->waiting_for(r);
        ASSERT_TRUE(local_done[r].wait_for(1));
        const auto got = g[r]->mean(r), want = local->mean(r);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << n << " ranks, round " << round << ", rank " << r;
        EXPECT_EQ(g[r]->total_weight(r), local->total_weight(r));
      }
      EXPECT_FALSE(std::filesystem::exists(segment_of(g))) << "unlinked once every rank has joined it";
    }
  }
}

TEST(ShmAllreduce, ARankThatNeverContributesIsDroppedWhenTheOthersAreToldAndWaitingForNamesIt) {
  const auto data = random_vectors(3, 500, 1);
  std::vector<Signal> done(3);
  auto g = group(3);  // after what its threads may still use: destroyed first
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 0, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(done[r].wait_for(1));
  for (Rank r : {0u, 2u}) ASSERT_TRUE(g[r]->allreduce_mean(r, 1, data[r], 1.0, done[r].ready()).ok());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(done[0].calls, 1) << "rank 1 has not contributed to round 1";
  EXPECT_NE(g[0]->waiting_for(0).find("workers 1 have not contributed"), std::string::npos) << g[0]->waiting_for(0);
  g[0]->leave(1);  // its process died: what the coordinator tells the others
  g[2]->leave(1);
  for (Rank r : {0u, 2u}) ASSERT_TRUE(done[r].wait_for(2)) << g[r]->waiting_for(r);
  EXPECT_NEAR(g[0]->mean(0)[7], (data[0][7] + data[2][7]) / 2.0, 1e-6);
  EXPECT_EQ(g[2]->total_weight(2), 2.0);
}

// Round 0 on all three ranks (weight 1 each), then rank 2 alone contributes
// to round 1 (weight 2) and waits there for the others.
void round_zero_then_rank_two_comes_alone(const std::vector<std::shared_ptr<NetworkCollective>>& g,
                                          const std::vector<std::vector<float>>& data, std::vector<Signal>& done) {
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 0, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(done[r].wait_for(1)) << g[r]->waiting_for(r);
  ASSERT_TRUE(g[2]->allreduce_mean(2, 1, data[2], 2.0, done[2].ready()).ok());
  std::this_thread::sleep_for(50ms);
}

// Rank 2 contributes to round 1, then its process ends before it sums its
// slice (here: its collective is destroyed while it waits for the others).
// Its contribution counts; once the others are told it is gone, they sum
// its slice themselves.
TEST(ShmAllreduce, TheSliceOfARankThatDiedAfterContributingIsSummedByTheOthers) {
  const auto data = random_vectors(3, 3001, 5);
  std::vector<Signal> done(3);
  auto g = group(3);  // after what its threads may still use: destroyed first
  ASSERT_NO_FATAL_FAILURE(round_zero_then_rank_two_comes_alone(g, data, done));
  g[2].reset();  // dies in the middle of round 1
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 1, data[r], 1.0, done[r].ready()).ok());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(done[0].calls, 1) << "slice 2 waits for its owner until it is declared gone";
  EXPECT_NE(g[0]->waiting_for(0).find("slices not summed"), std::string::npos) << g[0]->waiting_for(0);
  g[0]->leave(2);
  g[1]->leave(2);
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(done[r].wait_for(2)) << g[r]->waiting_for(r);
  EXPECT_EQ(g[0]->total_weight(0), 4.0);
  const auto m0 = g[0]->mean(0), m1 = g[1]->mean(1);
  EXPECT_TRUE(std::equal(m0.begin(), m0.end(), m1.begin(), m1.end()));
  for (std::size_t i : {std::size_t{0}, std::size_t{1500}, std::size_t{3000}})  // a value of each slice
    EXPECT_NEAR(m0[i], (data[0][i] + data[1][i] + 2 * data[2][i]) / 4.0, 1e-6) << i;
  EXPECT_EQ(done[2].calls, 1);
}

// Rank 2 contributes to round 1 and is declared lost while its process
// still runs (its heartbeats stopped: paused, say). It was still averaged
// in, and still summed its slice when it woke, once the others had gone on
// (an audit saw such a rank overwrite a later round's mean). Now only the
// ranks not lost contribute, and it writes nothing more.
TEST(ShmAllreduce, ARankDeclaredLostWhileItStillRunsIsNotAveragedInAndWritesNothingMore) {
  const auto data = random_vectors(3, 3001, 6);
  std::vector<Signal> done(3);
  auto g = group(3);  // after what its threads may still use: destroyed first
  ASSERT_NO_FATAL_FAILURE(round_zero_then_rank_two_comes_alone(g, data, done));
  g[0]->leave(2);
  g[1]->leave(2);
  // (Each collective's I/O thread takes the word to the segment: the round
  // below must not begin before it has, or rank 2 still counts as live.)
  std::this_thread::sleep_for(200ms);
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 1, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(done[r].wait_for(2)) << g[r]->waiting_for(r);
  EXPECT_EQ(g[0]->total_weight(0), 2.0) << "the lost rank's gradient is not averaged in";
  const auto m0 = g[0]->mean(0);
  for (std::size_t i : {std::size_t{0}, std::size_t{1500}, std::size_t{3000}})
    EXPECT_NEAR(m0[i], (data[0][i] + data[1][i]) / 2.0, 1e-6) << i;
  // Another round without it: its thread wrote nothing into it.
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 2, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(done[r].wait_for(3)) << g[r]->waiting_for(r);
  const auto m1 = g[1]->mean(1);
  EXPECT_NEAR(m1[2999], (data[0][2999] + data[1][2999]) / 2.0, 1e-6);
}

// A group that only passes copies (gossip) made a segment it never used;
// a worker 0 killed left it in /dev/shm until the next such job.
TEST(ShmAllreduce, AGroupThatWillNotAllReduceMakesNoSegment) {
  const auto g = asgd_test::collective_group(2, [] {
    auto c = make_zmq_collective("tcp://127.0.0.1:*");
    EXPECT_TRUE(c.ok());
    (*c)->set_shared_memory(true, 5s);
    (*c)->set_allreduces(false);
    return *c;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(std::filesystem::exists(segment_of(g)));
}

TEST(ShmAllreduce, ARankThatLeavesIsNotWaitedForAndTheOthersGoOn) {
  const auto data = random_vectors(3, 64, 2);
  auto g = group(3);  // after what its threads may still use: destroyed first
  g[2]->leave(2);  // out of data before the first round
  std::vector<Signal> done(2);
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g[r]->allreduce_mean(r, 0, data[r], 1.0, done[r].ready()).ok());
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(done[r].wait_for(1)) << g[r]->waiting_for(r);
  EXPECT_NEAR(g[1]->mean(1)[3], (data[0][3] + data[1][3]) / 2.0, 1e-6);
}

// Rank 1 is not a collective (another host, or a process that never got
// that far): after the settling time the others use the ring, which then
// waits for it like any missing rank.
TEST(ShmAllreduce, ARankThatNeverJoinsMakesTheGroupUseTheRing) {
  std::vector<std::shared_ptr<NetworkCollective>> g;
  std::vector<std::string> endpoints;
  for (Rank r = 0; r < 2; ++r) {
    g.push_back(*make_zmq_collective("tcp://127.0.0.1:*"));
    g.back()->set_shared_memory(true, 300ms);
    endpoints.push_back(g.back()->endpoint());
  }
  auto absent = *make_zmq_collective("tcp://127.0.0.1:*");
  absent->set_shared_memory(false);  // connects, never joins the segment
  endpoints.push_back(absent->endpoint());
  for (Rank r = 0; r < 2; ++r) ASSERT_TRUE(g[r]->connect(r, endpoints).ok());
  ASSERT_TRUE(absent->connect(2, endpoints).ok());
  const auto data = random_vectors(3, 100, 3);
  Signal s0, s1, s2;
  ASSERT_TRUE(g[0]->allreduce_mean(0, 0, data[0], 1.0, s0.ready()).ok());
  ASSERT_TRUE(g[1]->allreduce_mean(1, 0, data[1], 1.0, s1.ready()).ok());
  ASSERT_TRUE(absent->allreduce_mean(2, 0, data[2], 1.0, s2.ready()).ok());
  for (Signal* s : {&s0, &s1, &s2}) ASSERT_TRUE(s->wait_for(1)) << g[0]->waiting_for(0);
  const auto m0 = g[0]->mean(0), m2 = absent->mean(2);
  EXPECT_TRUE(std::equal(m0.begin(), m0.end(), m2.begin(), m2.end())) << "all three went round the ring";
  EXPECT_NEAR(m0[11], (data[0][11] + data[1][11] + data[2][11]) / 3.0, 1e-6);
}

// A rank 0 that died before every rank joined leaves its segment's name in
// /dev/shm; the next process that joins an all-reduce removes the segments
// whose rank 0 no longer runs (by the header's pid: wire-protocol.md), and
// nothing else.
TEST(ShmAllreduce, SegmentsWhoseRankZeroNoLongerRunsAreRemovedAndOthersStay) {
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  const std::string base = "/asgd-allreduce-test-" + std::to_string(getpid()) + "-";
  // magic, version, ranks, rank 0's pid; `bytes` long (a segment's header is smaller than 1 MiB).
  const auto segment = [&](const std::string& name, std::uint32_t magic, std::uint32_t pid, std::size_t bytes) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << name;
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    const std::uint32_t head[4] = {magic, 1, 2, pid};
    ASSERT_EQ(pwrite(fd, head, sizeof head, 0), static_cast<ssize_t>(sizeof head));
    close(fd);
  };
  const std::uint32_t asar = 0x52415341, dead = static_cast<std::uint32_t>(gone),
                      alive = static_cast<std::uint32_t>(getpid());
  segment(base + "stale", asar, dead, 1 << 20);
  segment(base + "live", asar, alive, 1 << 20);
  segment(base + "foreign", 0x12345678, dead, 1 << 20);
  segment(base + "short", asar, dead, 16);
  EXPECT_GE(ShmAllreduce::remove_stale_segments(), 1u);
  const auto exists = [](const std::string& name) { return std::filesystem::exists("/dev/shm" + name); };
  EXPECT_FALSE(exists(base + "stale"));
  EXPECT_TRUE(exists(base + "live"));
  EXPECT_TRUE(exists(base + "foreign"));
  EXPECT_TRUE(exists(base + "short"));
  for (const char* n : {"stale", "live", "foreign", "short"}) shm_unlink((base + n).c_str());
}

}  // namespace
}  // namespace asgd::messaging
