// Trains through an installed asgd's public API, as an embedding service
// would: a bad configuration is refused with invalid_argument, a model
// described in code learns the program's own data, then one epoch of MNIST
// must reach a sane test accuracy. Exits 77 (skipped) when $ASGD_DATA_DIR is
// not set.

#include <asgd/asgd.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace {

// Two well separated clusters of (4) vectors, from a fixed LCG.
asgd::LabeledSamples clusters(std::size_t count, std::uint32_t seed) {
  asgd::LabeledSamples s;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int32_t label = static_cast<std::int32_t>(i % 2);
    for (int d = 0; d < 4; ++d) {
      seed = seed * 1664525u + 1013904223u;
      const float jitter = static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) - 0.5f;  // [-0.5, 0.5)
      s.values.push_back((label ? 1.0f : -1.0f) + jitter);
    }
    s.labels.push_back(label);
  }
  return s;
}

// Returns 0 when a ModelSpec-built model learned user data, else 1.
int train_on_user_data() {
  auto data = std::make_shared<asgd::UserDataset>();
  data->name = "clusters";
  data->sample_shape = {4};
  data->classes = 2;
  data->train = clusters(400, 1);
  data->validation = clusters(100, 2);
  data->test = clusters(100, 3);
  asgd::JobConfig config;
  config.epochs = 2;
  config.batch = 16;
  config.model_spec = std::make_shared<const asgd::ModelSpec>(asgd::ModelSpec("tiny").dense(8).relu().dense(2));
  const asgd::Result<asgd::JobSummary> result = asgd::run_job(config, data);
  if (!result || result->final_test_accuracy < 0.95) {
    std::fprintf(stderr, "consumer: user data job: %s\n",
                 result ? "test accuracy below 0.95" : result.status().to_string().c_str());
    return 1;
  }
  std::printf("consumer: model '%s' on user data '%s': test accuracy %.4f\n", result->model.c_str(),
              result->dataset.c_str(), result->final_test_accuracy);
  return 0;
}

}  // namespace

int main() {
  asgd::JobConfig bad;
  bad.workers = 0;
  const asgd::Status refused = asgd::validate(bad);
  if (refused.code() != asgd::StatusCode::invalid_argument) {
    std::fprintf(stderr, "consumer: workers = 0 gave \"%s\", expected invalid_argument\n",
                 refused.to_string().c_str());
    return 1;
  }

  if (train_on_user_data() != 0) return 1;

  const char* data = std::getenv("ASGD_DATA_DIR");
  if (data == nullptr || *data == '\0') {
    std::printf("consumer: ASGD_DATA_DIR is not set; skipping the training job\n");
    return 77;
  }

  asgd::JobConfig config;  // MNIST from $ASGD_DATA_DIR/mnist, mlp, async
  config.epochs = 1;
  config.workers = 2;
  config.shards = 2;
  int epochs_seen = 0;
  asgd::JobCallbacks callbacks;
  callbacks.on_epoch = [&](const asgd::EpochMetrics& m) {
    ++epochs_seen;
    std::printf("consumer: epoch %u, loss %.4f, validation accuracy %.4f\n", m.epoch, m.train_loss,
                m.val_accuracy);
  };

  const asgd::Result<asgd::JobSummary> result = asgd::run_job(config, callbacks);
  if (!result) {
    std::fprintf(stderr, "consumer: run_job failed: %s\n", result.status().to_string().c_str());
    return 1;
  }
  std::printf("consumer: test accuracy %.4f after %.1f s of training\n", result->final_test_accuracy,
              result->train_s);
  // One epoch of the mlp reaches about 0.95; 0.85 leaves room for any seed.
  if (epochs_seen != 1 || result->final_test_accuracy < 0.85) {
    std::fprintf(stderr, "consumer: expected 1 epoch and test accuracy >= 0.85\n");
    return 1;
  }
  return 0;
}
