// A real worker, data feeder and shards, wired as the coordinator wires them:
// one training step must update every parameter exactly once, at the shard
// that owns its key, by exactly -lr * the gradient the worker computed.

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"
#include "synthetic_data.hpp"

namespace asgd {
namespace {

// A worker training the mlp on 28x28 images, replying to `coordinator`.
WorkerSetup mlp_worker(WorkerId id, std::vector<caf::actor> shards, std::vector<KeyRange> ranges, caf::actor feeder,
                       caf::scoped_actor& coordinator, caf::timespan rpc_timeout) {
  WorkerSetup ws;
  ws.id = id;
  ws.model = "mlp";
  ws.sample_shape = {1, 28, 28};
  ws.shards = std::move(shards);
  ws.ranges = std::move(ranges);
  ws.feeder = std::move(feeder);
  ws.coordinator = caf::actor_cast<caf::actor>(coordinator);
  ws.rpc_timeout = rpc_timeout;
  return ws;
}

TEST(WorkerAndShards, AGradientPushedByAWorkerReachesTheShardThatOwnsEachKey) {
  constexpr std::uint32_t kShards = 3;
  constexpr std::uint32_t kBatch = 8;
  constexpr float kLr = 0.1f;
  auto data = asgd_test::synthetic_splits(kBatch);

  auto model = Model::build("mlp", {1, 28, 28}, 10);
  ASSERT_TRUE(model.ok());
  model->init_params(42);
  const std::vector<float> initial(model->params().begin(), model->params().end());
  const auto ranges = partition_keys(model->num_params(), kShards);

  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  std::vector<caf::actor> shards;
  for (std::uint32_t i = 0; i < kShards; ++i) {
    std::vector<float> slice(initial.begin() + static_cast<std::ptrdiff_t>(ranges[i].begin),
                             initial.begin() + static_cast<std::ptrdiff_t>(ranges[i].end));
    ShardSetup ss;
    ss.index = i;
    ss.range = ranges[i];
    ss.initial = std::move(slice);
    ss.optimizer = {"sgd", kLr, 0.0f, 0.0f};
    auto core = ShardCore::make(std::move(ss));
    ASSERT_TRUE(core.ok()) << core.status().to_string();
    shards.push_back(sys.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value())));
  }
  // One epoch of exactly one batch: the worker takes one step, then stops.
  auto feeder = sys.spawn<caf::detached>(data_feeder, FeederSetup{data, {0, kBatch}, 1, kBatch, 2, 1, 1, 0, {}});
  auto w = sys.spawn(worker, mlp_worker(0, shards, ranges, feeder, self, std::chrono::seconds(10)));
  self->send(w, start_atom::value);

  EpochReport report;
  self->receive([&](EpochReport& r) { report = r; },
                caf::after(std::chrono::seconds(10)) >> [] { FAIL() << "no epoch report from the worker within 10 s"; });
  EXPECT_EQ(report.samples, kBatch);
  EXPECT_EQ(report.updates, 1u);

  // The reference: the same gradient computed outside the runtime. The
  // feeder shuffles, so order the batch the way it did.
  const auto order = data::shuffled_order(kBatch, 1, 1, 0);
  data::Batch batch;
  data::gather_batch(data->train, order, batch);
  const float loss = model->compute_gradients(batch.x, batch.y);
  EXPECT_NEAR(report.loss_sum / kBatch, loss, 1e-5);
  const auto grads = model->grads();

  for (std::uint32_t i = 0; i < kShards; ++i) {
    ShardReply snap;
    self->request(shards[i], std::chrono::seconds(10), snapshot_atom::value)
        .receive([&](ShardReply& r) { snap = std::move(r); },
                 [&](caf::error& e) { FAIL() << "shard " << i << ": " << sys.render(e); });
    ASSERT_EQ(snap.params.size(), ranges[i].size());
    EXPECT_EQ(snap.version, 1u) << "shard " << i << " applied the push exactly once";
    for (std::size_t k = 0; k < snap.params.size(); ++k) {
      const std::size_t key = ranges[i].begin + k;
      const float expected = initial[key] - kLr * grads[key];
      ASSERT_NEAR(snap.params[k], expected, 1e-6f + 1e-5f * std::abs(expected)) << "key " << key;
    }
  }
  for (auto& s : shards) self->send_exit(s, caf::exit_reason::user_shutdown);
  self->send_exit(feeder, caf::exit_reason::user_shutdown);
}

TEST(BatchSource, ServesEverySampleOfItsPartitionOncePerEpochThenEnds) {
  auto data = asgd_test::synthetic_splits(50);
  BatchSource source({data, {10, 33}, 2, 5, 1, 3, 1, 0, {}});  // 23 samples -> 4 full batches and one of 3
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(50, 0);
    std::size_t batches = 0;
    while (true) {
      data::Batch b = source.next();
      ASSERT_EQ(b.epoch, epoch);
      ASSERT_EQ(b.index, batches);
      ++batches;
      for (std::size_t i = 0; i < b.size; ++i) {
        // Find which training sample this row is (rows are unique random data).
        for (std::size_t s = 10; s < 33; ++s) {
          if (std::equal(b.x.begin() + static_cast<std::ptrdiff_t>(i * 784), b.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * 784),
                         data->train.pixels.begin() + static_cast<std::ptrdiff_t>(s * 784))) {
            ++seen[s];
            EXPECT_EQ(b.y[i], data->train.labels[s]);
          }
        }
      }
      if (b.last_in_epoch) {
        EXPECT_EQ(b.size, 3u);
        break;
      }
      EXPECT_EQ(b.size, 5u);
    }
    EXPECT_EQ(batches, 5u);
    for (std::size_t s = 0; s < 50; ++s) EXPECT_EQ(seen[s], (s >= 10 && s < 33) ? 1 : 0) << "sample " << s;
  }
  EXPECT_TRUE(source.exhausted());
  EXPECT_EQ(source.next().size, 0u);
}

}  // namespace
}  // namespace asgd

namespace asgd {
namespace {

// A "shard" that accepts every request and never answers. (The unused
// argument sidesteps CAF 0.17 binding a null tuple for argument-less function
// actors, which UBSan reports.)
caf::behavior silent_shard(caf::event_based_actor* self, int /*unused*/) {
  return {
      [self](push_atom, const PushRequest&) {
        self->make_response_promise();  // dropped unanswered
        return caf::delegated<ShardReply>();
      },
      [self](pull_atom, const PullRequest&) {
        self->make_response_promise();
        return caf::delegated<ShardReply>();
      },
  };
}

TEST(Worker, FailsNamingTheShardThatDidNotAnswerWithinTheTimeout) {
  auto data = asgd_test::synthetic_splits(8);
  auto model = Model::build("mlp", {1, 28, 28}, 10);
  ASSERT_TRUE(model.ok());
  const auto ranges = partition_keys(model->num_params(), 2);

  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::vector<float> slice(ranges[0].size(), 0.0f);
  ShardSetup ss;
  ss.range = ranges[0];
  ss.initial = std::move(slice);
  ss.optimizer = {"sgd", 0.1f, 0.0f, 0.0f};
  ss.workers = 4;
  auto core = ShardCore::make(std::move(ss));
  ASSERT_TRUE(core.ok());
  std::vector<caf::actor> shards = {sys.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value())),
                                    sys.spawn(silent_shard, 0)};
  auto feeder = sys.spawn<caf::detached>(data_feeder, FeederSetup{data, {0, 8}, 1, 8, 2, 1, 1, 0, {}});
  auto w = sys.spawn(worker, mlp_worker(3, shards, ranges, feeder, self, std::chrono::milliseconds(300)));
  const auto t0 = std::chrono::steady_clock::now();
  self->send(w, start_atom::value);
  std::string message;
  std::int32_t code = 0;
  self->receive([&](failed_atom, std::int32_t c, const std::string& m) { code = c; message = m; },
                caf::after(std::chrono::seconds(10)) >> [] { FAIL() << "the worker never gave up on the silent shard"; });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(static_cast<StatusCode>(code), StatusCode::timeout);
  EXPECT_NE(message.find("worker 3"), std::string::npos) << message;
  EXPECT_NE(message.find("shard(s) 1 "), std::string::npos) << message;
  EXPECT_NE(message.find("0.3 s"), std::string::npos) << message;
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 5.0);
  for (auto& s : shards) self->send_exit(s, caf::exit_reason::user_shutdown);
  self->send_exit(feeder, caf::exit_reason::user_shutdown);
}

// Serves batches whose inputs do not match their labels, as a broken data
// source would.
// (`samples` is an argument, not a constant: CAF's spawn of a function with
// no arguments but `self` binds a reference to null, docs/sanitizers.md.)
caf::behavior malformed_feeder(caf::event_based_actor*, std::size_t samples) {
  return {
      [samples](next_atom) {
        data::Batch b;
        b.size = samples;
        b.y = {1, 2};
        b.x.assign(3, 0.5f);  // two 28x28 samples need 1568 values
        return b;
      },
  };
}

TEST(Worker, ABatchItCannotPrepareFailsTheJobSayingWhyInsteadOfEscapingTheHandler) {
  auto model = Model::build("mlp", {1, 28, 28}, 10);
  ASSERT_TRUE(model.ok());
  const auto ranges = partition_keys(model->num_params(), 1);
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  ShardSetup ss;
  ss.range = ranges[0];
  ss.initial.assign(ranges[0].size(), 0.0f);
  ss.optimizer = {"sgd", 0.1f, 0.0f, 0.0f};
  auto core = ShardCore::make(std::move(ss));
  ASSERT_TRUE(core.ok());
  std::vector<caf::actor> shards = {sys.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()))};
  auto feeder = sys.spawn(malformed_feeder, std::size_t{2});
  auto w = sys.spawn(worker, mlp_worker(0, shards, ranges, feeder, self, std::chrono::seconds(10)));
  self->send(w, start_atom::value);
  std::string message;
  std::int32_t code = 0;
  self->receive([&](failed_atom, std::int32_t c, const std::string& m) { code = c; message = m; },
                caf::after(std::chrono::seconds(10)) >> [] { FAIL() << "the worker never reported the bad batch"; });
  EXPECT_EQ(static_cast<StatusCode>(code), StatusCode::internal);
  EXPECT_NE(message.find("preparing a batch: a batch of 2 labels with 3 input values"), std::string::npos) << message;
  for (auto& s : shards) self->send_exit(s, caf::exit_reason::user_shutdown);
  self->send_exit(feeder, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace asgd
