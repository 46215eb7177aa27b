// Trains through an installed asgd's public API, as an embedding service
// would: a bad configuration is refused with invalid_argument, then one
// epoch of MNIST must reach a sane test accuracy. Exits 77 (skipped) when
// $ASGD_DATA_DIR is not set.

#include <asgd/job.hpp>
#include <asgd/status.hpp>

#include <cstdio>
#include <cstdlib>

int main() {
  asgd::JobConfig bad;
  bad.workers = 0;
  const asgd::Status refused = asgd::validate(bad);
  if (refused.code() != asgd::StatusCode::invalid_argument) {
    std::fprintf(stderr, "consumer: workers = 0 gave \"%s\", expected invalid_argument\n",
                 refused.to_string().c_str());
    return 1;
  }

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
