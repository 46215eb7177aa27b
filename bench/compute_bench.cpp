// `asgd bench compute`: forward + backward samples/s of one model on one
// device, which is what a worker spends each step on (Model::compute_gradients:
// forward, mean softmax cross-entropy, backward into the flat gradient). No
// data loading, no optimizer, no actors: those have their own benchmarks.
// bench/torch_compute.py runs this with --json beside PyTorch on the same
// shapes and prints the ratios.
//
// Per (model, batch): warm up, then time `windows` back-to-back windows of
// seconds/windows each and report the median window's samples/s with the
// fastest and slowest window as the spread.

#include "base/log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>

#include "compute/blas.hpp"
#include "compute/device.hpp"
#include "compute/model.hpp"
#include "base/random.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct ComputeOptions {
  std::vector<std::string> models = {"mlp", "lenet", "resnet-mini"};
  std::vector<std::uint32_t> batches = {64, 128};
  std::string device = "cpu";
  std::uint32_t threads = 2;
  double seconds = 2.0;   // timed, per (model, batch), split into windows
  std::uint32_t windows = 5;
  double warmup = 0.5;    // seconds of untimed steps first (and at least kMinWarmupSteps)
  std::uint64_t seed = 1;
  bool json = false;
};

// Enough steps for first-touch page faults, BLAS pool start-up and, on a GPU,
// allocator growth and cuDNN algorithm choice to be over before timing.
constexpr int kMinWarmupSteps = 5;
// Distinct batches cycled through, so a step never reuses the previous
// step's input (and a GPU prefetch has a different batch to upload).
constexpr std::size_t kBatchPool = 4;

// MNIST's sample shape and classes: the shapes every model is defined for.
const Shape kSampleShape = {1, 28, 28};
constexpr std::size_t kClasses = 10;

struct Batch {
  std::vector<float> x;         // (B, 1, 28, 28)
  std::vector<std::int32_t> y;  // (B,)
};

// Pixel-like inputs: like MNIST, most pixels are background (0) and the rest
// uniform intensities, normalised with MNIST's mean and std as the loader does.
std::vector<Batch> random_batches(std::size_t batch, std::uint64_t seed) {
  constexpr float kMean = 0.1307f, kStd = 0.3081f, kInk = 0.2f;
  Rng rng(mix_seed(seed, batch));
  std::vector<Batch> pool(kBatchPool);
  for (Batch& b : pool) {
    b.x.resize(batch * numel(kSampleShape));
    b.y.resize(batch);
    for (float& v : b.x) v = ((rng.uniform() < kInk ? rng.uniform() : 0.0f) - kMean) / kStd;
    for (auto& label : b.y) label = static_cast<std::int32_t>(rng.next() % kClasses);
  }
  return pool;
}

struct Measurement {
  std::vector<double> windows;  // samples/s of each timed window, in order
  double median = 0, min = 0, max = 0;
  std::uint64_t steps = 0;      // timed steps
  double timed_s = 0;
  float last_loss = 0;
};

// Runs `step` on the pool's batches in turn: warm-up, then the timed windows.
// A step is compute_gradients followed by a prefetch of the next batch, as a
// worker does (a no-op on the CPU); compute_gradients returns only when the
// gradient is in host memory, so wall time is honest on a GPU too.
Measurement measure(Model& model, const std::vector<Batch>& pool, const ComputeOptions& o) {
  std::size_t next = 0;
  Measurement m;
  auto step = [&] {
    const Batch& b = pool[next];
    next = (next + 1) % pool.size();
    m.last_loss = model.compute_gradients(b.x, b.y);
    model.prefetch(pool[next].x, pool[next].y);
  };
  model.prefetch(pool[0].x, pool[0].y);
  const auto warm_start = Clock::now();
  for (int i = 0; i < kMinWarmupSteps || std::chrono::duration<double>(Clock::now() - warm_start).count() < o.warmup;
       ++i)
    step();

  const std::size_t batch = pool[0].y.size();
  const double window_s = o.seconds / o.windows;
  for (std::uint32_t w = 0; w < o.windows; ++w) {
    std::uint64_t steps = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      step();
      ++steps;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (elapsed < window_s);
    m.windows.push_back(static_cast<double>(steps * batch) / elapsed);
    m.steps += steps;
    m.timed_s += elapsed;
  }
  std::vector<double> sorted = m.windows;
  std::sort(sorted.begin(), sorted.end());
  m.median = median(sorted);
  m.min = sorted.front();
  m.max = sorted.back();
  return m;
}

// Builds and places the model; the error status when it cannot be.
Result<Model> make_model(const std::string& name, const Device& device, std::uint64_t seed,
                         const std::shared_ptr<ComputeContext>& compute) {
  auto model = Model::build(name, kSampleShape, kClasses);
  if (!model) return model.status();
  model->use_compute(compute);
  model->init_params(seed);
  if (Status s = model->set_device(device); !s.ok()) return s;
  return model;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

int run_bench_compute(const ComputeOptions& o) {
  logger().set_level(spdlog::level::warn);
  auto device = Device::parse(o.device);
  if (!device) {
    print_error("--device: " + device.status().message());
    return kExitUsage;
  }
  // Every model and the device are checked before anything is timed, so a
  // typo fails at once rather than after minutes of measuring.
  std::string device_name = device->str();
  const auto compute = std::make_shared<ComputeContext>(o.threads);
  for (const std::string& name : o.models) {
    auto model = make_model(name, *device, o.seed, compute);
    if (!model) {
      const Status& s = model.status();
      const bool device_missing = s.code() == StatusCode::unavailable;  // a usage error, as for asgd train
      print_error(device_missing ? "--device " + o.device + ": " + s.message() : "--models: " + s.message());
      return device_missing ? kExitUsage : exit_code_for(s);
    }
  }
  if (!o.json) {
    std::printf("bench compute: forward + backward (Model::compute_gradients) on %s, %u compute threads (OpenBLAS %s "
                "kernels); per model and batch %.1f s warm-up, then %u windows of %.2f s, median reported\n",
                device_name.c_str(), o.threads, blas::core_name().c_str(), o.warmup, o.windows,
                o.seconds / o.windows);
    std::printf("%-12s %6s %12s %12s %12s %7s %8s\n", "model", "batch", "samples/s", "min", "max", "spread",
                "steps");
  }
  for (const std::string& name : o.models) {
    for (std::uint32_t batch : o.batches) {
      auto model = make_model(name, *device, o.seed, compute);
      if (!model) {  // checked above; a GPU can still fail here
        print_error(model.status().to_string());
        return kExitFailure;
      }
      Measurement m;
      try {
        m = measure(*model, random_batches(batch, o.seed), o);
      } catch (const std::bad_alloc&) {
        print_error("bench compute: " + name + " at batch " + std::to_string(batch) +
                    " does not fit in this machine's memory; try smaller --batches");
        return kExitFailure;
      }
      const double spread = (m.max - m.min) / m.median;
      if (o.json) {
        std::printf("{\"model\": \"%s\", \"batch\": %u, \"device\": \"%s\", \"threads\": %u, \"blas_core\": \"%s\", "
                    "\"params\": %zu, \"samples_per_s\": %.1f, \"min_samples_per_s\": %.1f, "
                    "\"max_samples_per_s\": %.1f, \"spread\": %.4f, \"windows\": [",
                    json_escape(name).c_str(), batch, device_name.c_str(), o.threads, blas::core_name().c_str(),
                    model->num_params(), m.median, m.min, m.max, spread);
        for (std::size_t i = 0; i < m.windows.size(); ++i) std::printf("%s%.1f", i ? ", " : "", m.windows[i]);
        std::printf("], \"steps\": %llu, \"timed_s\": %.3f, \"loss\": %.4f}\n",
                    static_cast<unsigned long long>(m.steps), m.timed_s, m.last_loss);
      } else {
        std::printf("%-12s %6u %12.0f %12.0f %12.0f %6.1f%% %8llu\n", name.c_str(), batch, m.median, m.min, m.max,
                    100.0 * spread, static_cast<unsigned long long>(m.steps));
      }
      std::fflush(stdout);
    }
  }
  if (!o.json) std::printf("spread = (max - min) / median over the windows\n");
  return kExitOk;
}

}  // namespace

ComputeBench add_compute_bench(CLI::App* bench) {
  auto o = std::make_shared<ComputeOptions>();
  auto* cmd = bench->add_subcommand("compute", "forward+backward samples/s per model and batch on one device");
  add_list_option(cmd, "--models", o->models, "models, comma-separated (default mlp,lenet,resnet-mini)");
  add_list_option(cmd, "--batches", o->batches, "batch sizes, comma-separated, each 1 to 65536 (default 64,128)", 1,
                  1u << 16);
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:K (default cpu)")->type_name("DEV");
  cmd->add_option("--threads", o->threads, "compute threads, 1 to 1024 (default 2)")
      ->type_name("N")
      ->check(quietly(CLI::Range(1u, 1024u)));
  cmd->add_option("--seconds", o->seconds, "timed seconds per model and batch, above 0, at most 3600 (default 2)")
      ->type_name("S")
      ->check(positive(true, 3600));
  cmd->add_option("--windows", o->windows, "timed windows the seconds are split into; the median is reported "
                                           "(1 to 1000; default 5)")
      ->type_name("N")
      ->check(quietly(CLI::Range(1u, 1000u)));
  cmd->add_option("--warmup", o->warmup, "untimed seconds first, at least 5 steps, 0 to 3600 (default 0.5)")
      ->type_name("S")
      ->check(positive(false, 3600));
  cmd->add_option("--seed", o->seed, "seed for the parameters and inputs (default 1)")
      ->type_name("N")
      ->check(positive(false));  // -1 became 2^64 - 1
  cmd->add_flag("--json", o->json, "one JSON object per model and batch instead of a table");
  return {[cmd] { return cmd->parsed(); }, [o] { return run_bench_compute(*o); }};
}

}  // namespace asgd::cli
