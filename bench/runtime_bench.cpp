// `asgd bench runtime`: what the actor runtime costs. In one run it measures
// training samples/s of
//   (a) a plain single-threaded loop over the same kernels, data order and
//       optimizer, with no actors, and
//   (b) the in-process runtime with one worker and one shard (run_job),
// alternating a and b `repeats` times and reporting medians and (b)/(a).
// It also times, on one push of the model's size, the shard's NaN/Inf check
// against its optimizer step (part of (b)'s cost, absent from (a)).

#include "base/log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "actors/coordinator.hpp"
#include "base/cpus.hpp"
#include "actors/data_feeder.hpp"
#include "asgd/job.hpp"
#include "compute/blas.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "compute/tensor.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

struct BenchOptions {
  std::string data_dir;
  std::string model = "mlp";
  std::uint32_t batch = 64;
  std::uint32_t threads = 0;
  std::uint32_t repeats = 3;
  std::uint64_t seed = 1;
  bool json = false;
};

// (a): the loop a user would write by hand.
// The job's model, initialised, with the optimizer and schedule its plan
// gives the shard: both sides run the same kernels.
struct Planned {
  Model model;
  std::unique_ptr<Optimizer> optimizer;
  LrSchedule schedule;
};

Result<Planned> planned_model(const JobConfig& c, const data::DatasetSplits& data) {
  const auto& train = data.train;
  const Shape shape = {train.channels, train.rows, train.cols};
  auto model = Model::build(c.model, shape, data.num_classes);
  if (!model) return model.status();
  auto plan = plan_job(c, {model->num_params(), train.count, data.num_classes, shape, Placement::one_process,
                           usable_cpus()});
  if (!plan) return plan.status();
  model->use_compute(std::make_shared<ComputeContext>(plan->compute_threads));
  model->init_params(c.seed);
  auto opt = make_optimizer(plan->optimizer, model->num_params());
  if (!opt) return opt.status();
  return Planned{std::move(model).value(), std::move(opt).value(), plan->schedule};
}

Result<double> plain_loop(const JobConfig& c, const std::shared_ptr<const data::DatasetSplits>& data) {
  const auto& train = data->train;
  auto made = planned_model(c, *data);
  if (!made) return made.status();
  auto& [model, opt, schedule] = *made;
  BatchSource source({data, data::partition_for(train.count, 0, 1), 1, *c.batch, 1, c.seed, 1, 0, {}});
  std::uint64_t step = 0;
  std::size_t samples = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (data::Batch b = source.next(); b.size > 0; b = source.next()) {
    model.compute_gradients(b.x, b.y);
    opt->step(model.params(), model.grads(), schedule.scale(step++));
    samples += b.size;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(samples) / s;
}

// Median seconds of the shard's NaN/Inf check (all_finite) and of its
// optimizer step over one push of the model's size, interleaved.
struct PushCosts {
  double check_s = 0.0;
  double step_s = 0.0;
  std::size_t floats = 0;
};

Result<PushCosts> push_costs(const JobConfig& c, const std::shared_ptr<const data::DatasetSplits>& data) {
  auto made = planned_model(c, *data);
  if (!made) return made.status();
  Model& model = made->model;
  Optimizer& opt = *made->optimizer;
  std::vector<float> params(model.params().begin(), model.params().end());
  std::vector<float> grad(params.size());
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;
  std::vector<double> check, step;
  bool finite = true;
  for (int r = 0; r < 301; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    finite = all_finite(grad) && finite;
    const auto t1 = std::chrono::steady_clock::now();
    opt.step(params, grad, 1e-3f);
    const auto t2 = std::chrono::steady_clock::now();
    check.push_back(std::chrono::duration<double>(t1 - t0).count());
    step.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  if (!finite) return Status::Internal("the bench's gradient was not finite");
  return PushCosts{median(check), median(step), grad.size()};
}

int run_bench_runtime(const BenchOptions& o) {
  logger().set_level(spdlog::level::warn);
  JobConfig c;
  c.data_dir = o.data_dir;
  c.model = o.model;
  c.workers = 1;
  c.shards = 1;
  c.epochs = 1;
  c.batch = o.batch;
  c.seed = o.seed;
  c.threads = o.threads > 0 ? o.threads : usable_cpus();
  if (Status s = validate(c); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  auto loaded = data::load_dataset(c.dataset, resolve_data_dir(c), c.validation_size, c.seed);
  if (!loaded) {
    print_error(loaded.status().message());
    return loaded.status().code() == StatusCode::corruption ? kExitFailure : kExitUsage;
  }
  auto data = std::make_shared<const data::DatasetSplits>(std::move(loaded).value());
  if (*c.batch > data->train.count) {  // the job would say it of its one worker's share
    print_error(fmt::format("--batch {}: more than the {} training samples of {}", *c.batch, data->train.count,
                            c.dataset));
    return kExitUsage;
  }
  if (!o.json)
    std::printf("bench runtime: %s on %s, batch %u, %u compute threads (OpenBLAS %s kernels), %zu samples per run, "
                "%u repeats\n",
                c.model.c_str(), resolve_data_dir(c).c_str(), *c.batch, c.threads, blas::core_name().c_str(), data->train.count,
                o.repeats);

  std::vector<double> plain, runtime;
  for (std::uint32_t r = 0; r < o.repeats; ++r) {
    auto a = plain_loop(c, data);
    if (!a) {
      print_error(a.status().to_string());
      return kExitFailure;
    }
    auto b = run_job(c);
    if (!b) {
      print_error(b.status().to_string());
      return kExitFailure;
    }
    plain.push_back(*a);
    runtime.push_back(b->samples_per_s);
    if (!o.json) std::printf("  repeat %u: (a) plain %.0f samples/s, (b) runtime %.0f samples/s\n", r + 1, *a, b->samples_per_s);
  }
  const double a = median(plain), b = median(runtime);
  auto costs = push_costs(c, data);
  if (!costs) {
    print_error(costs.status().to_string());
    return kExitFailure;
  }
  if (o.json) {
    std::printf("{\"model\": \"%s\", \"batch\": %u, \"threads\": %u, \"blas_core\": \"%s\", "
                "\"plain_samples_per_s\": %.1f, "
                "\"runtime_samples_per_s\": %.1f, \"ratio\": %.4f, \"nonfinite_check_us\": %.2f, "
                "\"optimizer_step_us\": %.2f}\n",
                c.model.c_str(), *c.batch, c.threads, blas::core_name().c_str(), a, b, b / a, costs->check_s * 1e6,
                costs->step_s * 1e6);
  } else {
    std::printf("(a) plain loop, no actors:     %.0f samples/s (median)\n", a);
    std::printf("(b) 1 worker + 1 shard actors: %.0f samples/s (median)\n", b);
    std::printf("ratio (b)/(a): %.3f (target >= 0.90)\n", b / a);
    std::printf("(c) per push of %zu floats, in (b) only: NaN/Inf check %.1f us, %s step %.1f us (check/step %.3f)\n",
                costs->floats, costs->check_s * 1e6, c.optimizer.c_str(), costs->step_s * 1e6,
                costs->check_s / costs->step_s);
  }
  return kExitOk;
}

}  // namespace

std::function<int()> add_bench_commands(CLI::App& app) {
  auto* bench = &app;
  bench->require_subcommand(1);
  auto* rt = bench->add_subcommand("runtime", "samples/s of a plain loop vs one worker and one shard in-process");
  auto o = std::make_shared<BenchOptions>();
  rt->add_option("--data-dir", o->data_dir, "MNIST folder (default $ASGD_DATA_DIR/mnist, else ./data/mnist)")
      ->type_name("DIR");
  rt->add_option("--model", o->model, "model (default mlp)")->type_name("NAME");
  rt->add_option("--batch", o->batch, "batch size, at least 1 (default 64)")
      ->type_name("B")
      ->check(positive());
  rt->add_option("--threads", o->threads, "compute threads of the worker (default: the usable CPUs)")->type_name("N");
  rt->add_option("--repeats", o->repeats, "alternating runs of (a) and (b), at least 1 (default 3)")
      ->type_name("N")
      ->check(positive());
  rt->add_option("--seed", o->seed, "seed (default 1)")->type_name("N")->check(positive(false));
  rt->add_flag("--json", o->json, "print one JSON object instead of text");
  auto comm = add_comm_bench(bench);
  auto compute = add_compute_bench(bench);
  auto load = add_load_bench(bench);
  auto allreduce = add_allreduce_bench(bench);
  return [o, rt, comm, compute, load, allreduce] {
    if (comm.parsed()) return comm.run();
    if (allreduce.parsed()) return allreduce.run();
    if (compute.parsed()) return compute.run();
    if (load.parsed()) return load.run();
    if (!rt->parsed()) {
      print_error("bench: name a benchmark (runtime, comm, compute, load, allreduce)");
      return kExitUsage;
    }
    return run_bench_runtime(*o);
  };
}

}  // namespace asgd::cli
