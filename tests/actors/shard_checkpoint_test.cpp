// The shard actor's periodic checkpoints: taken between requests, written on
// a thread of their own, so that a slow disk never stops the shard serving
// (nor, in a shard process, the bridge thread it may run on).
//
// The slow disk is a named pipe where the checkpoint's temporary file goes:
// the write's open() blocks until the test opens the other end, for as long
// as the test likes, and its fsync() then fails, as on a file system that
// cannot flush.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caf/all.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "actors/checkpoint_claim.hpp"
#include "actors/parameter_shard.hpp"
#include "captured_log.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

namespace asgd {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kSize = 1000;

// An actor system that knows asgd's messages, and an actor of the test's on it.
struct AsgdConfig : caf::actor_system_config {
  AsgdConfig() { add_message_types<caf::id_block::asgd>(); }
};
struct Actors {
  AsgdConfig cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
};

ShardStats stats_of(caf::scoped_actor& self, const caf::actor& shard) {
  ShardStats out;
  self->request(shard, 2s, stats_atom::value)
      .receive([&](const ShardStats& s) { out = s; },
               [&](const caf::error& e) { ADD_FAILURE() << "no stats from the shard: " << to_string(e); });
  return out;
}

// Reads the pipe at `fd` until its writer closes it; false after 10 s.
bool drain(int fd) {
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return true;  // the writer closed it
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
  }
  return false;
}

// A shard with one worker checkpointing into `path` every `every_s` seconds;
// with `reload`, restarted from the checkpoint there, as a shard process
// that takes the place of one given up for dead.
caf::actor spawn_shard(caf::actor_system& sys, const std::string& path, double every_s, bool reload = false) {
  ShardSetup setup;
  setup.range = {0, kSize};
  setup.initial.assign(kSize, 1.0f);
  setup.optimizer = {"sgd", 0.1f, 0.0f, 0.0f};
  setup.checkpoint_path = path;
  setup.checkpoint_every_s = every_s;
  auto core = ShardCore::make(std::move(setup));
  EXPECT_TRUE(core.ok()) << core.status().to_string();
  if (reload) {
    EXPECT_TRUE(core->restore(path, {}).ok());
  }
  return sys.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
}

TEST(ShardCheckpoints, AShardServesOnWhileItsCheckpointIsStuckOnTheDiskAndCountsTheWriteWhenItEnds) {
  asgd_test::CapturedLog log;
  asgd_test::TempDir dir;
  const std::string path = (dir / "shard-0.ckpt").string();
  ASSERT_EQ(::mkfifo((path + ".1.tmp").c_str(), 0600), 0);

  Actors actors;
  caf::actor_system& sys = actors.sys;
  caf::scoped_actor& self = actors.self;
  auto shard = spawn_shard(sys, path, 0.05);

  // The first periodic checkpoint is now stuck in open() on the pipe.
  std::this_thread::sleep_for(300ms);
  int answered = 0;
  for (Clock c = 0; c < 20; ++c) {
    self->request(shard, 2s, push_atom::value, PushRequest{0, c, c, 1, true, std::vector<float>(kSize, 1.0f)})
        .receive(
            [&](const ShardReply& r) {
              EXPECT_EQ(r.params.size(), kSize);
              ++answered;
            },
            [&](const caf::error& e) { ADD_FAILURE() << "push " << c << " unanswered: " << to_string(e); });
  }
  EXPECT_EQ(answered, 20);
  ShardStats during = stats_of(self, shard);
  EXPECT_EQ(during.updates_applied, 20u);
  EXPECT_EQ(during.checkpoint_failures, 0u);
  EXPECT_EQ(during.checkpoint_unix_s, 0.0);  // none written yet
  EXPECT_GE(log.count("periodic checkpoint skipped: the one taken"), 1u) << log.all();

  // The disk comes back: the stuck write goes through the pipe, cannot be
  // flushed, and counts as failed; later ones write a regular file.
  const int reader = ::open((path + ".1.tmp").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  ::unlink((path + ".1.tmp").c_str());
  EXPECT_TRUE(drain(reader)) << "the stuck checkpoint write never finished";
  ::close(reader);

  const auto deadline = std::chrono::steady_clock::now() + 10s;
  ShardStats after;
  while (std::chrono::steady_clock::now() < deadline) {
    after = stats_of(self, shard);
    if (after.checkpoint_failures > 0 && after.checkpoint_unix_s > 0) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(after.checkpoint_failures, 1u);
  EXPECT_GT(after.checkpoint_unix_s, 0.0) << "no checkpoint written after the stuck one";
  EXPECT_EQ(log.count("periodic checkpoint failed (1 in a row): cannot flush"), 1u) << log.all();
  auto saved = ShardCore::saved(path);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stats.updates_applied, 20u);

  self->send_exit(shard, caf::exit_reason::user_shutdown);
}

void push(caf::scoped_actor& self, const caf::actor& shard, Clock c) {
  self->request(shard, 2s, push_atom::value, PushRequest{0, c, c, 1, true, std::vector<float>(kSize, 1.0f)})
      .receive([](const ShardReply&) {}, [&](const caf::error& e) { ADD_FAILURE() << to_string(e); });
}

// The file's inode: a new one for every write (written aside, then renamed).
ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The last worker leaves (the final checkpoint), `after` runs, the shard is
// told to stop: whether the file was written again.
bool written_again_at_stop(const std::string& path, const std::function<void(caf::scoped_actor&, const caf::actor&)>& after) {
  Actors actors;
  caf::actor_system& sys = actors.sys;
  caf::scoped_actor& self = actors.self;
  auto shard = spawn_shard(sys, path, 3600);  // no periodic checkpoint in the test's time
  for (Clock c = 0; c < 3; ++c) push(self, shard, c);
  self->send(shard, leave_atom::value, WorkerId{0});
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (stats_of(self, shard).checkpoint_unix_s == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  const ino_t final_one = inode_of(path);
  EXPECT_NE(final_one, 0u) << "no final checkpoint";
  after(self, shard);
  self->send_exit(shard, caf::exit_reason::user_shutdown);
  self->wait_for(shard);
  return inode_of(path) != final_one;
}

TEST(ShardCheckpoints, AShardStoppedRightAfterItsFinalCheckpointDoesNotWriteItAgainButOneThatChangedSinceDoes) {
  asgd_test::TempDir dir;
  EXPECT_FALSE(written_again_at_stop((dir / "same.ckpt").string(), [](auto&, const auto&) {}));
  // The worker comes back and pushes once more: the state on disk is old.
  EXPECT_TRUE(written_again_at_stop((dir / "changed.ckpt").string(), [](caf::scoped_actor& self, const caf::actor& s) {
    self->send(s, join_atom::value, WorkerId{0}, Clock{3});
    push(self, s, 3);
  }));
  auto saved = ShardCore::saved((dir / "changed.ckpt").string());
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  EXPECT_EQ(saved->stats.updates_applied, 4u);
}

TEST(ShardCheckpoints, APeriodicCheckpointIsWrittenOnlyWhenTheStateChangedSinceTheLastOne) {
  asgd_test::TempDir dir;
  const std::string path = (dir / "shard-0.ckpt").string();
  Actors actors;
  caf::actor_system& sys = actors.sys;
  caf::scoped_actor& self = actors.self;
  auto shard = spawn_shard(sys, path, 0.02);
  for (Clock c = 0; c < 3; ++c) push(self, shard, c);
  // The written file's inode once it holds `updates`; 0 if it does not within 10 s.
  const auto written_with = [&](std::uint64_t updates) -> ino_t {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto saved = ShardCore::saved(path); saved.ok() && saved->stats.updates_applied == updates) return inode_of(path);
      std::this_thread::sleep_for(10ms);
    }
    return 0;
  };
  const ino_t first = written_with(3);
  ASSERT_NE(first, 0u) << "no periodic checkpoint of the three updates";
  auto saved = ShardCore::saved(path);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  // The writer's thread renames the file, then tells the shard: the shard's
  // stats may lag the file by a moment (seen once in a full suite run).
  EXPECT_TRUE(asgd_test::eventually([&] { return stats_of(self, shard).checkpoint_unix_s != 0; }));
  EXPECT_EQ(stats_of(self, shard).checkpoint_unix_s, saved->written_unix_s) << "the file and the shard disagree on its time";
  // (A file written twice since could have the first inode back: its time too.)
  const auto modified = [&] {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec : 0LL;
  };
  const long long first_time = modified();
  std::this_thread::sleep_for(300ms);  // fifteen periods with nothing new
  EXPECT_EQ(inode_of(path), first) << "the same state was written again";
  EXPECT_EQ(modified(), first_time) << "the same state was written again";
  push(self, shard, 3);
  const ino_t second = written_with(4);
  EXPECT_NE(second, 0u) << "the update after it never reached a checkpoint";
  EXPECT_NE(second, first);
  self->send_exit(shard, caf::exit_reason::user_shutdown);
}

// The number of updates the checkpoint at `path` holds once it holds
// `updates`, within 10 s; what it holds then otherwise.
std::uint64_t saved_updates(const std::string& path, std::uint64_t updates) {
  std::uint64_t seen = 0;
  asgd_test::eventually([&] {
    auto saved = ShardCore::saved(path);
    seen = saved.ok() ? saved->stats.updates_applied : 0;
    return seen == updates;
  });
  return seen;
}

// A shard process given up for dead (stopped, not killed) and replaced by
// another that reloaded its checkpoint: when the first one wakes, neither
// its periodic checkpoints nor the one it writes when told to stop reach
// the file, which stays the newer process's (a restart or --resume from it
// would otherwise go back in time without a word).
TEST(ShardCheckpoints, AShardWhosePlaceAnotherTookNoLongerWritesOverItsCheckpoint) {
  asgd_test::CapturedLog log;
  asgd_test::TempDir dir;
  const std::string path = (dir / "shard-0.ckpt").string();
  Actors actors;
  caf::actor_system& sys = actors.sys;
  caf::scoped_actor& self = actors.self;
  auto first = spawn_shard(sys, path, 0.02);
  for (Clock c = 0; c < 3; ++c) push(self, first, c);
  ASSERT_EQ(saved_updates(path, 3), 3u);
  auto second = spawn_shard(sys, path, 0.02, true);
  for (Clock c = 3; c < 5; ++c) push(self, second, c);
  ASSERT_EQ(saved_updates(path, 5), 5u);
  push(self, first, 3);  // the first wakes: its state changes, its timer ticks
  std::this_thread::sleep_for(200ms);
  self->send_exit(first, caf::exit_reason::user_shutdown);
  self->wait_for(first);
  EXPECT_EQ(saved_updates(path, 5), 5u) << "the stale shard wrote over the newer one's checkpoint";
  EXPECT_EQ(log.count("shard 0: periodic checkpoint not written, nor any after it: " + path +
                      " was claimed by another process after this one (its claim 2, this one's 1)"),
            1u)
      << log.all();
  push(self, second, 5);  // the newer one goes on checkpointing
  EXPECT_EQ(saved_updates(path, 6), 6u);
  self->send_exit(second, caf::exit_reason::user_shutdown);
}

TEST(CheckpointClaims, EachClaimSupersedesTheOnesBeforeAndClearsTheirTemporaryFiles) {
  asgd_test::TempDir dir;
  const std::string file = (dir / "sub" / "shard-1.ckpt").string();
  const auto contents = [&] {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto one = claim_checkpoint(file);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(*one, 1u);
  ASSERT_TRUE(write_claimed(file, 1, "first").ok());
  {
    std::ofstream left(file + ".1.tmp");  // a write killed half-way
    left << "half";
  }
  auto two = claim_checkpoint(file);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(*two, 2u);
  EXPECT_FALSE(std::filesystem::exists(file + ".1.tmp"));
  const Status stale = write_claimed(file, 1, "stale");
  EXPECT_EQ(stale.code(), StatusCode::cancelled) << stale.to_string();
  EXPECT_EQ(contents(), "first");
  EXPECT_TRUE(write_claimed(file, 2, "second").ok());
  EXPECT_EQ(contents(), "second");
  // A claim file that holds no number is refused, not taken as none.
  { std::ofstream(file + ".claim") << "x"; }
  EXPECT_EQ(claim_checkpoint(file).status().code(), StatusCode::corruption);
}

}  // namespace
}  // namespace asgd
