// The coordinator process of a job across processes: its registry (an
// actor, runtime/cluster_registry.hpp) waits for the shard and worker
// processes to register and keeps the membership during the job; the job
// places its shards and workers on them through ClusterPlacement.

#include <spdlog/fmt/fmt.h>
#include "base/log.hpp"

#include <filesystem>
#include <utility>

#include "actors/coordinator.hpp"
#include "actors/job_plan.hpp"
#include "base/cpus.hpp"
#include "messaging/bridge.hpp"
#include "runtime/cluster.hpp"
#include "runtime/cluster_internal.hpp"
#include "runtime/cluster_registry.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"
#include "runtime/status_server.hpp"

namespace asgd {

namespace {

using namespace messaging;
using namespace cluster_detail;
// A worker process said it was interrupted: lost, a moment later.
using interrupted_atom = caf::atom_constant<caf::atom("interrupt")>;

// Stands for a worker process at the coordinator: stops normally once the
// worker has finished, abnormally when its process has gone silent (the
// coordinator then goes on without it). A failure the process reports
// passes through here, so one from a process already declared dead (a
// late one, or from a worker that was only stalled) no longer counts.
//
// Until its first heartbeat after the assignment the process is loading its
// data (heartbeats resume after that), so `startup_limit` (--join-timeout)
// applies instead of `silence_limit`.
caf::behavior remote_worker(caf::event_based_actor* self, caf::timespan silence_limit, caf::timespan startup_limit,
                            caf::actor coordinator) {
  auto last = std::make_shared<SteadyClock::time_point>(SteadyClock::now());
  auto heard = std::make_shared<bool>(false);
  self->delayed_send(self, kHeartbeatEvery, tick_atom::value);
  return {
      [last, heard](alive_atom) {
        *last = SteadyClock::now();
        *heard = true;
      },
      [self](done_atom) { self->quit(); },
      [self, coordinator](failed_atom a, std::int32_t code, std::string& what) {
        // A process interrupted (Ctrl-C, a TERM) is lost, not a failure of
        // the job; a moment later, so that a Ctrl-C that reached the
        // coordinator too ends the job as interrupted first.
        if (code == static_cast<std::int32_t>(StatusCode::cancelled)) {
          self->delayed_send(self, std::chrono::milliseconds(300), interrupted_atom::value);
          return;
        }
        self->send(coordinator, a, code, std::move(what));
      },
      [self](interrupted_atom) {
        self->quit(caf::make_error(caf::sec::runtime_error, "its process was interrupted (SIGINT or SIGTERM)"));
      },
      [self, last, heard, silence_limit, startup_limit](tick_atom) {
        const caf::timespan limit = *heard ? silence_limit : std::max(silence_limit, startup_limit);
        if (SteadyClock::now() - *last > limit) {
          self->quit(caf::make_error(caf::sec::runtime_error,
                                     fmt::format("its process sent no heartbeat for {:g} s ({})",
                                                 std::chrono::duration<double>(limit).count(),
                                                 *heard ? "--heartbeat-timeout" : "--join-timeout, while it started")));
          return;
        }
        self->delayed_send(self, kHeartbeatEvery, tick_atom::value);
      },
  };
}

// A resumed job goes on checkpointing where it resumed from (as run_job
// has it), and its shard processes reload their checkpoints from there.
// Absolute, for processes started elsewhere: a relative --checkpoint-dir
// was each shard's own working folder's, and split the job's checkpoints
// (job.toml beside the coordinator, shard-K.ckpt beside each shard).
JobConfig checkpointing_where_resumed(JobConfig c) {
  if (!c.checkpoint_dir.empty()) c.checkpoint_dir = std::filesystem::absolute(c.checkpoint_dir).lexically_normal().string();
  if (c.resume.empty()) return c;
  c.resume = std::filesystem::absolute(c.resume).lexically_normal().string();
  if (c.checkpoint_dir.empty()) c.checkpoint_dir = c.resume;
  return c;
}

// Where the job's shards and workers are: the processes the registry
// holds. Called from the coordinator's thread; everything that concerns a
// process's slot goes to the registry, which alone keeps them.
class ClusterPlacement final : public RemotePlacement {
 public:
  ClusterPlacement(std::shared_ptr<Bridge> bridge, caf::actor registry, JobConfig config,
                   std::vector<std::string> shard_endpoints, double join_timeout_s, std::uint32_t train_fingerprint)
      : bridge_(std::move(bridge)),
        registry_(std::move(registry)),
        config_(checkpointing_where_resumed(std::move(config))),
        config_text_(to_toml(config_)),
        shard_endpoints_(std::move(shard_endpoints)),
        join_timeout_s_(join_timeout_s),
        train_fingerprint_(train_fingerprint) {
    bounds_.assign(shard_endpoints_.size() + 1, 0);
  }

  Result<caf::actor> place_shard(caf::local_actor* self, const ShardSetup& setup,
                                 const std::vector<Clock>& restart) override {
    auto a = std::make_shared<Assignment>();
    a->restore = !restart.empty();
    a->restart = restart;
    a->role = Role::shard;
    a->index = setup.index;
    a->config = config_text_;
    a->workers = setup.workers;
    a->range_begin = setup.range.begin;
    a->range_end = setup.range.end;
    a->schedule_steps = setup.schedule.total_steps;
    a->train_fingerprint = setup.train_fingerprint;  // for its checkpoints
    auto peer = bridge_->connect(shard_endpoints_.at(setup.index));
    if (!peer) return peer.status();
    bounds_[setup.index] = setup.range.begin;
    bounds_[setup.index + 1] = setup.range.end;
    caf::anon_send(registry_, ShardPlaced{std::move(a), std::make_shared<const std::vector<float>>(setup.initial), *peer});
    return self->spawn(remote_shard, bridge_, *peer, setup.index);
  }

  void await_shards(caf::actor coordinator) override {
    caf::anon_send(registry_, ready_atom::value, std::move(coordinator));
  }

  void dismiss_worker(std::uint32_t w, const std::string& why) override {
    caf::anon_send(registry_, dismiss_atom::value, w, why);
  }

  void worker_lost(std::uint32_t w) override { caf::anon_send(registry_, leave_atom::value, w); }
  void stop_workers() override { caf::anon_send(registry_, stop_atom::value); }

  Result<caf::actor> place_worker(caf::local_actor* self, std::uint32_t w) override {
    const auto silence = std::chrono::duration_cast<caf::timespan>(
        std::chrono::duration<double>(config_.heartbeat_timeout_s));
    const auto startup = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(join_timeout_s_));
    auto proxy = self->spawn(remote_worker, silence, startup, caf::actor_cast<caf::actor>(self));
    caf::anon_send(registry_, proxy_atom::value, w, proxy);
    return proxy;
  }

  void calibrate_worker(const JobPlan& plan, std::uint32_t w) override { send_assignment(plan, w, 0, true, false); }

  void start_worker(const JobPlan& plan, std::uint32_t w, std::uint32_t first_epoch) override {
    send_assignment(plan, w, first_epoch, false, true);
  }

  void prepare_workers(const JobPlan& plan, std::uint32_t first_epoch) override {
    caf::anon_send(registry_, prepare_atom::value, static_cast<std::uint32_t>(plan.workers.size()));
    for (std::uint32_t w = 0; w < plan.workers.size(); ++w) send_assignment(plan, w, first_epoch, false, false);
  }

  void begin_worker(std::uint32_t w) override { caf::anon_send(registry_, start_atom::value, w); }

 private:
  void send_assignment(const JobPlan& plan, std::uint32_t w, std::uint32_t first_epoch, bool calibrate, bool start) {
    const WorkerPlan& worker = plan.workers.at(w);
    auto a = std::make_shared<Assignment>();
    a->role = Role::worker;
    a->index = w;
    a->config = config_text_;
    a->workers = static_cast<std::uint32_t>(plan.workers.size());
    a->train_fingerprint = train_fingerprint_;
    a->partition_begin = worker.share.partition.begin;
    a->partition_end = worker.share.partition.end;
    a->batch = worker.share.batch;
    a->schedule_steps = plan.planned_clocks;
    a->first_epoch = first_epoch;
    a->range_bounds = bounds_;
    a->calibrate = calibrate;
    caf::anon_send(registry_, WorkerStart{std::move(a), start});  // it adds where each shard listens now
  }

  std::shared_ptr<Bridge> bridge_;
  caf::actor registry_;
  JobConfig config_;
  std::string config_text_;
  std::vector<std::string> shard_endpoints_;  // where each shard listened when the job was placed
  std::vector<std::uint64_t> bounds_;
  double join_timeout_s_;
  std::uint32_t train_fingerprint_;  // the coordinator's training split's, which each worker checks its own against
};

// The coordinator process's endpoint: everything it receives goes to the
// registry.
Result<std::shared_ptr<Bridge>> start_bridge(const JobConfig& config, const ProcessOptions& o, caf::actor registry) {
  BridgeOptions bo;
  bo.listen = o.listen;
  bo.coding = coding_of(config);
  if (auto why = compress_changes_nothing(config)) logger().warn("{}", *why);
  bo.name = "coordinator";
  bo.curve = o.curve;
  bo.shared_memory = o.shared_memory;
  bo.limits.bound_max_part_bytes = largest_part(0);  // its endpoint is sent no tensors
  bo.limits.bound_max_connections = max_connections(std::size_t{config.workers} + config.shards);
  return Bridge::start(bo, [registry](Inbound&& in) {
    caf::anon_send(registry, Post{std::make_shared<Inbound>(std::move(in))});
  });
}


}  // namespace

Status validate_for_cluster(const JobConfig& c, WorkersOn workers) {
  if (Status s = validate_settings(c, workers == WorkersOn::this_host); !s.ok()) return s;
  // Heartbeats are between processes: one process does not check them.
  if (c.heartbeat_timeout_s >= c.rpc_timeout_s)
    return Status::InvalidArgument(
        fmt::format("--heartbeat-timeout {:g}: must be below --rpc-timeout ({:g} s), or workers held by a dead one "
                    "give up first",
                    c.heartbeat_timeout_s, c.rpc_timeout_s));
  auto settings = plan_settings(c, Placement::processes, 1);
  if (settings && settings->shares_parameters)
    return Status::InvalidArgument("--policy " + c.policy +
                                   ": workers in separate processes cannot share one parameter buffer; use "
                                   "asgd train for hogwild");
  if (settings && settings->exchange != Exchange::none && c.workers > 64)
    return Status::InvalidArgument("--workers " + std::to_string(c.workers) + " with --policy " + c.policy +
                                   ": the workers' collective across processes takes at most 64");
  if (c.model_spec)
    return Status::InvalidArgument("model_spec '" + c.model_spec->name() +
                                   "': a model built from code is not carried across processes; use a model name "
                                   "(--model) with asgd cluster, or run_job in one process");
  return {};
}

// What the processes are told when the job ends. (A cancelled job did not
// fail: they said "the job failed: the job was cancelled".)
std::string stop_reason(const Status& outcome) {
  if (outcome.ok()) return std::string(kJobDone);
  return (outcome.code() == StatusCode::cancelled ? "the job stopped: " : "the job failed: ") + outcome.message();
}

// The status server starts with the job, once every process has
// registered: a port it cannot have is found before that (everyone joined,
// then everyone was sent away).
Status status_port_free(const JobConfig& config) {
  if (config.status_port == 0) return {};
  return StatusServer::can_listen(config.status_address, config.status_port);
}

Result<JobSummary> run_coordinator_process(const JobConfig& config, const ProcessOptions& o,
                                           const JobCallbacks& callbacks, std::stop_token stop,
                                           const std::function<void(const std::string&)>& on_listening) {
  if (Status s = validate_for_cluster(config, WorkersOn::their_hosts); !s.ok()) return s;
  if (o.shards != config.shards || o.workers != config.workers)
    return Status::InvalidArgument("the coordinator expects --shards and --workers processes as the job says");
  if (Status s = status_port_free(config); !s.ok()) return s;
  // The registry's actor system outlives the job's.
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  cfg.set("scheduler.max-threads", 1);
  sleep_when_idle(cfg);
  caf::actor_system system{cfg};
  caf::actor registry = spawn_registry(system, RegistrySetup{config, o.join_timeout_s, o.supervision, o.rank_hosts, o.run});
  auto started = start_bridge(config, o, registry);
  if (!started) {
    caf::anon_send_exit(registry, caf::exit_reason::user_shutdown);
    return started.status();
  }
  std::shared_ptr<Bridge> bridge = *started;
  caf::anon_send(registry, bridge);
  if (o.supervision)
    o.supervision->listen([registry](ProcessExit e) { caf::anon_send(registry, Exited{std::move(e)}); });
  if (on_listening) on_listening(bridge->endpoint());
  logger().info("coordinator listening on {}: waiting for {} shard and {} worker processes", bridge->endpoint(),
               config.shards, config.workers);

  // Tells every process to stop, once, and waits for the registry to go.
  caf::scoped_actor main{system};
  bool stopped = false;
  auto say_stop = [&](const std::string& why, bool usage_error = false) {
    if (std::exchange(stopped, true)) return;
    if (o.supervision) o.supervision->job_over();
    main->request(registry, std::chrono::seconds(10), stop_atom::value, why, usage_error)
        .receive([](bool) {},
                 [](caf::error& err) { logger().warn("coordinator: the registry did not stop: {}", to_string(err)); });
    bridge->stop(std::chrono::seconds(2));
  };

  // Registration: answered when every slot is filled, at --join-timeout,
  // or when `stop` cancels it.
  Status registration;
  std::vector<std::string> shard_endpoints;
  std::uint32_t workers_here = 0;  // worker processes on this process's CPUs
  {
    std::stop_callback cancel(stop, [registry] { caf::anon_send(registry, cancel_atom::value); });
    main->request(registry, caf::infinite, await_atom::value)
        .receive(
            [&](std::int32_t code, std::string& what, std::vector<std::string>& endpoints, std::uint32_t here) {
              registration = code == 0 ? Status{} : Status::WithCode(static_cast<StatusCode>(code), what);
              shard_endpoints = std::move(endpoints);
              workers_here = here;
            },
            [&](caf::error& err) { registration = Status::Internal("the registry failed: " + to_string(err)); });
  }
  if (!registration.ok()) {
    // The processes that did come hear why (which ones are missing).
    say_stop(registration.code() == StatusCode::cancelled ? "cancelled"
                                                          : "the job did not start: " + registration.message());
    return registration;
  }

  ClusterHooks hooks;
  hooks.make_placement = [&](caf::actor_system&,
                             std::uint32_t train_fingerprint) -> Result<std::shared_ptr<RemotePlacement>> {
    return std::shared_ptr<RemotePlacement>(std::make_shared<ClusterPlacement>(
        bridge, registry, config, shard_endpoints, o.join_timeout_s, train_fingerprint));
  };
  hooks.on_coordinator = [registry](caf::actor c) { caf::anon_send(registry, coordinator_atom::value, std::move(c)); };
  // Its evaluations share this process's CPUs only with the workers on
  // them, as a worker process's threads do.
  hooks.compute_threads = compute_threads(config, usable_cpus(), workers_here);
  logger().info("coordinator: evaluates on {} thread(s): {} usable CPU(s), shared with {} worker process(es) of this job",
                hooks.compute_threads, usable_cpus(), workers_here);
  hooks.before_shutdown = [&](const Status& outcome) { say_stop(stop_reason(outcome), is_usage_error(outcome)); };
  auto result = run_job_with(config, callbacks, stop, hooks);
  hooks.before_shutdown(result.ok() ? Status{} : result.status());
  log_refused("coordinator", bridge->stats());
  return result;
}

}  // namespace asgd
