#include "runtime/cluster.hpp"

#include <spdlog/fmt/fmt.h>
#include "base/cpus.hpp"
#include "base/log.hpp"
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "actors/coordinator.hpp"
#include "actors/coordinator_resume.hpp"
#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"
#include "dataset/dataset.hpp"
#include "messaging/bridge.hpp"
#include "actors/checkpoint.hpp"
#include "compute/blas.hpp"
#include "runtime/cluster_internal.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"
#include "messaging/curve_auth.hpp"
#include "runtime/launcher.hpp"

namespace asgd {

// Shared with the coordinator process (runtime/cluster_internal.hpp).
namespace cluster_detail {

std::size_t max_connections(std::size_t peers) { return 2 * peers + 16; }

void log_refused(const std::string& name, const messaging::BridgeStats& st) {
  if (st.refused == 0) return;
  logger().warn("{}: refused {} connections to its endpoint ({} over its limit of connections at once, {} in the "
               "--auth-keys handshake)",
               name, st.refused, st.refused_over_limit, st.auth_rejected);
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace cluster_detail

namespace {

using namespace messaging;
using namespace cluster_detail;

// Backpressure in a shard process (docs/cluster.md, "Queues and their
// bounds"). ZeroMQ counts messages, not bytes, and a push is the size of
// the shard's key range: a few per peer are plenty when the bridge keeps
// reading, and bound what waits in this process when it does not. (With
// libzmq 4.3.4 a receive queue of 1 stalls every CURVE connection.)
constexpr int kShardReceiveQueue = 2;  // per peer, unread
constexpr int kShardSendQueue = 32;    // per peer, replies ZeroMQ has not sent yet

// Requests a shard process reads and leaves unanswered at most. bsp and ssp
// hold one read per worker at a barrier, and the coordinator's statistics
// and snapshot requests come on top: half the limit, where reading resumes,
// stays well above that. More would only be memory: a worker has one
// request in flight per shard.
std::size_t shard_max_unanswered(std::uint32_t workers) { return 4 * std::size_t{workers} + 64; }

// A usage error (exit 2) or a stop: how a Shutdown that is not the job's end ends this process.
StatusCode stop_code(const Shutdown& s) { return s.refused ? StatusCode::invalid_argument : StatusCode::cancelled; }

caf::actor_system_config actor_config(std::size_t threads, std::chrono::microseconds busy_poll) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  cfg.set("scheduler.max-threads", std::max<std::size_t>(1, threads));
  sleep_when_idle(cfg, busy_poll);
  return cfg;
}

// ---------------------------------------------------------------------------
// Shard and worker processes.

// Stands for the coordinator inside a worker process. Each epoch the
// worker finishes is also logged here: on its own host, a worker's log
// says how far it got, whatever the coordinator makes of it.
caf::behavior remote_coordinator(caf::event_based_actor*, std::shared_ptr<Bridge> bridge, PeerId peer) {
  return {
      [bridge, peer](EpochReport& r) {
        const std::uint64_t kept = r.samples - r.dropped_samples;
        logger().info("worker {}: finished epoch {}: {} samples, {} updates, loss {:.4f}", r.worker, r.epoch + 1,
                     r.samples, r.updates, kept ? r.loss_sum / static_cast<double>(kept) : 0.0);
        bridge->send(peer, encode(r, bridge->next_id()));
      },
      [bridge, peer](WorkerProgress& p) { bridge->send(peer, encode(p, bridge->next_id())); },
      [bridge, peer](failed_atom, std::int32_t code, const std::string& what) {
        bridge->send(peer, encode(Failure{code, what}, bridge->next_id()));
      },
  };
}

// Registration and the wait for an assignment, shared by shard and worker.
struct Joined {
  std::shared_ptr<Bridge> bridge;
  std::shared_ptr<Inbox<Inbound>> inbox;
  PeerId coordinator;
  Assignment assignment;
  std::vector<float> tensor;
  JobConfig config;
};

// Tells the coordinator how this process ends (a Failure it passes on).
void tell_coordinator(Joined& j, const Status& s) {
  j.bridge->send(j.coordinator, encode(Failure{static_cast<std::int32_t>(s.code()), s.message()}, j.bridge->next_id()));
}

// "; cannot resolve HOST: ..." when the coordinator's host name does not
// resolve here (ZeroMQ tries again and again without a word), else "".
std::string unresolved(const std::string& coordinator) {
  auto bare = messaging::split_server_key(coordinator);
  auto split = bare ? split_tcp_endpoint(bare->first) : Result<std::pair<std::string, std::uint16_t>>(bare.status());
  if (!split) return "";
  auto route = address_towards(split->first);
  return route || route.status().code() != StatusCode::not_found ? "" : "; " + route.status().message();
}

// `announce`: the endpoint to register with, when not the bridge's (a
// worker's collective).
Result<Joined> join(const ProcessOptions& o, Role role, const std::string& name, bool listen,
                    std::function<bool(Inbound&)> fast_path, std::stop_token stop, const std::string& announce = "") {
  if (o.coordinator.empty()) return Status::InvalidArgument("--coordinator: the coordinator's endpoint is required");
  Joined j;
  j.inbox = std::make_shared<Inbox<Inbound>>();
  BridgeOptions bo;
  bo.listen = listen ? o.listen : "";
  bo.name = name;
  bo.curve = o.curve;
  bo.shared_memory = o.shared_memory;
  bo.busy_poll = o.busy_poll;
  // Nobody sends a shard's endpoint a push before it has its keys (and
  // says so with its first heartbeat): until then it takes control
  // messages only (run_shard_process widens it).
  bo.limits.bound_max_part_bytes = largest_part(0);
  if (role == Role::shard) {
    bo.limits.receive_high_water_mark = kShardReceiveQueue;
    bo.limits.send_high_water_mark = kShardSendQueue;
  }
  auto inbox = j.inbox;
  auto bridge = Bridge::start(bo, [inbox, fast_path](Inbound&& in) {
    if (fast_path && fast_path(in)) return;
    inbox->push(std::move(in));
  });
  if (!bridge) return bridge.status();
  j.bridge = *bridge;
  auto peer = j.bridge->connect(o.coordinator);
  if (!peer) return peer.status();
  j.coordinator = *peer;
  j.bridge->send(j.coordinator, encode(Registration{role, o.index, announce.empty() ? j.bridge->endpoint() : announce,
                                                    host_name(), static_cast<std::uint32_t>(getpid()),
                                                    cpu_set_key(), o.index_from, o.run},
                                       j.bridge->next_id()));
  const auto deadline = SteadyClock::now() + millis(o.join_timeout_s + o.join_grace_s);
  // Giving up before its assignment (Ctrl-C, its own --join-timeout), it
  // says so: the coordinator frees its slot for another process (it kept
  // it, and the job started without it, on part of the data).
  auto leave = [&](Status s) {
    tell_coordinator(j, s);
    j.bridge->stop(std::chrono::seconds(1));
    return s;
  };
  while (true) {
    if (stop.stop_requested()) return leave(Status::Cancelled(name + ": stopped before it was assigned a part"));
    if (auto why = j.bridge->refusal(j.coordinator))
      return Status::InvalidArgument(name + ": the coordinator at " + *why);
    if (SteadyClock::now() > deadline)
      return leave(Status::Timeout(fmt::format(
          "{}: no assignment from the coordinator at {} within {:g} s (--join-timeout{}){}{}", name, o.coordinator,
          o.join_timeout_s + o.join_grace_s,
          o.join_grace_s > 0 ? fmt::format(" {:g}, and {:g} s to hear rank 0", o.join_timeout_s, o.join_grace_s) : "",
          unresolved(o.coordinator),
          o.curve ? "; with --auth-keys, check that the coordinator's folder has this process's .pub and that the "
                    "coordinator's key is right"
                  : "")));
    auto in = j.inbox->pop(std::chrono::milliseconds(100));
    if (!in) continue;
    if (auto* s = std::get_if<Shutdown>(&in->body))
      return Status::WithCode(stop_code(*s), name + ": the coordinator said stop before assigning a part: " + s->reason);
    if (auto* a = std::get_if<Assignment>(&in->body)) {
      if (a->role != role) return Status::Internal(name + ": assigned a different role");
      j.assignment = std::move(*a);
      j.tensor = std::move(in->tensor);
      break;
    }
  }
  if (Status s = apply_toml_text(j.assignment.config, "from the coordinator", j.config); !s.ok()) return s;
  if (!o.data_dir.empty()) j.config.data_dir = o.data_dir;
  if (!o.device.empty()) j.config.device = o.device;
  j.bridge->set_coding(coding_of(j.config));
  return j;
}

// Runs until the coordinator says stop (or goes silent): heartbeats each
// second. `on_message` sees everything else that arrives.
Status serve_until_shutdown(Joined& j, const std::string& name, std::stop_token stop,
                            const std::function<Status(Inbound&)>& on_message) {
  // The coordinator's registry echoes every heartbeat whatever its job is
  // doing, so its silence means its process is gone.
  const auto silence = millis(std::max(j.config.heartbeat_timeout_s, 3.0));
  auto last_heard = SteadyClock::now();
  auto next_beat = SteadyClock::now();
  auto last_turn = SteadyClock::now();
  std::uint64_t beat = 0;
  while (!stop.stop_requested()) {
    const auto now = SteadyClock::now();
    // A turn of this loop takes at most 0.1 s: a gap of half the silence
    // means this process did not run (SIGSTOP, a frozen VM), and the
    // coordinator's silence over it is not the coordinator's. It gets a
    // whole --heartbeat-timeout again to answer (it blamed the coordinator).
    if (now - last_turn > silence / 2) {
      logger().warn("{}: this process did not run for {:.1f} s (stopped or starved of CPU); the coordinator may have "
                    "given it up meanwhile",
                    name, std::chrono::duration<double>(now - last_turn).count());
      last_heard = now;
    }
    last_turn = now;
    if (now >= next_beat) {
      j.bridge->send(j.coordinator, encode(Heartbeat{j.assignment.role, j.assignment.index, ++beat}, j.bridge->next_id()));
      next_beat = now + kHeartbeatEvery;
    }
    if (now - last_heard > silence)
      return Status::Timeout(fmt::format("{}: the coordinator sent nothing for {:g} s (--heartbeat-timeout): its "
                                         "process died or cannot be reached; giving up",
                                         name, std::chrono::duration<double>(silence).count()));
    auto in = j.inbox->pop(std::chrono::milliseconds(100));
    if (!in) continue;
    last_heard = SteadyClock::now();
    // The job failed, was cancelled, or let this process go: its exit status says so.
    if (auto* s = std::get_if<Shutdown>(&in->body))
      return s->reason == kJobDone ? Status{} : Status::WithCode(stop_code(*s), name + ": the coordinator stopped it: " + s->reason);
    if (Status s = on_message(*in); !s.ok()) return s;
  }
  // Told to stop by a signal (SIGINT, SIGTERM: Ctrl-C, scancel, a pod's
  // end) before the coordinator said the job was done: the job did not
  // finish, and a launcher reading every rank's status must see that.
  return Status::Cancelled(name + ": interrupted by a signal before the job's end");
}

}  // namespace

// The shard the coordinator's plan assigned this process: its keys and the
// schedule's length as assigned, the rest planned from the same settings by
// the same rules; reloaded from its checkpoint when the job resumes or the
// process takes the place of one that died.
Result<ShardCore> assigned_shard(Joined& j, const std::string& name) {
  const Assignment& a = j.assignment;
  auto plan = plan_settings(j.config, Placement::processes, usable_cpus());
  if (!plan) return plan.status();
  plan_clocks(*plan, a.schedule_steps);
  plan->train_fingerprint = a.train_fingerprint;
  const ShardPlan shard = plan_shard(*plan, a.index, {a.range_begin, a.range_end});
  const std::string& checkpoint = shard.checkpoint_path;  // a folder on this shard's host
  auto core = ShardCore::make(shard_setup(*plan, shard, std::move(j.tensor)));
  if (!core) return core;
  std::error_code ec;
  if (!a.restore) {
    // A new job: a checkpoint left by an earlier one in this folder must
    // not be reloaded if this shard is restarted before it writes its own.
    if (!checkpoint.empty()) std::filesystem::remove(checkpoint, ec);
    return core;
  }
  if (!a.restart.empty()) {  // a resumed job's: the coordinator checked the same file
    const std::string resumed = shard_checkpoint_path(j.config.resume, a.index);
    if (Status s = core->restore(resumed, a.restart); !s.ok()) return resume_refused(j.config, s);
    logger().info("{}: resumed from {}", name, resumed);
    return core;
  }
  if (checkpoint.empty())
    return Status::InvalidArgument("restarted, but the job writes no checkpoints (--checkpoint-dir, --checkpoint-every)");
  if (!std::filesystem::exists(checkpoint, ec)) {
    logger().warn("{}: restarted before its first checkpoint ({}): starting again from the initial parameters", name,
                 checkpoint);
    return core;
  }
  auto saved = ShardCore::saved(checkpoint);
  if (!saved) return saved.status();
  if (Status s = core->restore(checkpoint, {}); !s.ok()) return s;
  logger().warn("{}: restarted; reloaded {} (written {:.1f} s ago, {} updates applied by then)", name, checkpoint,
               unix_seconds_now() - saved->written_unix_s, saved->stats.updates_applied);
  return core;
}

Status run_shard_process(const ProcessOptions& o, std::stop_token stop) {
  configure_shard_allocator();  // before ZeroMQ's threads start
  // Requests for the shard go straight from the I/O thread to its server,
  // which runs there with the shard (no thread wakes per push).
  auto server = std::make_shared<std::atomic<ShardServer*>>(nullptr);
  auto fast = [server](Inbound& in) {
    ShardServer* s = server->load();
    return s && s->post(std::move(in));
  };
  auto joined = join(o, Role::shard, "shard", true, fast, stop);
  if (!joined) return joined.status();
  Joined& j = *joined;
  const Assignment& a = j.assignment;
  const std::string name = "shard " + std::to_string(a.index);

  auto actor_cfg = actor_config(1, o.busy_poll);
  caf::actor_system system{actor_cfg};
  auto core = assigned_shard(j, name);
  if (!core) {
    j.bridge->send(j.coordinator, encode(Failure{static_cast<std::int32_t>(core.status().code()),
                                                 name + ": " + core.status().message()},
                                         j.bridge->next_id()));
    j.bridge->stop();
    return core.status();
  }
  j.bridge->set_max_unanswered(shard_max_unanswered(a.workers));
  // Before the first heartbeat, after which the coordinator and workers
  // connect: the largest part a peer may now send is a push of its keys.
  if (Status s = j.bridge->set_bound_limits(largest_part(a.range_end - a.range_begin),
                                            max_connections(std::size_t{a.workers} + 1));
      !s.ok()) {
    j.bridge->send(j.coordinator,
                   encode(Failure{static_cast<std::int32_t>(s.code()), name + ": " + s.message()}, j.bridge->next_id()));
    j.bridge->stop();
    return s;
  }
  // What the bounds allow: every unanswered request, and per peer (the
  // workers and the coordinator) ZeroMQ's receive queue and the push
  // being received.
  reserve_push_buffers((a.range_end - a.range_begin) * sizeof(float) + kHeaderBytes + 256,
                       shard_max_unanswered(a.workers) + (std::size_t{a.workers} + 1) * (kShardReceiveQueue + 2));
  auto shard = system.spawn(parameter_shard, std::make_shared<ShardCore>(std::move(core).value()));
  ShardServer serving(system, j.bridge, shard);
  server->store(&serving);
  logger().info("{}: keys [{}, {}) for {} workers, serving at {}", name, a.range_begin, a.range_end, a.workers,
               j.bridge->endpoint());
  Status s = serve_until_shutdown(j, name, stop, [](Inbound&) { return Status{}; });
  server->store(nullptr);
  j.bridge->stop();
  const auto st = j.bridge->stats();
  if (st.rejected > 0) logger().warn("{}: dropped {} malformed frames", name, st.rejected);
  log_refused(name, st);
  logger().info("{}: at most {} requests were unanswered at once (limit {}); reading stopped at the limit {} times",
               name, st.unanswered_peak, shard_max_unanswered(a.workers), st.read_pauses);
  caf::anon_send_exit(serving.actor(), caf::exit_reason::user_shutdown);
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  return s;
}

namespace {

// Tells the coordinator when the worker `watched` has finished (a failure
// it reports itself).
caf::behavior finish_watcher(caf::event_based_actor* self, std::shared_ptr<Bridge> bridge, PeerId coordinator,
                             std::uint32_t index, caf::actor watched) {
  self->monitor(watched);
  self->set_down_handler([self, bridge, coordinator, index](caf::down_msg& dm) {
    if (dm.reason == caf::exit_reason::normal)
      bridge->send(coordinator, encode(ClockNotice{index, 0, true}, bridge->next_id()));
    self->quit();
  });
  return {[](int) {}};
}

// Shard r.index's process was restarted at r.endpoint: this process's
// connection `peer` goes there, sending again what it had not answered.
void reconnect_shard(Bridge& bridge, const std::string& name, const PeerId& peer, const Restarted& r) {
  auto resent = bridge.reconnect(peer, r.endpoint);
  if (resent) {
    logger().info("{}: shard {} was restarted, now at {}; sent {} unanswered request(s) again", name, r.index,
                 r.endpoint, *resent);
  } else {
    logger().error("{}: reconnecting to shard {} at {}: {}", name, r.index, r.endpoint, resent.status().message());
  }
}

}  // namespace

namespace {

// --worker-weights auto: measures how many samples a second this worker
// computes on its device (a batch of its data, as a worker of one process
// does), tells the coordinator, and waits for the assignment to train by,
// whose share follows from every worker's rate.
Status calibrate_and_wait(Joined& j, const JobPlan& plan, const data::DatasetSplits& data, const std::string& device,
                          std::stop_token stop) {
  const std::uint32_t index = j.assignment.index;
  auto measured = measure_step_cost(plan, data, device, index);
  if (!measured) return measured.status();
  const StepCost cost = *measured;
  j.bridge->send(j.coordinator, encode(Calibration{index, cost.fixed_s, cost.per_sample_s}, j.bridge->next_id()));
  const auto deadline = SteadyClock::now() + millis(j.config.rpc_timeout_s * (j.config.workers + 1));
  while (SteadyClock::now() < deadline) {
    if (stop.stop_requested()) return Status::Cancelled("worker " + std::to_string(index) + ": stopped while calibrating");
    auto in = j.inbox->pop(std::chrono::milliseconds(100));
    if (!in) continue;
    if (auto* s = std::get_if<Shutdown>(&in->body))
      return Status::Cancelled("worker " + std::to_string(index) + ": the coordinator said stop: " + s->reason);
    if (auto* a = std::get_if<Assignment>(&in->body); a && a->role == Role::worker && !a->calibrate) {
      j.assignment = std::move(*a);
      return {};
    }
  }
  return Status::Timeout("worker " + std::to_string(index) +
                         ": no assignment from the coordinator after calibrating (it waits for every worker's rate)");
}

struct WorkerPlans {
  JobPlan job;
  WorkerPlan worker;
};

// The coordinator's plan as assigned: this worker's share and the
// schedule's length; the rest planned from the same settings by the same
// rules (its --straggler model too), its threads from this host's cores.
// Under --worker-weights auto it calibrates first and takes the assignment
// that follows.
Result<WorkerPlans> plan_assigned_worker(Joined& j, const data::DatasetSplits& data, const std::string& device,
                                         std::stop_token stop) {
  const Assignment& a = j.assignment;
  const JobConfig& cfg = j.config;
  const unsigned cpus = usable_cpus();
  auto plan = plan_settings(cfg, Placement::processes, cpus);
  if (!plan) return plan.status();
  // Its CPUs are shared by the job's workers that run on them, not by all.
  const unsigned sharers = std::max(1u, a.cpu_sharers);
  plan->compute_threads = compute_threads(cfg, cpus, sharers);
  if (cfg.threads > 0) {
    logger().info("worker {}: {} compute thread(s) (--threads)", a.index, plan->compute_threads);
    // As asgd train warns: the cluster ran 7.6x slower without a word.
    if (plan->compute_threads > 1 && sharers * plan->compute_threads > cpus)
      logger().warn("worker {}: {} worker process(es) x {} compute threads on {} usable CPU(s): each layer waits for "
                    "threads the others keep off the CPUs (--threads 0 gives each worker its share)",
                    a.index, sharers, plan->compute_threads, cpus);
  } else {
    logger().info("worker {}: {} compute thread(s): {} usable CPU(s), shared by {} worker process(es) of this job",
                  a.index, plan->compute_threads, cpus, sharers);
  }
  // OpenBLAS's buffers before any model (the calibration's first).
  if (Status s = blas::reserve_buffers(plan->compute_threads); !s.ok()) return s;
  const auto& train = data.train;
  // Files that differ from the coordinator's (another dataset under the
  // same name, another version) trained on without a word: test accuracy 0.08.
  if (const std::uint32_t ours = a.train_fingerprint != 0 ? train.fingerprint() : 0; ours != a.train_fingerprint)
    return Status::InvalidArgument(fmt::format(
        "worker {} on {}: its training data ({} samples from {}) is not the coordinator's (checksum {:08x} here, "
        "{:08x} there): another dataset or other files; give every host the same files",
        a.index, host_name(), train.count, resolve_data_dir(cfg), ours, a.train_fingerprint));
  plan->sample_shape = {train.channels, train.rows, train.cols};
  plan->classes = data.num_classes;
  if (a.calibrate)
    if (Status s = calibrate_and_wait(j, *plan, data, device, stop); !s.ok()) return s;
  if (Status s = assignment_fits(a, train.count, cfg.epochs); !s.ok()) return s;
  plan_clocks(*plan, a.schedule_steps);
  auto stragglers = parse_stragglers(cfg.straggler, cfg.workers, cfg.seed);
  if (!stragglers || a.index >= stragglers->size())
    return stragglers ? Status::Internal("assigned a worker index past the job's workers") : stragglers.status();
  WorkerPlan worker_plan =
      plan_worker(a.index, {{a.partition_begin, a.partition_end}, a.batch}, (*stragglers)[a.index], a.first_epoch);
  worker_plan.device = device;
  return WorkerPlans{std::move(plan).value(), std::move(worker_plan)};
}

// A worker process's collective, listening where --listen says; its
// all-reduce goes through shared memory when every worker runs on this host
// and --shared-memory is on.
// The one the options give (a test's), or a new one.
Result<std::shared_ptr<NetworkCollective>> make_worker_collective(const ProcessOptions& o) {
  if (o.collective) return o.collective;
  auto made = make_zmq_collective(collective_listen(o.listen), o.curve, "worker collective");
  if (made) (*made)->set_shared_memory(o.shared_memory);
  return made;
}

}  // namespace

Status run_worker_process(const ProcessOptions& o, std::stop_token stop) {
  // Its collective listens before it registers, so that the coordinator can
  // tell every worker where the others are (the decentralized policies).
  auto made = make_worker_collective(o);
  if (!made) return made.status();
  const std::shared_ptr<NetworkCollective> collective = *made;
  auto joined = join(o, Role::worker, "worker", false, nullptr, stop, collective->endpoint());
  if (!joined) return joined.status();
  Joined& j = *joined;
  const Assignment& a = j.assignment;
  const JobConfig& cfg = j.config;
  const std::string name = "worker " + std::to_string(a.index);
  auto fail_early = [&](const Status& s) {
    tell_coordinator(j, Status::WithCode(s.code(), name + ": " + s.message()));
    j.bridge->stop(std::chrono::seconds(2));
    return s;
  };
  if (a.range_bounds.size() != a.shard_endpoints.size() + 1 || a.shard_endpoints.empty())
    return fail_early(Status::Internal("the assignment's shard ranges do not match its shards"));
  auto device = device_of_worker(cfg, a.index);
  if (!device) return fail_early(device.status());

  auto loaded =
      data::load_dataset(cfg.dataset, resolve_data_dir(cfg), cfg.validation_size, cfg.seed, resolve_image_cache());
  if (!loaded) return fail_early(loaded.status());
  auto data = std::make_shared<const data::DatasetSplits>(std::move(loaded).value());
  auto plans = plan_assigned_worker(j, *data, *device, stop);
  if (!plans) return fail_early(plans.status());
  JobPlan* plan = &plans->job;
  const WorkerPlan& worker_plan = plans->worker;
  const auto compute = std::make_shared<ComputeContext>(plan->compute_threads);

  auto actor_cfg = actor_config(1, o.busy_poll);
  caf::actor_system system{actor_cfg};
  std::vector<caf::actor> shards;
  std::vector<PeerId> shard_peers;
  for (std::size_t i = 0; i < a.shard_endpoints.size(); ++i) {
    auto peer = j.bridge->connect(a.shard_endpoints[i]);
    if (!peer) return fail_early(peer.status());
    shard_peers.push_back(*peer);
    shards.push_back(system.spawn(remote_shard, j.bridge, *peer, static_cast<std::uint32_t>(i)));
    plan->ranges.push_back({a.range_bounds[i], a.range_bounds[i + 1]});
  }
  auto feeder = system.spawn<caf::detached>(data_feeder, feeder_setup(*plan, worker_plan, data, a.first_epoch));
  // A worker process that rejoins a running job starts at an epoch's first
  // step (plan_worker).
  WorkerSetup ws = worker_setup(*plan, worker_plan);
  ws.compute = compute;
  ws.shards = shards;
  ws.feeder = feeder;
  ws.coordinator = system.spawn(remote_coordinator, j.bridge, j.coordinator);
  if (plan->exchange != Exchange::none) {
    if (Status s = connect_collective(*collective, a, name, cfg, plan->exchange); !s.ok()) return fail_early(s);
    ws.collective = collective;
  }
  auto worker_actor = system.spawn(worker, std::move(ws));
  // Held here: CAF ends an actor nobody refers to.
  caf::actor watcher = system.spawn(finish_watcher, j.bridge, j.coordinator, a.index, worker_actor);
  log_share(name, a, shards.size());
  j.bridge->send(j.coordinator, encode(WorkerReady{a.index}, j.bridge->next_id()));  // the clock starts once all are
  Status s = serve_until_shutdown(j, name, stop, [&](Inbound& in) {
    if (std::holds_alternative<StartTraining>(in.body)) caf::anon_send(worker_actor, start_atom::value);
    if (std::holds_alternative<StopTraining>(in.body)) caf::anon_send(feeder, stop_atom::value);
    if (auto* r = std::get_if<Restarted>(&in.body); r && r->role == Role::shard && r->index < shard_peers.size())
      reconnect_shard(*j.bridge, name, shard_peers[r->index], *r);
    // allreduce, gossip: a lost worker's part of the exchange is not waited for.
    if (auto* c = std::get_if<ClockNotice>(&in.body); c && c->leaving && plan->exchange != Exchange::none)
      collective->leave(c->worker);
    return Status{};
  });
  // Interrupted (Ctrl-C, a TERM): it says so on its way out, so that the
  // coordinator drops it at once, not a --heartbeat-timeout later while
  // the others wait for it (an all-reduce's peers, a bsp clock).
  if (s.code() == StatusCode::cancelled && stop.stop_requested()) tell_coordinator(j, s);
  j.bridge->stop();
  log_collective_drops(name, *collective);
  for (auto& x : shards) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  for (const caf::actor& x : {worker_actor, feeder, watcher}) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  return s;
}

}  // namespace asgd
