// A stranger at a real cluster's endpoints, without --auth-keys: peers that
// complete ZeroMQ's handshake with the coordinator and with a shard, then
// announce half a gigabyte they never send. Each process drops them at the
// announcement, so its memory stays where it was; it logs each one when it
// happens and the count when it ends.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "messaging/hostile_peer.hpp"
#include "runtime/asgd_processes.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

using namespace std::chrono_literals;
using asgd_test::read_file;

// What follows `tag` in `text`, up to the end of its line.
std::string after(const std::string& text, const std::string& tag) {
  const auto at = text.find(tag);
  if (at == std::string::npos) return "";
  const auto from = at + tag.size();
  return text.substr(from, text.find('\n', from) - from);
}

std::size_t occurrences(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ClusterUnderAttack, FourPeersAnnouncingHalfAGigabyteLeaveTheCoordinatorAndAShardWithinTenPercentAndAreCounted) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  const asgd_test::TempDir scratch;
  const auto log = scratch / "cluster.log";
  const pid_t cluster = asgd_test::start_asgd(
      {"cluster", "--workers", "1", "--shards", "1", "--epochs", "50", "--data-dir", dir.string()}, log);
  ASSERT_GT(cluster, 0);
  // After the first epoch the coordinator has evaluated once and the shard
  // has served a few hundred pushes: both are at their working size.
  ASSERT_TRUE(asgd_test::wait_for_text(log, "epoch 1/50", 120s, cluster)) << read_file(log);
  const std::string text = read_file(log);
  const std::string coordinator_at = after(text, "coordinator listening on ");
  const std::string shard_at = after(text, "serving at ");
  const auto coordinator = asgd_test::child_with_args(cluster, {"coordinator"});
  const auto shard = asgd_test::child_with_args(cluster, {"shard"});
  ASSERT_TRUE(coordinator && shard) << text;
  ASSERT_FALSE(coordinator_at.empty() || shard_at.empty()) << text;

  const std::size_t coordinator_before = asgd_test::resident_bytes(*coordinator);
  const std::size_t shard_before = asgd_test::resident_bytes(*shard);
  std::vector<asgd_test::RawConnection> peers;
  constexpr std::uint64_t kAnnounced = 500ull << 20;
  constexpr std::size_t kSent = 64u << 20;
  const std::size_t taken = asgd_test::announce_and_stall(coordinator_at, 4, kAnnounced, kSent, peers) +
                            asgd_test::announce_and_stall(shard_at, 4, kAnnounced, kSent, peers);
  const std::string coordinator_line = "coordinator: refused a connection from 127.0.0.1:";
  // (The shard's endpoint was named before it knew its index.)
  const std::string shard_line = "shard: refused a connection from 127.0.0.1:";
  EXPECT_TRUE(asgd_test::eventually([&] {
    const std::string now = read_file(log);
    return occurrences(now, coordinator_line) >= 4 && occurrences(now, shard_line) >= 4;
  })) << read_file(log);
  const std::size_t coordinator_after = asgd_test::resident_bytes(*coordinator);
  const std::size_t shard_after = asgd_test::resident_bytes(*shard);
  RecordProperty("coordinator_resident_kb", std::to_string(coordinator_before / 1024) + " -> " +
                                                std::to_string(coordinator_after / 1024));
  RecordProperty("shard_resident_kb", std::to_string(shard_before / 1024) + " -> " + std::to_string(shard_after / 1024));
  const std::string figures = "coordinator " + std::to_string(coordinator_before / 1000000) + " -> " +
                              std::to_string(coordinator_after / 1000000) + " MB, shard " +
                              std::to_string(shard_before / 1000000) + " -> " + std::to_string(shard_after / 1000000) +
                              " MB; " + std::to_string(taken / 1000000) + " MB taken from the peers";
  EXPECT_LE(coordinator_after, coordinator_before + coordinator_before / 10) << figures;
  EXPECT_LE(shard_after, shard_before + shard_before / 10) << figures;
  for (auto& p : peers) EXPECT_TRUE(p.closed_by_peer(5s)) << "every one of them was dropped";

  // Stopped (Ctrl-C), each process says what it refused.
  ::kill(cluster, SIGINT);
  const auto code = asgd_test::wait_exit(cluster, 60s);
  ASSERT_TRUE(code) << read_file(log);
  const std::string end = read_file(log);
  EXPECT_EQ(occurrences(end, coordinator_line), 4u) << end;
  EXPECT_EQ(occurrences(end, shard_line), 4u) << end;
  EXPECT_NE(end.find("coordinator: refused 4 connections to its endpoint (0 over its limit"), std::string::npos) << end;
  EXPECT_NE(end.find("shard 0: refused 4 connections to its endpoint (0 over its limit"), std::string::npos) << end;
}

}  // namespace
}  // namespace asgd
