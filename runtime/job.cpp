// run_job: the in-process runtime. Loads the data, starts a private actor
// system, lets the coordinator run the job, and waits for its outcome.

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <functional>
#include <future>
#include <thread>
#include <tuple>

#include <malloc.h>
#include <unistd.h>

#include "actors/checkpoint.hpp"
#include "actors/checkpoint_claim.hpp"
#include "actors/coordinator.hpp"
#include "actors/thrown.hpp"
#include "base/cpus.hpp"
#include "base/folder_lock.hpp"
#include "base/log.hpp"
#include "base/paths.hpp"
#include "compute/device.hpp"
#include "asgd/job.hpp"
#include "compute/blas.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "dataset/augment.hpp"
#include "dataset/dataset.hpp"
#include "runtime/energy.hpp"
#include "runtime/live_page.hpp"
#include "runtime/config_file.hpp"
#include "runtime/metrics.hpp"
#include "runtime/job_internal.hpp"
#include "runtime/status_server.hpp"

namespace asgd {

namespace {

// An interval past a worker's steps in the whole job (Downpour's n_push
// and n_fetch, averaging's and easgd's tau, the decentralized policies'
// publishing): almost surely a mistake, though a legal one.
void warn_of_rare_exchanges(const JobConfig& config, const JobPlan& plan) {
  std::uint64_t steps = std::numeric_limits<std::uint64_t>::max();
  for (const WorkerPlan& w : plan.workers) steps = std::min(steps, w.steps_per_epoch * config.epochs);
  const char* unseen = "; the evaluations before then see the initial parameters";
  for (const auto& [knob, what, after] : {std::tuple{"push-every", "pushes its summed gradients", ""},
                                          std::tuple{"fetch-every", "pulls", ""},
                                          std::tuple{"local-steps", "averages with the others", unseen},
                                          std::tuple{"publish-steps", "publishes its parameters", unseen}}) {
    const auto it = config.policy_options.find(knob);
    if (it != config.policy_options.end() && it->second > static_cast<double>(steps))
      logger().warn("--{} {} is more than a worker's {} steps in the whole job: it {} once, at its end{}", knob,
                    it->second, steps, what, after);
  }
}

}  // namespace

void sleep_when_idle(caf::actor_system_config& cfg, std::chrono::microseconds busy_poll) {
  cfg.set("work-stealing.moderate-poll-attempts", std::size_t{0});
  if (busy_poll.count() > 0)
    cfg.set("work-stealing.aggressive-poll-attempts",
            static_cast<std::size_t>(busy_poll.count()) * kPollsPerBusyMicrosecond);
}

void await_actors(caf::actor_system& system, std::chrono::milliseconds every) {
  using namespace std::chrono_literals;
  const auto start = std::chrono::steady_clock::now();
  auto next_word = start + every;
  auto pause = 100us;
  for (std::size_t running; (running = system.registry().running()) > 0;) {
    if (const auto now = std::chrono::steady_clock::now(); now >= next_word) {
      logger().warn("the job has ended, and {} of its actors are still running {:.0f} s later (each stops once the "
                    "step or call it is in returns); waiting for them",
                    running, std::chrono::duration<double>(now - start).count());
      next_word += every;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, 2ms);
  }
}

namespace {

// The coordinator's model (the shards' initial parameters, then what it
// evaluates) and the job's plan, made for its size.
struct Planned {
  Model model;
  JobPlan plan;
};

Result<Planned> plan_for(const JobConfig& config, const data::DatasetSplits& data, Placement where) {
  const auto& train = data.train;
  const Shape sample_shape = {train.channels, train.rows, train.cols};
  auto model = Model::build(config.model, config.model_spec.get(), sample_shape, data.num_classes);
  if (!model) return model.status();
  auto plan = plan_job(config, {model->num_params(), train.count, data.num_classes, sample_shape, where,
                                usable_cpus(), train.fingerprint()});
  if (!plan) return plan.status();
  warn_of_rare_exchanges(config, *plan);
  if (plan->training.lr_warmup_epochs > config.epochs)
    logger().warn("--lr-warmup {:g} is longer than the job's {} epoch(s): the rate never reaches its full value",
                  plan->training.lr_warmup_epochs, config.epochs);
  return Planned{std::move(model).value(), std::move(plan).value()};
}

}  // namespace

std::string resolve_data_dir(const JobConfig& c) {
  if (!c.data_dir.empty()) return c.data_dir;
  if (const char* root = std::getenv("ASGD_DATA_DIR"); root && *root)
    return (std::filesystem::path(root) / c.dataset).string();
  return (std::filesystem::path("data") / c.dataset).string();
}

std::string resolve_image_cache() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  if (const std::string dir = env("ASGD_CACHE_DIR"); !dir.empty()) {
    std::string lower = dir;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lower == "off" || lower == "0" || lower == "no" || lower == "false" ? "" : dir;
  }
  // The XDG base directory rules: a relative XDG_CACHE_HOME is ignored.
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg.front() == '/')
    return (std::filesystem::path(xdg) / "asgd").string();
  if (const std::string home = env("HOME"); !home.empty())
    return (std::filesystem::path(home) / ".cache" / "asgd").string();
  return "";
}

Result<JobSummary> run_job(const JobConfig& config, const JobCallbacks& callbacks, std::stop_token stop) {
  return run_job_with(config, callbacks, stop, {});
}

Result<JobSummary> run_job(const JobConfig& config, std::shared_ptr<const UserDataset> data,
                           const JobCallbacks& callbacks, std::stop_token stop) {
  if (!data) return Status::InvalidArgument("run_job: no user data (a null UserDataset)");
  return run_job_with(config, callbacks, stop, {}, std::move(data));
}

namespace {

// The status server starts first: a port in use is refused before any data
// is loaded. Sets `live` to the status it serves.
Result<std::unique_ptr<StatusServer>> start_status_server(const JobConfig& config, const std::string& dataset,
                                                          std::shared_ptr<LiveStatus>& live) {
  live = std::make_shared<LiveStatus>();
  live->update([&](LiveSnapshot& s) {
    s.policy = config.policy;
    s.model = config.model_spec ? config.model_spec->name() : config.model;
    s.dataset = dataset;
    s.workers = config.workers;
    s.shards = config.shards;
    s.epochs = config.epochs;
  });
  return StatusServer::start(config.status_address, config.status_port, live, pages::live_status_page_html());
}

}  // namespace

// Refuses a checkpoint folder it cannot write now, not after hours of
// training.
Status prepare_checkpoint_dir(const JobConfig& config) {
  std::error_code ec;
  std::filesystem::create_directories(config.checkpoint_dir, ec);
  if (ec || ::access(config.checkpoint_dir.c_str(), W_OK) != 0)
    return Status::InvalidArgument("--checkpoint-dir " + config.checkpoint_dir + ": cannot write there" +
                                   (ec ? " (" + ec.message() + ")" : ""));
  // The files the job writes whole (through FILE.tmp, then renamed): a
  // folder in the place of one failed the job's end, its training lost.
  const std::string model = kCheckpointFile, settings = kJobSettingsFile;
  for (const std::string& name : {model, model + ".tmp", settings, settings + ".tmp"}) {
    const std::filesystem::path file = std::filesystem::path(config.checkpoint_dir) / name;
    if (std::filesystem::exists(file, ec) && !std::filesystem::is_regular_file(file, ec))
      return Status::InvalidArgument("--checkpoint-dir " + config.checkpoint_dir + ": " + file.string() +
                                     " is not a regular file, so the job could not write its " +
                                     (name.starts_with(model) ? "trained model" : "settings") + " there");
  }
  return {};
}

namespace {

// The job's settings beside its shard checkpoints, so that --resume DIR
// needs nothing else. A resumed job's replace them only once its
// checkpoints were found to be its own (plan_resume): a resume refused
// leaves the folder as it was.
Status write_job_settings(const JobConfig& config, std::uint32_t batch, bool user_data) {
  if (config.checkpoint_every_s <= 0) return {};
  JobConfig saved = config;
  saved.resume.clear();
  // The batch the job took, default or not: the default follows the policy,
  // the workers and --lr, which a resume may change, and the checkpoints
  // count steps of this one.
  saved.batch = batch;
  saved.status_port = 0;
  // Absolute: a resume from another working directory must write into this
  // folder and this metrics file, and read the same data.
  if (!user_data) saved.data_dir = resolve_data_dir(config);
  for (std::string* path : {&saved.checkpoint_dir, &saved.metrics_out, &saved.data_dir})
    if (!path->empty()) *path = std::filesystem::absolute(*path).lexically_normal().string();
  // Whole or not at all: a crash or a full disk while a resume rewrites it
  // would otherwise leave a folder no --resume can read.
  const std::string text = "# The settings of the job checkpointed here; asgd train --resume reads them.\n" +
                           to_toml(saved) + kJobSettingsEnd + "\n";
  return write_atomically((std::filesystem::path(config.checkpoint_dir) / kJobSettingsFile).string(), text);
}

// write_job_settings, for when a resumed job's shards have restored.
std::function<Status()> settings_writer(const JobConfig& config, std::uint32_t batch, bool user_data) {
  return [&config, batch, user_data] { return write_job_settings(config, batch, user_data); };
}

// Which OpenBLAS kernels compute, on how many threads per worker (or per
// evaluation, in a coordinator process, `workers` 0), and a better choice
// if there is one; and when more threads than CPUs share each layer (2
// workers of --threads 2 on 2 cores: an epoch 11x as long).
void log_blas(std::size_t threads, std::size_t workers, const char* per) {
  if (const std::string better = blas::suggested_coretype(); !better.empty()) {
    logger().warn("OpenBLAS runs its generic {} kernels on this CPU; set OPENBLAS_CORETYPE={} for faster matrix products",
                 blas::core_name(), better);
  }
  logger().info("OpenBLAS {} kernels, {} compute thread(s) per {}", blas::core_name(), threads, per);
  if (threads > 1 && workers * threads > usable_cpus())
    logger().warn("{} workers x {} compute threads on {} usable CPUs: each layer waits for threads the others "
                  "keep off the CPUs (--threads 0 gives each worker its share)",
                  workers, threads, usable_cpus());
}

// A new job in a folder that holds an earlier job's files: its trained
// model goes, or `asgd export` would take it for this job's until this one
// ends (or for good, if it never does); and its shard checkpoints (with
// their claims and any temporaries a killed write left), or a --resume of
// this job before its first checkpoint would go on from the earlier job's
// parameters and clocks. The folder is held (hold_checkpoint_dir): no other
// job is writing them.
Status remove_earlier_job_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto remove = [&](const fs::path& file) -> Status {
    fs::remove(file, ec);
    if (ec)
      return Status::IOError("--checkpoint-dir " + dir + ": cannot remove an earlier job's " + file.string() + ": " +
                             ec.message());
    return {};
  };
  std::size_t shard_files = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // (Files only: what else bears such a name is no job's file.)
    if (!name.starts_with("shard-") || !is_checkpoint_folder_file(name) || !entry.is_regular_file(ec)) continue;
    // A claim with its number stays: this job's shards claim past it, so a
    // shard of the earlier job still writing (stopped, or slow at its end)
    // is refused instead of replacing this job's checkpoint with its own.
    if (name.ends_with(".claim") && claimable((entry.path().parent_path() / entry.path().stem()).string()).ok())
      continue;
    if (Status s = remove(entry.path()); !s.ok()) return s;
    ++shard_files;
  }
  if (ec) return Status::IOError("--checkpoint-dir " + dir + ": cannot list it: " + ec.message());
  if (shard_files > 0)
    logger().info("--checkpoint-dir {}: removed {} shard checkpoint file(s) of an earlier job", dir, shard_files);
  // What a write of the model or the settings left when its process was
  // killed (write_atomically's FILE.tmp): no cleanup took it before.
  for (const std::string& name : {std::string(kCheckpointFile) + ".tmp", std::string(kJobSettingsFile) + ".tmp"})
    if (const fs::path tmp = fs::path(dir) / name; look_at(tmp).kind == PathKind::file)
      if (Status s = remove(tmp); !s.ok()) return s;
  const fs::path model = fs::path(dir) / kCheckpointFile;
  if (look_at(model).kind != PathKind::file) return {};
  if (Status s = remove(model); !s.ok()) return s;
  logger().warn("--checkpoint-dir {}: removed the earlier job's trained model ({}); this job writes its own at its end",
                dir, model.string());
  return {};
}

// --resume: where the workers start again, from checkpoints found to be
// this job's; then the settings beside them (write_job_settings).
// A resume with another --epochs: the schedule and the warm-up follow the
// new count from the job's start (the cosine rate came back from 0 to 0.75
// of the base without a word). Read from the checkpointed job's settings,
// which the resume replaces once its shards are restored.
void warn_of_a_respread_schedule(const JobConfig& config) {
  JobConfig was;
  const std::string saved = (std::filesystem::path(config.resume) / kJobSettingsFile).string();
  if (config.lr_schedule == "constant" || !apply_toml_file(saved, was, /*written_by_asgd=*/true).ok() ||
      was.epochs == config.epochs)
    return;
  logger().warn("--resume {}: --epochs {} where the checkpointed job had {}: the {} schedule and the warm-up are "
                "spread over {} epochs from the job's start, so the rate goes on where a {}-epoch job has it",
                config.resume, config.epochs, was.epochs, config.lr_schedule, config.epochs, config.epochs);
}

Result<std::optional<ResumePlan>> resume_and_save_settings(const JobConfig& config, const JobPlan& plan,
                                                           bool user_data) {
  std::optional<ResumePlan> resumed;
  if (!config.resume.empty()) {
    auto r = plan_resume(config, plan);
    if (!r) return r.status();
    resumed = std::move(r).value();
    warn_of_a_respread_schedule(config);
  }
  // A resumed job's settings are written once its shards restored
  // (CoordinatorSetup::on_restored): one a shard refused left job.toml
  // saying what had not run.
  if (!config.checkpoint_dir.empty() && !resumed) {
    if (Status s = remove_earlier_job_files(config.checkpoint_dir); !s.ok()) return s;
    if (Status s = write_job_settings(config, plan.batch, user_data); !s.ok()) return s;
  }
  return resumed;
}

// The job's data: the user's (moved out of `user_data`, which the job no
// longer needs) or the named dataset, loaded.
Result<std::shared_ptr<const data::DatasetSplits>> job_data(const JobConfig& config,
                                                            std::shared_ptr<const UserDataset>& user_data) {
  if (user_data) {  // validate(config, *user_data) passed
    auto data = std::make_shared<const data::DatasetSplits>(data::from_user_dataset(*user_data));
    user_data.reset();
    logger().info("user data {}: {} train, {} validation, {} test samples", data->name, data->train.count,
                 data->validation.count, data->test.count);
    return data;
  }
  const std::string dir = resolve_data_dir(config);
  auto loaded = data::load_dataset(config.dataset, dir, config.validation_size, config.seed, resolve_image_cache());
  if (!loaded) return loaded.status();
  auto data = std::make_shared<const data::DatasetSplits>(std::move(loaded).value());
  logger().info("loaded {} from {}: {} train, {} validation, {} test images of {}x{}x{}; inputs normalised by "
                "mean {} and stddev {} (per channel, measured on the training split)",
                config.dataset, dir, data->train.count, data->validation.count, data->test.count, data->train.channels,
                data->train.rows, data->train.cols, fmt::join(data->normalization.mean, ","),
                fmt::join(data->normalization.stddev, ","));
  return data;
}

// Runs the coordinator in an actor system of the job's own until it reports
// the job's outcome, cancelling it when `stop` is requested.
Result<JobSummary> run_coordinator(CoordinatorSetup setup, const ClusterHooks& hooks, std::stop_token stop) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  // Workers compute inside their handlers: one scheduler thread per worker,
  // up to the number of cores. Shards and the coordinator run on the same
  // threads between worker steps (a push queues the shard on its sender's
  // thread, which is free once the step's handler returns). A spare thread
  // only spins while idle and steals cores from the BLAS threads: measured
  // on 2 cores, bench runtime (b)/(a) went from 0.88-0.91 to 0.97-1.01, and
  // 2-worker training from ~135k to ~165k samples/s.
  cfg.set("scheduler.max-threads", setup.plan.actor_threads);
  if (hooks.make_placement) sleep_when_idle(cfg);  // the coordinator process: its workers are elsewhere
  auto outcome = std::make_shared<std::promise<Result<JobSummary>>>();
  auto future = outcome->get_future().share();
  setup.outcome = outcome;
  {
    caf::actor_system system{cfg};
    if (hooks.make_placement) {
      auto placement = hooks.make_placement(system, setup.plan.train_fingerprint);
      if (!placement) return placement.status();
      setup.remote = std::move(placement).value();
    }
    // On its own thread: workers that compute inside their handlers keep
    // the scheduler's threads busy, and a scheduled coordinator then read
    // epoch reports late (two epochs of resnet-mini stamped with one end
    // time); its evaluations no longer take a thread from the workers.
    auto coord = system.spawn<caf::detached>(coordinator, std::move(setup));
    if (hooks.on_coordinator) hooks.on_coordinator(coord);
    outcome.reset();  // the coordinator holds the only reference now
    bool cancelled = false;
    while (future.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (!cancelled && stop.stop_requested()) {
        cancelled = true;
        caf::anon_send(coord, cancel_atom::value);
      }
    }
    // Told to stop before its outcome came (a callback's stop(), or the
    // outcome of a small job already queued behind the cancel): the job
    // ends cancelled, as the host asked.
    const bool stop_asked = stop.stop_requested();
    if (hooks.before_shutdown) {
      // Peek at the outcome without taking it.
      const auto& peeked = future.get();
      hooks.before_shutdown(!peeked.ok() ? peeked.status() : stop_asked ? Status::Cancelled(kJobCancelled) : Status{});
    }
    await_actors(system, std::chrono::seconds(10));
    try {
      auto result = future.get();
      if (result.ok() && stop_asked) return Status::Cancelled(kJobCancelled);
      return result;
    } catch (const std::future_error&) {
      return Status::Internal("the coordinator stopped without reporting an outcome");
    }
  }
}

}  // namespace

// Two jobs at once in one folder (in this process or another) overwrote
// each other's shard checkpoints, and the folder kept whichever finished
// last.
Result<std::optional<FolderLock>> hold_checkpoint_dir(const JobConfig& config) {
  if (config.checkpoint_dir.empty()) return std::optional<FolderLock>();
  if (Status s = prepare_checkpoint_dir(config); !s.ok()) return s;
  auto held = FolderLock::try_hold(config.checkpoint_dir);
  if (!held && held.status().code() == StatusCode::unavailable)
    return Status::InvalidArgument("--checkpoint-dir " + config.checkpoint_dir +
                                   ": another job is writing its checkpoints there (in this process or another); "
                                   "give each job a folder of its own");
  if (!held) return held.status();
  return std::optional<FolderLock>(std::move(held).value());
}

namespace {

// `callback`, not called once `stop` is requested: the job is ending
// cancelled, and epochs already reported (a small job's, queued behind
// the stop) are not the host's news any more.
template <class... Args>
std::function<void(Args...)> until_stopped(std::function<void(Args...)> callback, std::stop_token stop) {
  if (!callback) return callback;
  return [callback = std::move(callback), stop](Args... args) {
    if (!stop.stop_requested()) callback(std::forward<Args>(args)...);
  };
}

// The host's callbacks, each stopping the job as the host's doing when it
// throws (CallbackThrew), and silent once the job was told to stop.
JobCallbacks guarded_callbacks(const JobCallbacks& c, std::stop_token stop) {
  return {until_stopped(guard_callback("on_epoch", c.on_epoch), stop),
          until_stopped(guard_callback("on_eval", c.on_eval), stop),
          until_stopped(guard_callback("on_progress", c.on_progress), stop),
          until_stopped(guard_callback("on_final_params", c.on_final_params), stop)};
}

// The settings a job runs with: a resumed job goes on checkpointing where
// it was resumed from, and a job's own data is not augmented unless asked
// (config.dataset, which it ignores, turned cifar10's default on).
JobConfig as_run(const JobConfig& requested, bool own_data) {
  JobConfig config = requested;
  if (!config.resume.empty() && config.checkpoint_dir.empty()) config.checkpoint_dir = config.resume;
  if (own_data && config.augment.empty()) config.augment = "none";
  return config;
}

// `metrics` is opened here once the settings are checked, and the caller
// ends it for a job that does not finish.
Result<JobSummary> run_job_unguarded(const JobConfig& requested, const JobCallbacks& callbacks, std::stop_token stop,
                                     const ClusterHooks& hooks, std::shared_ptr<const UserDataset> user_data,
                                     MetricsSink& metrics, std::chrono::steady_clock::time_point job_start) {
  // Workers placed in processes check their device where they run.
  const bool devices_here = !hooks.make_placement;
  if (Status s = user_data ? validate(requested, *user_data) : validate_settings(requested, devices_here); !s.ok())
    return s;
  const JobConfig config = as_run(requested, user_data != nullptr);

  if (Status s = metrics.open(config.metrics_out, !config.resume.empty()); !s.ok()) return s;
  std::shared_ptr<LiveStatus> live;
  std::unique_ptr<StatusServer> status_server;
  if (config.status_port != 0) {
    auto server = start_status_server(config, user_data ? user_data->name : config.dataset, live);
    if (!server) return server.status();
    status_server = std::move(server).value();
  }
  auto checkpoint_lock = hold_checkpoint_dir(config);
  if (!checkpoint_lock) return checkpoint_lock.status();
  const bool own_data = user_data != nullptr;
  auto data = job_data(config, user_data);
  if (!data) return data.status();
  auto planned = plan_for(config, **data, hooks.make_placement ? Placement::processes : Placement::one_process);
  // Ends as a job its coordinator failed: the processes of a cluster are told.
  auto failed = [&hooks](const Status& why) {
    if (hooks.before_shutdown) hooks.before_shutdown(why);
    return why;
  };
  if (!planned) return failed(planned.status());
  const JobPlan& plan = planned->plan;  // until it moves into the coordinator's setup
  // As the summary names it ("ssp:3" for --policy ssp --staleness 3).
  if (live) live->update([&](LiveSnapshot& s) { s.policy = plan.policy_name; });
  auto resumed = resume_and_save_settings(config, plan, own_data);
  if (!resumed) return failed(resumed.status());

  // Each worker's share of the cores, in a budget of this job's own (for a
  // coordinator process, its evaluations' share).
  const std::size_t threads = hooks.compute_threads > 0 ? hooks.compute_threads : plan.compute_threads;
  const auto compute = std::make_shared<ComputeContext>(threads);
  if (hooks.on_compute_context) hooks.on_compute_context(compute);
  planned->model.use_compute(compute);
  planned->model.init_params(config.seed);
  log_blas(threads, hooks.make_placement ? 0 : plan.workers.size(), hooks.make_placement ? "evaluation" : "worker");
  // Before the workers' models take the memory (the coordinator evaluates
  // beside them).
  auto buffers = blas::BufferClaim::make((plan.actor_threads + 1) * threads);
  if (!buffers) return failed(buffers.status());

  const JobCallbacks guarded = guarded_callbacks(callbacks, stop);
  auto on_epoch = [&](const EpochMetrics& m) {
    metrics.write(to_json(m));
    if (guarded.on_epoch) guarded.on_epoch(m);
  };
  auto on_eval = [&](const EvalPoint& e) {
    metrics.write(to_json(e));
    if (guarded.on_eval) guarded.on_eval(e);
  };
  auto on_record = [&](const nlohmann::json& record) { metrics.write(record); };
  CoordinatorSetup setup{config,   *data,   on_epoch,  on_eval, guarded.on_progress, guarded.on_final_params,
                         nullptr,  nullptr, live,      on_record, compute,             std::move(planned->plan),
                         std::make_shared<Model>(std::move(planned->model)), std::move(resumed).value(),
                         nullptr};
  if (setup.resumed && !config.checkpoint_dir.empty())
    setup.on_restored = settings_writer(config, setup.plan.batch, own_data);
  EnergyMeter meter(EnergyMeter::from_environment());
  auto result = run_coordinator(std::move(setup), hooks, stop);
  if (!result) return result;
  JobSummary summary = std::move(result).value();
  summary.input_mean = (*data)->normalization.mean;
  summary.input_stddev = (*data)->normalization.stddev;
  summary.energy = meter.stop();
  summary.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count();
  metrics.write(to_json(summary));
  if (!metrics.error.ok()) return metrics.error;
  return summary;
}

}  // namespace

// Whatever is thrown on the job's thread (memory that is not there, a
// callback of the host's that throws) ends the job as its Status; a job
// that does not finish ends its metrics file saying how it stopped, unless
// it was refused (a usage error: a refused --resume leaves the file as it
// was).
Result<JobSummary> run_job_with(const JobConfig& requested, const JobCallbacks& callbacks, std::stop_token stop,
                                const ClusterHooks& hooks, std::shared_ptr<const UserDataset> user_data) {
  const auto job_start = std::chrono::steady_clock::now();
  MetricsSink metrics;
  Result<JobSummary> result = Status::Internal("the job did not run");
  try {
    result = run_job_unguarded(requested, callbacks, stop, hooks, std::move(user_data), metrics, job_start);
  } catch (...) {
    result = thrown_status(std::current_exception(), "the job");
    logger().error("{}", result.status().message());
  }
  if (!result.ok() && !is_usage_error(result.status()) && metrics.error.ok())
    metrics.stopped(result.status(), std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count());
  // What the job freed goes back now (a host calling run_job in a loop kept
  // about 90 MB between jobs without it).
  malloc_trim(0);
  return result;
}

}  // namespace asgd
