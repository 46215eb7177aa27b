// Runs one training job inside this process through the library API (no
// CLI): two workers, two shards, the async policy, and a callback that
// prints each epoch. Usage: in_process_cluster [MNIST_DIR]

#include <cstdio>

#include "asgd/job.hpp"

int main(int argc, char** argv) {
  asgd::JobConfig config;  // the defaults: MNIST, mlp, async, 2 workers
  config.shards = 2;
  config.epochs = 2;
  if (argc > 1) config.data_dir = argv[1];

  asgd::JobCallbacks callbacks;
  callbacks.on_epoch = [](const asgd::EpochMetrics& m) {
    std::printf("epoch %u: loss %.4f, validation accuracy %.4f\n", m.epoch, m.train_loss, m.val_accuracy);
  };
  auto result = asgd::run_job(config, callbacks);
  if (!result) {
    std::fprintf(stderr, "training failed: %s\n", result.status().to_string().c_str());
    return 1;
  }
  std::printf("test accuracy %.4f after %.1f s of training\n", result->final_test_accuracy, result->train_s);
  return 0;
}
