// Shard checkpoints and --resume: a stopped job continues where its shards
// last wrote their state.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <stop_token>

#include <nlohmann/json.hpp>

#include "actors/parameter_shard.hpp"
#include "asgd/job.hpp"
#include "http_client.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"
#include "test_data.hpp"
#include "actors/shard_driver.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;

ShardSetup setup_for(const char* optimizer, std::uint32_t index = 1) {
  ShardSetup s;
  s.index = index;
  s.range = {100, 100 + 300};
  s.initial.assign(300, 0.5f);
  s.optimizer = {optimizer, 0.05f, 0.9f, 0.001f};
  s.workers = 2;
  return s;
}

std::vector<float> gradient(Clock c) {
  std::vector<float> g(300);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 13 + c * 7) % 17) / 17.0f - 0.5f;
  return g;
}

std::vector<float> params_of(const ShardCore& core) { return {core.params().begin(), core.params().end()}; }

TEST(ShardCheckpoint, ARestoredShardContinuesExactlyAsTheOriginalWouldHave) {
  const asgd_test::TempDir dir;
  for (const char* kind : {"sgd", "momentum", "adagrad", "adam"}) {
    auto a = ShardCore::make(setup_for(kind));
    ASSERT_TRUE(a.ok());
    asgd_test::ShardDriver original(std::move(a).value());
    for (Clock c = 0; c < 5; ++c) original.push_now({static_cast<WorkerId>(c % 2), c, c, 8, false, gradient(c)});
    const std::string path = shard_checkpoint_path(dir.path().string(), 1);
    ASSERT_TRUE(original.core.save(path).ok());

    auto b = ShardCore::make(setup_for(kind));
    ASSERT_TRUE(b.ok());
    asgd_test::ShardDriver restored(std::move(b).value());
    const std::vector<Clock> restart = {5, 5};
    ASSERT_TRUE(restored.core.restore(path, restart).ok()) << kind;
    EXPECT_EQ(params_of(restored.core), params_of(original.core)) << kind;
    EXPECT_EQ(restored.core.stats().updates_applied, 5u);
    EXPECT_EQ(restored.core.stats().worker_clock, restart);
    // The optimizer state came back too: the next steps agree bit for bit.
    for (Clock c = 5; c < 8; ++c) {
      original.push_now({0, c, c, 8, false, gradient(c)});
      restored.push_now({0, c, c, 8, false, gradient(c)});
    }
    EXPECT_EQ(params_of(restored.core), params_of(original.core)) << kind;
  }
}

// A shard process restarted mid-job keeps the checkpoint's clocks and the
// workers that had left: the workers go on from where they are.
TEST(ShardCheckpoint, RestoredWithoutRestartClocksItKeepsTheCheckpointsClocksAndDepartures) {
  const asgd_test::TempDir dir;
  auto a = ShardCore::make(setup_for("momentum"));
  ASSERT_TRUE(a.ok());
  asgd_test::ShardDriver original(std::move(a).value());
  for (Clock c = 0; c < 6; ++c) original.push_now({0, c, c, 8, false, gradient(c)});
  original.push_now({1, 0, 0, 8, false, gradient(0)});
  std::vector<ShardCore::Answer> out;
  original.core.leave(1, std::chrono::steady_clock::now(), out);
  const std::string path = shard_checkpoint_path(dir.path().string(), 1);
  ASSERT_TRUE(original.core.save(path).ok());

  auto b = ShardCore::make(setup_for("momentum"));
  ASSERT_TRUE(b.ok());
  asgd_test::ShardDriver restored(std::move(b).value());
  ASSERT_TRUE(restored.core.restore(path, {}).ok());
  EXPECT_EQ(params_of(restored.core), params_of(original.core));
  EXPECT_EQ(restored.core.stats().worker_clock, (std::vector<Clock>{6, 1}));
  EXPECT_EQ(restored.core.stats().updates_applied, 7u);
  // Worker 1 had left: its pushes are still refused.
  const auto refused = restored.core.stats().refused_departed;
  restored.push_now({1, 1, 1, 8, false, gradient(1)});
  EXPECT_EQ(restored.core.stats().refused_departed, refused + 1);
}

// Elastic join: a worker that had left counts again from the clock it
// rejoins at, and a barrier below that clock does not wait for it.
TEST(ShardRejoin, AWorkerThatLeftPushesAgainFromItsNewClockAndHoldsNoEarlierBarrier) {
  ShardSetup setup = setup_for("sgd");
  setup.policy.name = "bsp";
  auto a = ShardCore::make(std::move(setup));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  asgd_test::ShardDriver shard(std::move(a).value());
  shard.leave(1);
  const auto refused = shard.core.stats().refused_departed;
  shard.push_now({1, 0, 0, 8, false, gradient(0)});
  EXPECT_EQ(shard.core.stats().refused_departed, refused + 1);  // gone: refused
  shard.core.rejoin(1, 4);
  EXPECT_EQ(shard.core.stats().worker_clock[1], 4u);
  // Worker 0's clocks 0..3 commit without worker 1 (its clock is past them).
  for (Clock c = 0; c < 4; ++c) shard.push_now({0, c, c, 8, false, gradient(c)});
  EXPECT_EQ(shard.core.complete_clock(), 4u);
  // From clock 4 on both count again: 4 commits only with worker 1's push.
  shard.push_now({0, 4, 4, 8, false, gradient(4)});
  EXPECT_EQ(shard.core.complete_clock(), 4u);
  shard.push_now({1, 4, 4, 8, false, gradient(4)});
  EXPECT_EQ(shard.core.complete_clock(), 5u);
  EXPECT_EQ(shard.core.stats().refused_departed, refused + 1);
}

TEST(ShardCheckpoint, ADamagedOrForeignCheckpointIsRefusedNamingTheFile) {
  const asgd_test::TempDir dir;
  auto a = ShardCore::make(setup_for("momentum"));
  ASSERT_TRUE(a.ok());
  const std::string path = shard_checkpoint_path(dir.path().string(), 1);
  ASSERT_TRUE(a->save(path).ok());
  const std::vector<Clock> restart = {0, 0};

  auto other_shard = ShardCore::make(setup_for("momentum", 2));
  ASSERT_TRUE(other_shard.ok());
  Status s = other_shard->restore(path, restart);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("shard-1.ckpt"), std::string::npos) << s.message();

  auto other_optimizer = ShardCore::make(setup_for("adam"));
  ASSERT_TRUE(other_optimizer.ok());
  EXPECT_EQ(other_optimizer->restore(path, restart).code(), StatusCode::invalid_argument);

  {  // one flipped byte in the values
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-20, std::ios::end);
    f.put('\x7f');
  }
  auto same = ShardCore::make(setup_for("momentum"));
  ASSERT_TRUE(same.ok());
  s = same->restore(path, restart);
  EXPECT_EQ(s.code(), StatusCode::corruption);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  for (float p : same->params()) EXPECT_EQ(p, 0.5f);  // nothing half-loaded

  EXPECT_EQ(same->restore((dir / "missing.ckpt").string(), restart).code(), StatusCode::not_found);
}

using asgd_test::read_jsonl;

// Under hogwild too, whose workers push nothing: its shard's checkpoints
// count their steps on the shared buffer (they held clock 0, and a resume
// trained every epoch again).
class Resume : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Policies, Resume, ::testing::Values("async", "hogwild"));

TEST_P(Resume, AJobStoppedAfterItsFirstEpochContinuesFromTheShardCheckpoints) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  const asgd_test::TempDir dir;
  JobConfig c;
  c.policy = GetParam();
  c.data_dir = data.string();
  c.epochs = 3;
  c.batch = 32;
  c.checkpoint_dir = (dir / "ckpt").string();
  c.checkpoint_every_s = 0.2;
  c.metrics_out = (dir / "run.jsonl").string();
  // The first run is stopped once its first epoch is evaluated; the shards
  // checkpoint as they stop. Worker 1 is four times slower, so worker 0 has
  // reported later epochs before the first is complete: the epoch must still
  // be evaluated (and the stop requested) at once, not once all are in.
  c.straggler = "1:4";

  std::stop_source stop;
  JobCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& m) {
    if (m.epoch == 1) stop.request_stop();
  };
  auto first = run_job(c, callbacks, stop.get_token());
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::cancelled);
  ASSERT_TRUE(fs::exists(dir / "ckpt" / "shard-0.ckpt"));
  ASSERT_TRUE(fs::exists(dir / "ckpt" / "job.toml"));
  // Its metrics file ends saying how it stopped (it ended after the last
  // epoch line, as a crash would, before).
  const auto stopped = read_jsonl(c.metrics_out);
  ASSERT_FALSE(stopped.empty());
  EXPECT_EQ(stopped.back()["event"], "stopped") << stopped.back().dump();
  EXPECT_EQ(stopped.back()["status"], "cancelled") << stopped.back().dump();
  EXPECT_GT(stopped.back()["wall_s"].get<double>(), 0.0);

  JobConfig again = c;
  again.resume = c.checkpoint_dir;
  again.checkpoint_dir.clear();  // defaults to the folder resumed from
  again.straggler.clear();
  std::vector<std::uint32_t> epochs;
  JobCallbacks seen;
  seen.on_epoch = [&](const EpochMetrics& m) { epochs.push_back(m.epoch); };
  auto second = run_job(again, seen);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_FALSE(epochs.empty());
  EXPECT_GE(epochs.front(), 2u) << "it trained epoch 1 again";
  EXPECT_EQ(epochs.back(), 3u);
  EXPECT_GE(second->final_test_accuracy, 0.95);

  // The metrics file goes on: the first run's epoch, then the resume record
  // saying what was lost at most, then the rest.
  const auto lines = read_jsonl(c.metrics_out);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0]["event"], "epoch");
  const auto resume = std::find_if(lines.begin(), lines.end(), [](const auto& j) { return j["event"] == "resume"; });
  ASSERT_NE(resume, lines.end());
  EXPECT_EQ((*resume)["epoch"], 2) << resume->dump();
  EXPECT_EQ((*resume)["lost_at_most_s"], 0.2);
  EXPECT_GT((*resume)["updates"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(lines.back()["event"], "summary");

  // A finished job has nothing left to resume.
  auto third = run_job(again);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(third.status().message().find("had trained 3 epochs, all of --epochs 3; give --epochs above 3"),
            std::string::npos)
      << third.status().message();
  // With fewer --epochs, what it trained (it said "all 2 epochs").
  again.epochs = 2;
  const auto fewer = run_job(again);
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("had trained 3 epochs, all of --epochs 2; give --epochs above 3"),
            std::string::npos)
      << fewer.status().message();
}

TEST(ResumeRefused, AFolderWithoutShardCheckpointsIsRefusedSayingWhatIsMissing) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  const asgd_test::TempDir dir;
  JobConfig c;
  c.data_dir = data.string();
  c.resume = dir.path().string();
  c.metrics_out = (dir / "run.jsonl").string();
  std::ofstream(c.metrics_out) << "{\"event\": \"epoch\"}\n";
  auto r = run_job(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
  EXPECT_NE(r.status().message().find("shard-0.ckpt"), std::string::npos) << r.status().message();
  // A refused resume leaves the metrics file it would go on as it was (a
  // "stopped" line was appended for this one).
  std::stringstream kept;
  kept << std::ifstream(c.metrics_out).rdbuf();
  EXPECT_EQ(kept.str(), "{\"event\": \"epoch\"}\n");
}

// A shard whose checkpoints cannot be written (here a folder stands where
// its claim file goes) says so while the job runs (/status) and after
// it (the summary).
TEST(CheckpointFailures, AreCountedOnStatusAndInTheSummary) {
  ASGD_REQUIRE_DATASET(data, "mnist");
  const asgd_test::TempDir dir;
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt / "shard-0.ckpt.claim");
  const int port = asgd_test::free_port();
  ASSERT_GT(port, 0);
  JobConfig c;
  c.data_dir = data.string();
  c.epochs = 2;
  c.batch = 16;
  c.shards = 2;
  c.checkpoint_dir = ckpt.string();
  c.checkpoint_every_s = 0.1;
  c.status_port = static_cast<std::uint16_t>(port);
  auto job = std::async(std::launch::async, [&] { return run_job(c); });

  nlohmann::json seen;
  const bool failing = asgd_test::eventually(
      [&] {
        const auto r = asgd_test::http(port, "GET", "/status");
        if (r.status != 200) return false;
        seen = r.body_json();
        return seen["shard"].size() == 2 && seen["shard"][0]["checkpoint_failures"].get<std::uint64_t>() > 0 &&
               !seen["shard"][1]["checkpoint_age_s"].is_null();
      },
      std::chrono::seconds(60));
  EXPECT_TRUE(failing) << "/status never showed shard 0's failures and shard 1's checkpoint: " << seen.dump();
  if (failing) {
    EXPECT_EQ(seen["shard"][1]["checkpoint_failures"], 0) << seen.dump();
    EXPECT_TRUE(seen["shard"][0]["checkpoint_age_s"].is_null()) << "shard 0 never wrote one: " << seen.dump();
    EXPECT_LT(seen["shard"][1]["checkpoint_age_s"].get<double>(), 5.0) << seen.dump();
  }

  auto summary = job.get();
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  EXPECT_GT(summary->checkpoint_failures, 0u);
  EXPECT_FALSE(fs::exists(ckpt / "shard-0.ckpt"));
  EXPECT_TRUE(fs::exists(ckpt / "shard-1.ckpt"));
}

}  // namespace
}  // namespace asgd
