// Runs one training job inside this process through the library API (no
// CLI): two workers, two shards, the async policy, and a callback that
// prints each epoch. Usage: in_process_cluster [MNIST_DIR]

#include <cstdio>
#include <cstring>

#include "asgd/job.hpp"

int main(int argc, char** argv) {
  asgd::JobConfig config;  // the defaults: MNIST, mlp, async, 2 workers
  config.shards = 2;
  config.epochs = 2;
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {  // --help, or a flag this example does not take
    std::fprintf(stderr, "usage: %s [MNIST_DIR]   (default: $ASGD_DATA_DIR/mnist)\n", argv[0]);
    return std::strcmp(argv[argc - 1], "--help") == 0 && argc == 2 ? 0 : 2;
  }
  if (argc > 1) config.data_dir = argv[1];

  asgd::JobCallbacks callbacks;
  callbacks.on_epoch = [](const asgd::EpochMetrics& m) {
    std::printf("epoch %u: loss %.4f, validation accuracy %.4f\n", m.epoch, m.train_loss, m.val_accuracy);
  };
  auto result = asgd::run_job(config, callbacks);
  if (!result) {
    std::fprintf(stderr, "training failed: %s\n", result.status().to_string().c_str());
    return asgd::is_usage_error(result.status()) ? 2 : 1;  // what to fix (a setting, a missing folder): 2, as asgd
  }
  std::printf("test accuracy %.4f after %.1f s of training\n", result->final_test_accuracy, result->train_s);
  return 0;
}
