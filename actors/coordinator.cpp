// The coordinator actor: a thin shell around CoordinatorCore
// (coordinator_core.hpp), which decides. The shell starts the job's actors,
// hands the core what arrives with the time, and performs what it asks:
// sending to shards and workers, snapshots of the shards, evaluating and
// checkpointing the model, the job's outcome.
#include "actors/coordinator.hpp"

#include "base/log.hpp"
#include "base/scoped_seconds.hpp"
#include <spdlog/fmt/fmt.h>
#include <algorithm>
#include <limits>
#include <optional>

#include "actors/checkpoint.hpp"
#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/thrown.hpp"
#include "actors/worker.hpp"

namespace asgd {

namespace {

using Self = caf::stateful_actor<CoordinatorState>*;
using SteadyClock = std::chrono::steady_clock;
namespace act = coordinator_action;

// The most data feeders of one job that run on threads of their own.
constexpr std::uint32_t kFeederThreads = 64;

void perform(Self self, CoordinatorActions& out);

// Calls the core with a fresh list of actions, then performs them.
template <class F>
void drive(Self self, F&& f) {
  CoordinatorActions out;
  f(*self->state.core, out);
  perform(self, out);
}

void fail(Self self, Status status) {
  drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.fail(std::move(status), out); });
}

void set_live_state(CoordinatorState& s, const char* state, const std::string& message = {}) {
  if (!s.setup.live) return;
  s.setup.live->update([&](LiveSnapshot& snap) {
    snap.state = state;
    snap.message = message;
  });
}

// The job's outcome, reported once: later reports (a failure after the
// summary, an exception after a failure) are dropped.
void settle(CoordinatorState& s, Result<JobSummary> outcome) {
  if (!s.setup.outcome) return;
  s.setup.outcome->set_value(std::move(outcome));
  s.setup.outcome.reset();
}

void stop_children(Self self) {
  for (auto* group : {&self->state.workers, &self->state.feeders, &self->state.shards})
    for (auto& a : *group) self->send_exit(a, caf::exit_reason::user_shutdown);
}

void shut_down(Self self) {
  stop_children(self);
  self->quit();
}

// Asks every shard for its parameters, copies them into the coordinator's
// model, then calls `then` with the worker pushes those parameters hold
// (the fewest any shard had applied; none when the workers share one
// buffer, which no shard updates).
void snapshot(Self self, std::function<void(std::optional<std::uint64_t>)> then) {
  auto& st = self->state;
  auto remaining = std::make_shared<std::size_t>(st.shards.size());
  auto applied = std::make_shared<std::uint64_t>(std::numeric_limits<std::uint64_t>::max());
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    self->request(st.shards[i], rpc_timeout(st.setup.config), snapshot_atom::value)
        .then(
            [self, remaining, applied, then, i](ShardReply& reply) {
              auto& s = self->state;
              const KeyRange& r = s.core->plan().ranges[i];
              if (reply.shard != i || reply.params.size() != r.size()) {
                fail(self, Status::Internal("shard " + std::to_string(i) + " sent a malformed snapshot"));
                return;
              }
              std::copy(reply.params.begin(), reply.params.end(),
                        s.model->params().begin() + static_cast<std::ptrdiff_t>(r.begin));
              *applied = std::min(*applied, reply.applied);
              if (--*remaining == 0)
                then(s.shared ? std::nullopt : std::optional<std::uint64_t>(*applied));
            },
            [self, i](caf::error& err) {
              fail(self, Status::Timeout("coordinator: no snapshot from shard " + std::to_string(i) + ": " +
                                         reason_text(self->system(), err)));
            });
  }
}

// The shards' parameters were never in a model that ran forward, so any
// BatchNorm running statistics the coordinator's model holds belong to
// other parameters: recompute them on a fixed slice of the training split
// (never the split being scored) before evaluating, in chunks of the
// workers' batch, the size training normalised by, on every device.
constexpr std::size_t kRecalibrationSamples = 2048;

EvalResult evaluate_on(CoordinatorState& st, const data::LabeledImages& split) {
  const ScopedSeconds timed(st.evaluation_s);
  if (st.model->has_batchnorm()) {
    const auto& train = st.setup.data->train;
    st.model->recalibrate_batchnorm(train.samples(0, std::min(kRecalibrationSamples, train.count)),
                                    st.core->plan().batch);
  }
  return st.model->evaluate_from(
      [&](std::size_t first, std::size_t n, float* out) { split.copy_samples(first, n, out); }, split.labels);
}

// The evaluated model (its BatchNorm statistics just recalibrated) as
// DIR/model.ckpt, when the job asked for one.
Status save_checkpoint(CoordinatorState& st, const EvalResult& test) {
  const JobConfig& cfg = st.setup.config;
  if (cfg.checkpoint_dir.empty()) return {};
  Checkpoint ckpt = Checkpoint::of(*st.model);
  ckpt.sample_shape = st.model->sample_shape();
  ckpt.classes = st.model->classes();
  if (cfg.model_spec) ckpt.model_spec = cfg.model_spec->to_json();
  ckpt.dataset = st.setup.data->name;
  ckpt.input_mean = st.setup.data->normalization.mean;
  ckpt.input_stddev = st.setup.data->normalization.stddev;
  ckpt.updates = st.core->updates();
  ckpt.test_accuracy = test.accuracy;
  const Status s = write_checkpoint(cfg.checkpoint_dir, ckpt);
  if (s.ok()) logger().info("checkpoint: {}/{}", cfg.checkpoint_dir, kCheckpointFile);
  return s;
}

// The core's Finish: the final parameters, the test accuracy, the shards'
// statistics, the outcome; then stop.
void finish(Self self) {
  set_live_state(self->state, "finishing");
  snapshot(self, [self](std::optional<std::uint64_t>) {
    auto& c = self->state;
    if (c.setup.on_final_params) c.setup.on_final_params(c.model->params());
    const EvalResult result = evaluate_on(c, c.setup.data->test);
    if (const Status saved = save_checkpoint(c, result); !saved.ok()) {
      fail(self, saved);
      return;
    }
    auto stats = std::make_shared<std::vector<ShardStats>>();
    for (std::size_t i = 0; i < c.shards.size(); ++i) {
      self->request(c.shards[i], rpc_timeout(c.setup.config), stats_atom::value)
          .then(
              [self, stats, result](ShardStats& s) {
                stats->push_back(std::move(s));
                auto& c2 = self->state;
                if (stats->size() < c2.shards.size() || c2.core->done()) return;
                JobSummary summary = c2.core->finished(result.accuracy, *stats);
                summary.evaluation_s = c2.evaluation_s;
                set_live_state(c2, "done");
                settle(c2, std::move(summary));
                shut_down(self);
              },
              [self, i](caf::error& err) {
                fail(self, Status::Timeout("coordinator: no statistics from shard " + std::to_string(i) + ": " +
                                           reason_text(self->system(), err)));
              });
    }
  });
}

// The core's Place: a new process for worker `w` stands in for the lost one.
void place_rejoined(Self self, std::uint32_t w, std::uint64_t first_epoch) {
  auto& s = self->state;
  auto proxy = s.setup.remote->place_worker(self, w);
  if (!proxy) {
    drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) {
      core.refuse_rejoin(w, proxy.status().message(), out);
    });
    return;
  }
  s.workers[w] = *proxy;
  s.names[proxy->address()] = "worker " + std::to_string(w);
  self->monitor(*proxy);
  drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.rejoined(w, first_epoch, out); });
}

// The core's Join: every shard takes worker `w` back at `clock`; a
// statistics request after the join on the same connection is answered
// after it, so once every shard has answered the worker may start.
void join_shards(Self self, const act::Join& join) {
  auto& s = self->state;
  auto remaining = std::make_shared<std::size_t>(s.shards.size());
  for (auto& shard : s.shards) {
    self->send(shard, join_atom::value, static_cast<WorkerId>(join.worker), join.clock);
    self->request(shard, rpc_timeout(s.setup.config), stats_atom::value)
        .then(
            [self, join, remaining](ShardStats&) {
              if (--*remaining > 0) return;
              drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) {
                core.rejoin_confirmed(join.worker, join.first_epoch, SteadyClock::now(), out);
              });
            },
            [self, w = join.worker](caf::error& err) {
              fail(self, Status::Timeout("coordinator: a shard did not confirm worker " + std::to_string(w) +
                                         "'s rejoining: " + reason_text(self->system(), err)));
            });
  }
}

// Performs one action of the core's.
struct Perform {
  Self self;
  CoordinatorState& s;

  void operator()(act::Leave& a) {
    for (auto& shard : s.shards) self->send(shard, leave_atom::value, static_cast<WorkerId>(a.worker));
    if (s.shared) s.shared->live[a.worker].store(false, std::memory_order_release);
    if (s.collective) s.collective->leave(a.worker);  // allreduce, gossip: the others' ring goes on without it
    if (s.setup.remote) s.setup.remote->worker_lost(a.worker);  // its process, if stopped or hung, is ended
  }
  void operator()(act::Kill& a) {
    if (a.worker >= s.workers.size()) return;
    self->demonitor(s.workers[a.worker]);
    self->send_exit(s.workers[a.worker], caf::exit_reason::kill);
  }
  void operator()(act::Evaluate&) {
    snapshot(self, [self = self](std::optional<std::uint64_t> applied) {
      auto& c = self->state;
      const EvalResult r = evaluate_on(c, c.setup.data->validation);
      drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) {
        core.evaluated(r.accuracy, applied, SteadyClock::now(), out);
      });
    });
  }
  void operator()(act::Finish&) { finish(self); }
  void operator()(act::Fail& a) {
    set_live_state(s, "failed", a.status.message());
    settle(s, std::move(a.status));
    shut_down(self);
  }
  void operator()(act::Dismiss& a) {
    if (s.setup.remote) s.setup.remote->dismiss_worker(a.worker, a.why);
  }
  void operator()(act::Place& a) { place_rejoined(self, a.worker, a.first_epoch); }
  void operator()(act::Join& a) { join_shards(self, a); }
  void operator()(act::StartWorker& a) { s.setup.remote->start_worker(s.core->plan(), a.worker, a.first_epoch); }
  void operator()(act::EpochDone& a) {
    if (s.setup.on_epoch) s.setup.on_epoch(a.metrics);
  }
  void operator()(act::PointDone& a) {
    if (s.setup.on_eval) s.setup.on_eval(a.point);
  }
  void operator()(act::Record& a) {
    if (s.setup.on_record) s.setup.on_record(a.record);
  }
  void operator()(act::StopTraining&) {
    for (auto& feeder : s.feeders) self->send(feeder, stop_atom::value);
    if (s.setup.remote) s.setup.remote->stop_workers();
  }
  void operator()(act::ArmEval& a) {
    self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(a.after), eval_atom::value);
  }
};

void perform(Self self, CoordinatorActions& out) {
  for (auto& action : out) std::visit(Perform{self, self->state}, action);
}

// Every kLiveEvery while training: Progress for the caller and the live
// status for a status server, from the workers' latest progress; with a
// status server also asks the shards how they stand.
void live_tick(Self self) {
  auto& st = self->state;
  if (st.core->done()) return;
  self->delayed_send(self, kLiveEvery, live_atom::value);
  const auto now = SteadyClock::now();
  const Progress p = st.core->tick(now);
  if (st.setup.on_progress) st.setup.on_progress(p);
  if (!st.setup.live) return;
  st.setup.live->update([&](LiveSnapshot& snap) {
    st.core->fill_live(snap, p, now);
    snap.shard = st.live_shards;
  });
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    self->request(st.shards[i], rpc_timeout(st.setup.config), stats_atom::value)
        .then(
            [self, i](ShardStats& s) {
              auto& c = self->state;
              if (i < c.live_shards.size()) c.live_shards[i] = live_shard(s, unix_seconds_now());
            },
            [i](caf::error&) { logger().debug("live status: no statistics from shard {} this time", i); });
  }
}

// Starts every worker, and the clock.
void begin_training(Self self) {
  auto& st = self->state;
  if (st.core->done()) return;  // failed while the worker processes prepared
  drive(self, [](CoordinatorCore& core, CoordinatorActions& out) { core.start_training(SteadyClock::now(), out); });
  for (std::uint32_t w = 0; w < st.setup.config.workers; ++w) {
    if (st.setup.remote)
      st.setup.remote->begin_worker(w);
    else
      self->send(st.workers[w], start_atom::value, st.feeders[w]);
  }
  if (st.setup.on_progress || st.setup.live) self->delayed_send(self, kLiveEvery, live_atom::value);
}

// Spawns a data feeder per worker for its share and starts every worker.
// Worker processes feed themselves, and first take their assignments and
// load their data: the clock starts once they all can (prepared_atom).
void start_training(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  const JobPlan& plan = st.core->plan();
  st.live_shards.assign(st.shards.size(), {});
  const std::uint32_t first_epoch = st.core->resumed() ? st.core->resumed()->first_epoch : 0u;
  if (st.setup.remote) return st.setup.remote->prepare_workers(plan, first_epoch);
  // A feeder on a thread of its own makes batches while its worker computes. Past kFeederThreads workers
  // the feeders share the scheduler's threads: a job of a thousand workers must not ask the host for a
  // thousand threads (one that cannot start would leave an actor the actor system waits for forever).
  const bool own_threads = cfg.workers <= kFeederThreads;
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    FeederSetup setup = feeder_setup(plan, plan.workers[w], st.setup.data, first_epoch);
    auto feeder = own_threads ? self->spawn<caf::detached>(data_feeder, std::move(setup))
                              : self->spawn(data_feeder, std::move(setup));
    st.names[feeder.address()] = "data feeder " + std::to_string(w);
    st.feeders.push_back(feeder);
    self->monitor(feeder);
  }
  begin_training(self);
}

// --worker-weights auto: asks the workers one at a time (not competing for cores) what a step costs
// them, in one process in 3 interleaved rounds keeping each one's cheapest (keep_cheapest), sizes
// batches and shares for steps of equal length, and starts training.
void calibrate(Self self, std::size_t next, std::shared_ptr<std::vector<StepCost>> rates) {
  auto& st = self->state;
  const std::size_t n = st.workers.size(), w = next % n;
  if (next == (st.setup.remote ? 1 : 3) * n) return st.core->calibrated(*rates), start_training(self);
  if (st.setup.remote) {  // the process measures itself: (calibrate_atom, w, cost) from the registry; -1: timed out
    st.rates = rates;
    st.setup.remote->calibrate_worker(st.core->plan(), static_cast<std::uint32_t>(w));
    return self->delayed_send(self, rpc_timeout(st.setup.config), calibrate_atom::value, std::uint32_t(w), 0.0, -1.0);
  }
  data::Batch probe = data::leading_batch(st.setup.data->train, 2 * std::size_t{st.core->plan().batch});
  self->request(st.workers[w], rpc_timeout(st.setup.config), calibrate_atom::value, std::move(probe))
      .then(
          [self, next, w, rates](const std::vector<double>& cost) {  // balanced_batches guards a zero
            keep_cheapest(*rates, w, {cost.at(0), cost.at(1)}, self->state.core->plan().batch);
            calibrate(self, next + 1, rates);
          },
          [self, w](caf::error& err) {
            fail(self, Status::Timeout("coordinator: no calibration from worker " + std::to_string(w) + ": " +
                                       reason_text(self->system(), err)));
          });
}

// The plan's shards, each on its slice of the model's initial parameters
// (or its checkpoint, when the job resumes), spawned here or placed in
// their processes. False once the job has failed.
bool start_shards(Self self) {
  auto& st = self->state;
  const JobConfig& cfg = st.setup.config;
  const JobPlan& job = st.core->plan();
  const auto params = st.model->params();
  const auto& resumed = st.core->resumed();
  for (const ShardPlan& plan : job.shards) {
    std::vector<float> initial;
    if (!st.shared)
      initial.assign(params.begin() + static_cast<std::ptrdiff_t>(plan.range.begin),
                     params.begin() + static_cast<std::ptrdiff_t>(plan.range.end));
    ShardSetup ss = shard_setup(job, plan, std::move(initial));
    ss.shared = st.shared;
    auto core = ShardCore::make(ss);  // checks the setup, remote or not
    if (!core) {
      fail(self, core.status());
      return false;
    }
    // A resumed job's checkpoints are checked here, whether this process or
    // the shard's reloads them (on one host or a shared folder, the same).
    if (resumed) {
      if (const Status s = core->restore(shard_checkpoint_path(cfg.resume, plan.index), resumed->restart); !s.ok()) {
        fail(self, resume_refused(cfg, s));
        return false;
      }
    }
    caf::actor shard;
    if (st.setup.remote) {
      auto placed = st.setup.remote->place_shard(self, ss, resumed ? resumed->restart : std::vector<Clock>{});
      if (!placed) {
        fail(self, placed.status());
        return false;
      }
      shard = *placed;
    } else {
      shard = self->spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
    }
    st.names[shard.address()] = "shard " + std::to_string(plan.index);
    st.shards.push_back(shard);
  }
  return true;
}

// The plan's workers, spawned here or standing for their processes; they
// start training later (start_training). False once the job has failed.
bool start_workers(Self self) {
  auto& st = self->state;
  const JobPlan& job = st.core->plan();
  for (const WorkerPlan& plan : job.workers) {
    caf::actor wk;
    if (st.setup.remote) {
      auto placed = st.setup.remote->place_worker(self, plan.id);
      if (!placed) {
        fail(self, placed.status());
        return false;
      }
      wk = *placed;
    } else {
      WorkerSetup ws = worker_setup(job, plan);
      ws.shards = st.shards;
      ws.coordinator = caf::actor_cast<caf::actor>(self);
      ws.shared = st.shared;
      ws.collective = st.collective;
      ws.compute = st.setup.compute;
      wk = self->spawn(worker, std::move(ws));
    }
    st.names[wk.address()] = "worker " + std::to_string(plan.id);
    st.workers.push_back(wk);
  }
  return true;
}

// A watched actor stopped: a worker that finished or was lost, or anything
// else, which fails the job.
void on_down(Self self, caf::down_msg& dm) {
  auto& s = self->state;
  if (s.core->done()) return;
  const auto w = std::find(s.workers.begin(), s.workers.end(), dm.source);
  const auto i = static_cast<std::uint32_t>(w - s.workers.begin());
  if (dm.reason == caf::exit_reason::normal) {
    if (w != s.workers.end())
      drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.worker_finished(i, out); });
    return;
  }
  if (w != s.workers.end()) {
    const std::string why = reason_text(self->system(), dm.reason);
    drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.worker_lost(i, why, out); });
    return;
  }
  auto it = s.names.find(dm.source);
  const std::string who = it != s.names.end() ? it->second : "an actor";
  fail(self, Status::Internal(who + " stopped unexpectedly: " + self->system().render(dm.reason)));
}

// Shard `shard`'s process was restarted: it hears who had left, and the
// metrics file what was lost.
void shard_restarted(Self self, std::uint32_t shard) {
  auto& s = self->state;
  if (s.core->done() || shard >= s.shards.size()) return;
  // The restarted process has the workers that had left by its
  // checkpoint; the leave notices that came after died with the old one.
  const Membership& members = s.core->members();
  for (std::size_t w = 0; w < members.size(); ++w)
    if (members.finished(w) || members.lost(w)) self->send(s.shards[shard], leave_atom::value, static_cast<WorkerId>(w));
  const double at_s = s.core->shard_restarted(SteadyClock::now());
  auto record = [self](const nlohmann::json& r) {
    if (self->state.setup.on_record) self->state.setup.on_record(r);
  };
  self->request(s.shards[shard], rpc_timeout(s.setup.config), stats_atom::value)
      .then([shard, at_s, record, dir = s.setup.config.checkpoint_dir](ShardStats& reloaded) {
              record(shard_restart_record(shard, at_s, &reloaded, {}, unix_seconds_now(), dir));
            },
            [self, shard, at_s, record](caf::error& err) {
              record(shard_restart_record(shard, at_s, nullptr, reason_text(self->system(), err), unix_seconds_now()));
            });
}

// Every shard serves: the workers start (after calibration with
// --worker-weights auto).
void shards_serve(Self self) {
  auto& st = self->state;
  if (st.core->done()) return;
  if (st.core->resumed()) {  // every shard restored: only now do job.toml and the metrics file hear of it
    if (Status s = st.setup.on_restored ? st.setup.on_restored() : Status{}; !s.ok()) {
      fail(self, s);
      return;
    }
    const nlohmann::json record = resume_record(st.setup.config, *st.core->resumed(), unix_seconds_now());
    warn_of_worker_state_not_resumed(st.core->plan());
    if (st.setup.on_record) st.setup.on_record(record);
  }
  if (!start_workers(self)) return;
  for (auto* group : {&st.shards, &st.workers})
    for (auto& a : *group) self->monitor(a);
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  if (st.core->plan().calibrate_weights)
    calibrate(self, 0, std::make_shared<std::vector<StepCost>>());
  else
    start_training(self);
}

// The job's start: its model taken over, its shards started; the rest
// once they serve (shards_serve). False once the job has failed.
bool start_job(Self self) {
  auto& st = self->state;
  if (!st.setup.model) {
    fail(self, Status::Internal("coordinator: started without its model"));
    return false;
  }
  st.model.emplace(std::move(*st.setup.model));
  st.setup.model.reset();
  if (st.core->plan().shares_parameters) {
    auto params = st.model->params();
    st.shared = std::make_shared<SharedParameters>(std::vector<float>(params.begin(), params.end()),
                                                   st.setup.config.workers);
  }
  if (st.core->plan().exchange != Exchange::none && !st.setup.remote)
    st.collective = messaging::make_local_collective(st.setup.config.workers);
  if (st.setup.resumed) st.core->resume(std::move(*st.setup.resumed));
  if (!start_shards(self)) return false;
  // Shards in other processes say when they serve (ready_atom); the
  // coordinator goes on answering meanwhile.
  if (st.setup.remote)
    st.setup.remote->await_shards(caf::actor_cast<caf::actor>(self));
  else
    shards_serve(self);
  return true;
}

}  // namespace

caf::behavior coordinator(caf::stateful_actor<CoordinatorState>* self, CoordinatorSetup setup) {
  auto& st = self->state;
  // An exception from any handler (a thread that cannot start, memory that
  // is not there) fails the job and stops every actor it started: the job's
  // actor system, which waits for all of them, then closes.
  self->set_exception_handler([self](caf::scheduled_actor*, std::exception_ptr& thrown) -> caf::error {
    Status failed = thrown_status(thrown, "the coordinator");
    logger().error("{}", failed.message());
    set_live_state(self->state, "failed", failed.message());
    settle(self->state, std::move(failed));
    stop_children(self);
    return caf::exit_reason::unhandled_exception;
  });
  st.setup = std::move(setup);
  st.core.emplace(st.setup.config, std::move(st.setup.plan), st.setup.data ? st.setup.data->name : std::string());
  if (!start_job(self)) return {};
  return {
      [self](EpochReport& r) {
        drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.report(r, SteadyClock::now(), out); });
      },
      [self](failed_atom, std::int32_t code, const std::string& what) {
        drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) {
          core.failed(static_cast<StatusCode>(code), what, out);
        });
      },
      [self](cancel_atom) { drive(self, [](CoordinatorCore& core, CoordinatorActions& out) { core.cancel(out); }); },
      [self](WorkerProgress& p) { self->state.core->progress(p, SteadyClock::now()); },
      [self](live_atom) { live_tick(self); },
      [self](calibrate_atom, std::uint32_t w, double fixed_s, double per_sample_s) {
        auto& s = self->state;
        if (!s.rates || w != s.rates->size()) return;  // late, or this worker's timer after its answer
        if (per_sample_s >= 0) return s.rates->push_back({fixed_s, per_sample_s}), calibrate(self, w + 1, s.rates);
        fail(self, Status::Timeout(fmt::format("coordinator: no calibration from worker {} within {:g} s (--rpc-timeout)",
                                               w, s.setup.config.rpc_timeout_s)));
      },
      [self](rejoin_atom, std::uint32_t w) {
        const bool placeable = self->state.setup.remote && w < self->state.workers.size();
        drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.rejoin(w, placeable, out); });
      },
      // A supervisor saw worker w's process end: no heartbeat wait.
      [self](lost_atom, std::uint32_t w, const std::string& why) {
        drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) { core.worker_gone(w, why, out); });
      },
      [self](restarted_atom, std::uint32_t shard) { shard_restarted(self, shard); },
      [self](ready_atom, std::int32_t code, const std::string& what) {
        if (code == 0) return shards_serve(self);
        drive(self, [&](CoordinatorCore& core, CoordinatorActions& out) {
          core.failed(static_cast<StatusCode>(code), what, out);
        });
      },
      [self](eval_atom) {
        drive(self, [](CoordinatorCore& core, CoordinatorActions& out) { core.eval_tick(SteadyClock::now(), out); });
      },
      [self](prepared_atom) { begin_training(self); },
  };
}

}  // namespace asgd
