#include "runtime/cluster.hpp"

#include <spdlog/fmt/fmt.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
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
#include "actors/data_feeder.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/worker.hpp"
#include "dataset/dataset.hpp"
#include "messaging/bridge.hpp"
#include "actors/checkpoint.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"

namespace asgd {

namespace {

using namespace messaging;
using SteadyClock = std::chrono::steady_clock;
using alive_atom = caf::atom_constant<caf::atom("alive")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

constexpr auto kHeartbeatEvery = std::chrono::seconds(1);
// A process that registers for a shard's slot during the job takes it only
// once the process there has missed this many seconds of heartbeats.
constexpr auto kPresumedDead = std::chrono::milliseconds(2500);

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

// Connections the coordinator's or a shard's endpoint accepts at once
// (docs/cluster.md, "Queues and their bounds"): each of the job's `peers`
// twice (a restarted process may connect before its old connection is seen
// gone), and a few more.
std::size_t max_connections(std::size_t peers) { return 2 * peers + 16; }

// Logs, when a process ends, what its endpoint refused (each refusal was
// logged when it happened, a few lines a minute at most).
void log_refused(const std::string& name, const BridgeStats& st) {
  if (st.refused == 0) return;
  spdlog::warn("{}: refused {} connections to its endpoint ({} over its limit of connections at once, {} in the "
               "--auth-keys handshake)",
               name, st.refused, st.refused_over_limit, st.auth_rejected);
}

// A shard process's memory is mostly push buffers (a push is the size of
// its key range; ZeroMQ's I/O thread allocates each, and frees it once the
// reply written over it has been sent), and the bounds above cap how many
// are alive at once. Left to itself, glibc hands freed buffers back to the
// kernel and faults them in again for the next burst, and gives each thread
// its own heap: under overload, resident memory climbs in steps, to the
// level the bounds allow, whenever a burst fills every queue further than
// before, which may take minutes. Instead the process takes that memory
// when it is assigned its keys and keeps it: one heap for every thread,
// buffers up to 32 MiB from it, never trimmed, grown at once to what the
// bounds allow (up to 1 GiB; beyond, it grows as the queues fill, to the
// same bound). Process-wide settings: a shard process is a process of its
// own.
constexpr int kHeapBuffersUpTo = 32 << 20;
constexpr std::size_t kMaxReserve = std::size_t{1} << 30;

void configure_shard_allocator() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, kHeapBuffersUpTo);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

void reserve_push_buffers(std::size_t push_bytes, std::size_t buffers) {
  if (push_bytes == 0 || push_bytes > kHeapBuffersUpTo || buffers * push_bytes > kMaxReserve) return;
  std::vector<void*> blocks(buffers, nullptr);
  for (void*& b : blocks) {
    b = std::malloc(push_bytes);
    if (b == nullptr) break;
    for (std::size_t i = 0; i < push_bytes; i += 4096) static_cast<volatile char*>(b)[i] = 0;  // resident now
  }
  for (void* b : blocks) std::free(b);
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

TensorCoding coding_of(const JobConfig& c) {
  return c.compress == "fp16" ? TensorCoding::float16 : TensorCoding::float32;
}

/// A thread-safe queue the bridge's handler fills and a main thread drains.
template <class T>
class Inbox {
 public:
  void push(T x) {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(x));
    }
    cv_.notify_one();
  }
  std::optional<T> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
    T x = std::move(items_.front());
    items_.pop_front();
    return x;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;
};

caf::actor_system_config actor_config(std::size_t threads) {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::asgd>();
  cfg.set("scheduler.max-threads", std::max<std::size_t>(1, threads));
  return cfg;
}

// ---------------------------------------------------------------------------
// The coordinator process.

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
        self->send(coordinator, a, code, std::move(what));
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

// Where the coordinator process's bridge hands what it receives.
struct CoordinatorRouter {
  std::mutex mu;
  std::weak_ptr<Bridge> bridge;  // weak: the bridge's handler holds this router
  caf::actor coordinator;
  std::map<PeerId, caf::actor> workers;                 // worker process -> its remote_worker
  std::map<PeerId, std::promise<void>> shard_ready;     // shard process -> its first heartbeat
  std::map<PeerId, SteadyClock::time_point> heard;  // shard or worker process -> its last heartbeat
  Inbox<Inbound> registrations;

  void operator()(Inbound&& in) {
    std::unique_lock lock(mu);
    std::visit(
        [&](auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, Registration>) {
            lock.unlock();
            registrations.push(std::move(in));
          } else if constexpr (std::is_same_v<T, EpochReport> || std::is_same_v<T, WorkerProgress>) {
            if (coordinator) caf::anon_send(coordinator, std::move(m));
          } else if constexpr (std::is_same_v<T, Failure>) {
            if (auto w = workers.find(in.peer); w != workers.end()) {
              caf::anon_send(w->second, failed_atom::value, m.code, m.what);
            } else if (coordinator) {
              caf::anon_send(coordinator, failed_atom::value, m.code, m.what);
            }
          } else if constexpr (std::is_same_v<T, Heartbeat>) {
            if (auto w = workers.find(in.peer); w != workers.end()) caf::anon_send(w->second, alive_atom::value);
            if (auto s = shard_ready.find(in.peer); s != shard_ready.end()) {
              s->second.set_value();
              shard_ready.erase(s);
            }
            heard[in.peer] = SteadyClock::now();
            // Echo it: the process learns the coordinator is alive.
            if (auto b = bridge.lock()) b->send(in.peer, encode(Heartbeat{Role::coordinator, 0, m.sequence}, in.request_id));
          } else if constexpr (std::is_same_v<T, ClockNotice>) {
            if (auto w = workers.find(in.peer); w != workers.end() && m.leaving) caf::anon_send(w->second, done_atom::value);
          }
        },
        in.body);
  }

  // Before the job's actor system goes: nothing may be sent to its actors.
  void detach() {
    std::lock_guard lock(mu);
    coordinator = nullptr;
    workers.clear();
  }
};

struct Member {
  PeerId peer;
  Registration reg;
};

class ClusterPlacement final : public RemotePlacement {
 public:
  ClusterPlacement(std::shared_ptr<Bridge> bridge, std::shared_ptr<CoordinatorRouter> router, JobConfig config,
                   std::vector<Member> shards, std::vector<Member> workers, double join_timeout_s)
      : bridge_(std::move(bridge)),
        router_(std::move(router)),
        config_(std::move(config)),
        config_text_(to_toml(config_)),
        shards_(std::move(shards)),
        workers_(std::move(workers)),
        join_timeout_s_(join_timeout_s) {
    bounds_.assign(shards_.size() + 1, 0);
  }

  Result<caf::actor> place_shard(caf::local_actor* self, const ShardSetup& setup) override {
    const Member m = member(shards_, setup.index);
    Assignment a;
    a.role = Role::shard;
    a.index = setup.index;
    a.config = config_text_;
    a.workers = setup.workers;
    a.range_begin = setup.range.begin;
    a.range_end = setup.range.end;
    a.schedule_steps = setup.schedule.total_steps;
    if (Status s = assign_shard(m, a, setup.initial); !s.ok()) return s;
    auto peer = bridge_->connect(m.reg.endpoint);
    if (!peer) return peer.status();
    bounds_[setup.index] = setup.range.begin;
    bounds_[setup.index + 1] = setup.range.end;
    {
      std::lock_guard lock(mu_);
      placed_.resize(shards_.size());
      placed_[setup.index] = Placed{std::move(a), setup.initial, *peer};
    }
    return self->spawn(remote_shard, bridge_, *peer, setup.index);
  }

  void dismiss_worker(std::uint32_t w, const std::string& why) override {
    bridge_->send(member(workers_, w).peer, encode(Shutdown{why}, bridge_->next_id()));
  }

  /// Worker `w`'s new process, registered in place of a dead one: the
  /// coordinator then places and starts it (place_worker, start_worker) or
  /// dismisses it.
  void replace_worker(std::uint32_t w, const Member& m) {
    std::lock_guard lock(mu_);
    workers_.at(w) = m;
  }

  /// A shard process that registered for slot `index` after that shard's
  /// process died: assigns it the shard to reload from its checkpoint,
  /// points this process's connection at it, and tells every worker
  /// process to do the same (they send again what the dead one had not
  /// answered). Errors: timeout when it does not take the assignment.
  Status restart_shard(std::uint32_t index, const Member& m) {
    Placed p;
    {
      std::lock_guard lock(mu_);
      if (index >= placed_.size() || placed_[index].link.empty())
        return Status::Internal("shard " + std::to_string(index) + " was never placed");
      p = placed_[index];
    }
    p.assignment.restore = true;
    if (Status s = assign_shard(m, p.assignment, p.initial); !s.ok()) return s;
    auto resent = bridge_->reconnect(p.link, m.reg.endpoint);
    if (!resent) return resent.status();
    if (*resent > 0) spdlog::info("coordinator: sent {} unanswered request(s) to shard {} again", *resent, index);
    std::vector<Member> workers;
    {
      std::lock_guard lock(mu_);
      shards_.at(index) = m;
      workers = workers_;
    }
    for (const Member& w : workers)
      bridge_->send(w.peer, encode(Restarted{Role::shard, index, m.reg.endpoint}, bridge_->next_id()));
    return {};
  }

  Result<caf::actor> place_worker(caf::local_actor* self, std::uint32_t w) override {
    const auto silence = std::chrono::duration_cast<caf::timespan>(
        std::chrono::duration<double>(config_.heartbeat_timeout_s));
    const auto startup = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(join_timeout_s_));
    auto proxy = self->spawn(remote_worker, silence, startup, caf::actor_cast<caf::actor>(self));
    const PeerId peer = member(workers_, w).peer;
    std::lock_guard lock(router_->mu);
    router_->workers[peer] = proxy;
    return proxy;
  }

  void start_worker(const JobPlan& plan, std::uint32_t w, std::uint32_t first_epoch) override {
    const WorkerPlan& worker = plan.workers.at(w);
    Assignment a;
    a.role = Role::worker;
    a.index = w;
    a.config = config_text_;
    a.workers = static_cast<std::uint32_t>(workers_.size());
    a.partition_begin = worker.share.partition.begin;
    a.partition_end = worker.share.partition.end;
    a.batch = worker.share.batch;
    a.straggler = worker.straggler;
    a.schedule_steps = plan.planned_clocks;
    a.first_epoch = first_epoch;
    PeerId peer;
    {
      std::lock_guard lock(mu_);
      for (const Member& s : shards_) a.shard_endpoints.push_back(s.reg.endpoint);
      peer = workers_.at(w).peer;
    }
    a.range_bounds = bounds_;
    bridge_->send(peer, encode(a, bridge_->next_id()));
    bridge_->send(peer, encode(StartTraining{}, bridge_->next_id()));
  }

 private:
  Member member(const std::vector<Member>& group, std::uint32_t i) {
    std::lock_guard lock(mu_);
    return group.at(i);
  }

  // Sends `a` (with `initial` as its tensor) to the shard process `m` and
  // waits for its first heartbeat, which it sends once it serves.
  Status assign_shard(const Member& m, const Assignment& a, const std::vector<float>& initial) {
    std::future<void> ready;
    {
      std::lock_guard lock(router_->mu);
      ready = router_->shard_ready[m.peer].get_future();
    }
    bridge_->send(m.peer, encode(a, bridge_->next_id(), initial, bridge_->coding()));
    if (ready.wait_for(millis(join_timeout_s_)) != std::future_status::ready)
      return Status::Timeout(fmt::format("shard process {} (pid {} on {}) did not take its assignment within {:g} s",
                                         a.index, m.reg.pid, m.reg.host, join_timeout_s_));
    return {};
  }

  struct Placed {
    Assignment assignment;
    std::vector<float> initial;  // its initial parameters, for a restart before any checkpoint
    PeerId link;                 // this process's connection to it
  };

  std::shared_ptr<Bridge> bridge_;
  std::shared_ptr<CoordinatorRouter> router_;
  JobConfig config_;
  std::string config_text_;
  std::mutex mu_;  // guards shards_, workers_ and placed_ (restarts come from another thread)
  std::vector<Member> shards_;
  std::vector<Member> workers_;
  std::vector<Placed> placed_;
  std::vector<std::uint64_t> bounds_;
  double join_timeout_s_;
};

// ---------------------------------------------------------------------------
// Shard and worker processes.

// Stands for the coordinator inside a worker process. Each epoch the
// worker finishes is also logged here: on its own host, a worker's log
// says how far it got, whatever the coordinator makes of it.
caf::behavior remote_coordinator(caf::event_based_actor* self, std::shared_ptr<Bridge> bridge, PeerId peer) {
  (void)self;
  return {
      [bridge, peer](EpochReport& r) {
        const std::uint64_t kept = r.samples - r.dropped_samples;
        spdlog::info("worker {}: finished epoch {}: {} samples, {} updates, loss {:.4f}", r.worker, r.epoch + 1,
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

Result<Joined> join(const ProcessOptions& o, Role role, const std::string& name, bool listen,
                    std::function<bool(Inbound&)> fast_path, std::stop_token stop) {
  if (o.coordinator.empty()) return Status::InvalidArgument("--coordinator: the coordinator's endpoint is required");
  Joined j;
  j.inbox = std::make_shared<Inbox<Inbound>>();
  BridgeOptions bo;
  bo.listen = listen ? o.listen : "";
  bo.name = name;
  bo.curve = o.curve;
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
  j.bridge->send(j.coordinator, encode(Registration{role, o.index, j.bridge->endpoint(), host_name(),
                                                    static_cast<std::uint32_t>(getpid())},
                                       j.bridge->next_id()));
  const auto deadline = SteadyClock::now() + millis(o.join_timeout_s);
  while (true) {
    if (stop.stop_requested()) return Status::Cancelled(name + ": stopped before it was assigned a part");
    if (SteadyClock::now() > deadline)
      return Status::Timeout(fmt::format(
          "{}: no assignment from the coordinator at {} within {:g} s (--join-timeout){}", name, o.coordinator,
          o.join_timeout_s,
          o.curve ? "; with --auth-keys, check that the coordinator's folder has this process's .pub and that the "
                    "coordinator's key is right"
                  : ""));
    auto in = j.inbox->pop(std::chrono::milliseconds(100));
    if (!in) continue;
    if (auto* s = std::get_if<Shutdown>(&in->body))
      return Status::Cancelled(name + ": the coordinator said stop before assigning a part: " + s->reason);
    if (auto* a = std::get_if<Assignment>(&in->body)) {
      if (a->role != role) return Status::Internal(name + ": assigned a different role");
      j.assignment = std::move(*a);
      j.tensor = std::move(in->tensor);
      break;
    }
  }
  if (Status s = apply_toml_text(j.assignment.config, "from the coordinator", j.config); !s.ok()) return s;
  if (!o.data_dir.empty()) j.config.data_dir = o.data_dir;
  j.bridge->set_coding(coding_of(j.config));
  return j;
}

// Runs until the coordinator says stop (or goes silent): heartbeats each
// second. `on_message` sees everything else that arrives.
Status serve_until_shutdown(Joined& j, const std::string& name, std::stop_token stop,
                            const std::function<Status(Inbound&)>& on_message) {
  const auto silence = millis(std::max(j.config.rpc_timeout_s, 3.0));
  auto last_heard = SteadyClock::now();
  auto next_beat = SteadyClock::now();
  std::uint64_t beat = 0;
  while (!stop.stop_requested()) {
    const auto now = SteadyClock::now();
    if (now >= next_beat) {
      j.bridge->send(j.coordinator, encode(Heartbeat{j.assignment.role, j.assignment.index, ++beat}, j.bridge->next_id()));
      next_beat = now + kHeartbeatEvery;
    }
    if (now - last_heard > silence)
      return Status::Timeout(fmt::format("{}: the coordinator sent nothing for {:g} s; giving up", name,
                                         std::chrono::duration<double>(silence).count()));
    auto in = j.inbox->pop(std::chrono::milliseconds(100));
    if (!in) continue;
    last_heard = SteadyClock::now();
    if (std::holds_alternative<Shutdown>(in->body)) return {};
    if (Status s = on_message(*in); !s.ok()) return s;
  }
  // Told to stop (SIGINT, SIGTERM): a clean end for a shard or worker.
  spdlog::info("{}: stopped", name);
  return {};
}

}  // namespace

Status validate_for_cluster(const JobConfig& c) {
  if (Status s = validate(c); !s.ok()) return s;
  auto settings = plan_settings(c, Placement::processes, 1);
  if (settings && settings->shares_parameters)
    return Status::InvalidArgument("--policy " + c.policy +
                                   ": workers in separate processes cannot share one parameter buffer; use "
                                   "asgd train for hogwild");
  if (c.worker_weights == "auto")
    return Status::InvalidArgument("--worker-weights auto: calibration runs in one process only; give the weights");
  if (c.model_spec)
    return Status::InvalidArgument("model_spec '" + c.model_spec->name() +
                                   "': a model built from code is not carried across processes; use a model name "
                                   "(--model) with asgd cluster, or run_job in one process");
  return {};
}

Result<JobSummary> run_coordinator_process(const JobConfig& config, const ProcessOptions& o,
                                           const JobCallbacks& callbacks, std::stop_token stop,
                                           const std::function<void(const std::string&)>& on_listening) {
  if (Status s = validate_for_cluster(config); !s.ok()) return s;
  if (o.shards != config.shards || o.workers != config.workers)
    return Status::InvalidArgument("the coordinator expects --shards and --workers processes as the job says");
  auto router = std::make_shared<CoordinatorRouter>();
  BridgeOptions bo;
  bo.listen = o.listen;
  bo.coding = coding_of(config);
  bo.name = "coordinator";
  bo.curve = o.curve;
  bo.limits.bound_max_part_bytes = largest_part(0);  // its endpoint is sent no tensors
  bo.limits.bound_max_connections = max_connections(std::size_t{config.workers} + config.shards);
  auto started = Bridge::start(bo, [router](Inbound&& in) { (*router)(std::move(in)); });
  if (!started) return started.status();
  std::shared_ptr<Bridge> bridge = *started;
  {
    std::lock_guard lock(router->mu);
    router->bridge = bridge;
  }
  if (on_listening) on_listening(bridge->endpoint());
  spdlog::info("coordinator listening on {}: waiting for {} shard and {} worker processes", bridge->endpoint(),
               config.shards, config.workers);

  // Slots by index: a process may ask for one (--index), else gets the
  // first free.
  std::vector<std::optional<Member>> shard_slots(config.shards), worker_slots(config.workers);
  std::vector<Member> shards, workers;
  auto members = [](const std::vector<std::optional<Member>>& slots) {
    std::vector<Member> out;
    for (const auto& m : slots)
      if (m) out.push_back(*m);
    return out;
  };
  std::mutex slots_mu;  // the slots change during the job when a shard process is restarted
  auto say_stop = [&](const std::string& why) {
    {
      std::lock_guard lock(slots_mu);
      for (const auto* group : {&shard_slots, &worker_slots})
        for (const auto& m : *group)
          if (m) bridge->send(m->peer, encode(Shutdown{why}, bridge->next_id()));
    }
    bridge->stop(std::chrono::seconds(2));
  };
  auto filled = [](const std::vector<std::optional<Member>>& slots) {
    return static_cast<std::size_t>(std::count_if(slots.begin(), slots.end(), [](const auto& m) { return m.has_value(); }));
  };
  const auto deadline = SteadyClock::now() + millis(o.join_timeout_s);
  while (filled(shard_slots) < config.shards || filled(worker_slots) < config.workers) {
    if (stop.stop_requested()) {
      say_stop("cancelled");
      return Status::Cancelled("the job was cancelled while processes registered");
    }
    if (SteadyClock::now() > deadline) {
      say_stop("the job did not start");
      return Status::Timeout(fmt::format(
          "{} of {} shard and {} of {} worker processes registered within {:g} s (--join-timeout)",
          filled(shard_slots), config.shards, filled(worker_slots), config.workers, o.join_timeout_s));
    }
    auto in = router->registrations.pop(std::chrono::milliseconds(100));
    if (!in) continue;
    auto& reg = std::get<Registration>(in->body);
    if (reg.role == Role::coordinator) {
      bridge->send(in->peer, encode(Shutdown{"a coordinator cannot join a job"}, bridge->next_id()));
      continue;
    }
    auto& slots = reg.role == Role::shard ? shard_slots : worker_slots;
    std::size_t slot = reg.index < slots.size() && !slots[reg.index] ? reg.index : slots.size();
    for (std::size_t i = 0; slot == slots.size() && i < slots.size(); ++i)
      if (!slots[i]) slot = i;
    if (slot == slots.size()) {
      bridge->send(in->peer, encode(Shutdown{"the job needs no more of these"}, bridge->next_id()));
      continue;
    }
    if (reg.role == Role::shard && reg.endpoint.empty()) {
      bridge->send(in->peer, encode(Shutdown{"a shard must give its endpoint"}, bridge->next_id()));
      continue;
    }
    spdlog::info("{} {} registered: pid {} on {}{}", reg.role == Role::shard ? "shard" : "worker", slot, reg.pid,
                 reg.host, reg.endpoint.empty() ? "" : ", at " + reg.endpoint);
    slots[slot] = Member{in->peer, reg};
  }
  shards = members(shard_slots);
  workers = members(worker_slots);

  std::mutex placement_mu;
  std::shared_ptr<ClusterPlacement> placement;  // once the job has placed its actors
  ClusterHooks hooks;
  hooks.make_placement = [&](caf::actor_system&) -> Result<std::shared_ptr<RemotePlacement>> {
    auto p = std::make_shared<ClusterPlacement>(bridge, router, config, shards, workers, o.join_timeout_s);
    std::lock_guard lock(placement_mu);
    placement = p;
    return std::shared_ptr<RemotePlacement>(p);
  };
  hooks.on_coordinator = [&](caf::actor c) {
    std::lock_guard lock(router->mu);
    router->coordinator = std::move(c);
  };

  // Membership during the job: a shard process that goes silent, and one
  // that registers to take a dead one's place.
  const bool restartable = !config.checkpoint_dir.empty() && config.checkpoint_every_s > 0;
  auto tell_coordinator = [&](auto... message) {
    std::lock_guard lock(router->mu);
    if (router->coordinator) caf::anon_send(router->coordinator, message...);
  };
  auto last_heard = [&](const PeerId& peer) -> std::optional<SteadyClock::time_point> {
    std::lock_guard lock(router->mu);
    if (auto h = router->heard.find(peer); h != router->heard.end()) return h->second;
    return std::nullopt;
  };
  // Processes the supervisor saw end (by pid): their slots are free at once.
  // The membership thread alone reads the supervisor's notices.
  std::set<std::uint32_t> ended;
  auto take_exits = [&] {
    while (auto exit = o.supervision ? o.supervision->next() : std::nullopt) {
      ended.insert(exit->pid);
      if (!exit->shard) {
        // Lost now, restarted or not (a new process rejoins as usual);
        // unless a new process has already taken its place.
        bool current = false;
        {
          std::lock_guard lock(slots_mu);
          const auto& slot = worker_slots[exit->index];
          current = slot && slot->reg.pid == exit->pid;
        }
        if (current) tell_coordinator(lost_atom::value, exit->index, exit->what);
      } else if (!exit->restarting) {
        tell_coordinator(failed_atom::value, static_cast<std::int32_t>(StatusCode::internal),
                         exit->what + "; the job stops");
      } else {
        spdlog::warn("{}; its supervisor starts it again", exit->what);
      }
    }
  };
  // A process that registers for a slot during the job takes the place of
  // a dead one only: the old process must have missed a few heartbeats, or
  // its supervisor said it ended. False, with the newcomer told why, when
  // the old one still beats after --heartbeat-timeout.
  auto old_is_dead = [&](const Inbound& in, const Registration& reg, const Member& old) {
    const std::string what = (reg.role == Role::shard ? "shard " : "worker ") + std::to_string(reg.index);
    const auto limit = SteadyClock::now() + millis(config.heartbeat_timeout_s);
    while (true) {
      take_exits();  // the supervisor may be saying so right now
      if (ended.count(old.reg.pid) > 0) return true;
      const auto heard = last_heard(old.peer);
      if (!heard || SteadyClock::now() - *heard > kPresumedDead) return true;
      if (SteadyClock::now() > limit) {
        spdlog::warn("{} registered again (pid {} on {}), but its process pid {} still sends heartbeats: refused",
                     what, reg.pid, reg.host, old.reg.pid);
        bridge->send(in.peer, encode(Shutdown{what + " is alive (pid " + std::to_string(old.reg.pid) + " on " +
                                              old.reg.host + "); a second process for it is refused"},
                                     bridge->next_id()));
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  auto current_placement = [&] {
    std::lock_guard lock(placement_mu);
    return placement;
  };
  auto rejoin = [&](const Inbound& in, const Registration& reg) {
    std::optional<Member> old;
    {
      std::lock_guard lock(slots_mu);
      old = worker_slots[reg.index];
    }
    auto p = current_placement();
    if (!p || !old) {
      bridge->send(in.peer, encode(Shutdown{"the job is not placed yet; try again"}, bridge->next_id()));
      return;
    }
    if (!old_is_dead(in, reg, *old)) return;
    spdlog::warn("worker {} registered again: pid {} on {}; it takes the place of pid {}", reg.index, reg.pid,
                 reg.host, old->reg.pid);
    const Member fresh{in.peer, reg};
    p->replace_worker(reg.index, fresh);
    {
      std::lock_guard lock(slots_mu);
      worker_slots[reg.index] = fresh;
    }
    tell_coordinator(rejoin_atom::value, reg.index);
  };
  auto restart = [&](const Inbound& in, const Registration& reg) {
    const std::uint32_t index = reg.index;
    auto p = current_placement();
    std::optional<Member> old;
    {
      std::lock_guard lock(slots_mu);
      old = shard_slots[index];
    }
    if (!p || !old) {
      bridge->send(in.peer, encode(Shutdown{"the job is not placed yet; try again"}, bridge->next_id()));
      return;
    }
    if (!restartable) {
      bridge->send(in.peer, encode(Shutdown{"shard " + std::to_string(index) +
                                            " cannot be restarted: the job writes no checkpoints "
                                            "(--checkpoint-dir, --checkpoint-every)"},
                                   bridge->next_id()));
      return;
    }
    if (!old_is_dead(in, reg, *old)) return;
    spdlog::warn("shard {} registered again: pid {} on {}, at {}; it takes the place of pid {} and reloads its "
                 "checkpoint", index, reg.pid, reg.host, reg.endpoint, old->reg.pid);
    const Member fresh{in.peer, reg};
    {
      std::lock_guard lock(router->mu);
      router->heard.erase(old->peer);
    }
    if (Status s = p->restart_shard(index, fresh); !s.ok()) {
      tell_coordinator(failed_atom::value, static_cast<std::int32_t>(s.code()),
                       "restarting shard " + std::to_string(index) + ": " + s.message());
      return;
    }
    {
      std::lock_guard lock(slots_mu);
      shard_slots[index] = fresh;
    }
    tell_coordinator(restarted_atom::value, index);
  };
  std::jthread membership([&](std::stop_token done) {
    const auto silence = millis(config.heartbeat_timeout_s);
    std::vector<bool> said(config.shards, false);  // silence reported for the current process
    while (!done.stop_requested()) {
      {
        std::vector<std::pair<std::uint32_t, Member>> current;
        {
          std::lock_guard lock(slots_mu);
          for (std::uint32_t i = 0; i < shard_slots.size(); ++i) current.emplace_back(i, *shard_slots[i]);
        }
        const auto now = SteadyClock::now();
        for (const auto& [i, m] : current) {
          const auto heard = last_heard(m.peer);
          if (!heard || now - *heard <= silence) {
            said[i] = false;
            continue;
          }
          if (said[i]) continue;
          said[i] = true;
          const std::string what = fmt::format("shard {}'s process (pid {} on {}) sent no heartbeat for {:g} s "
                                               "(--heartbeat-timeout)",
                                               i, m.reg.pid, m.reg.host, config.heartbeat_timeout_s);
          // A stopped or hung process never exits: its supervisor ends it,
          // then restarts it or says it will not (handled below).
          if (o.supervision && o.supervision->on_silent_shard) {
            spdlog::warn("{}: asking the supervisor to end it", what);
            o.supervision->on_silent_shard(i, m.reg.pid);
            continue;
          }
          if (restartable) {
            spdlog::warn("{}: waiting for it to be restarted; workers wait for it up to --rpc-timeout ({:g} s)",
                         what, config.rpc_timeout_s);
          } else {
            tell_coordinator(failed_atom::value, static_cast<std::int32_t>(StatusCode::timeout),
                             what + "; without --checkpoint-dir and --checkpoint-every it cannot be restarted, so "
                                    "the job stops");
          }
        }
      }
      take_exits();
      auto in = router->registrations.pop(std::chrono::milliseconds(200));
      if (!in) continue;
      const auto& reg = std::get<Registration>(in->body);
      if (reg.role == Role::shard && reg.index < config.shards && !reg.endpoint.empty()) {
        restart(*in, reg);
      } else if (reg.role == Role::worker && reg.index < config.workers) {
        rejoin(*in, reg);
      } else {
        bridge->send(in->peer, encode(Shutdown{"the job has started and needs no more of these"}, bridge->next_id()));
      }
    }
  });
  hooks.before_shutdown = [&](const Status& outcome) {
    membership.request_stop();
    membership.join();
    router->detach();
    say_stop(outcome.ok() ? "the job is done" : "the job failed: " + outcome.message());
  };
  auto result = run_job_with(config, callbacks, stop, hooks);
  if (membership.joinable()) {
    membership.request_stop();
    membership.join();
  }
  log_refused("coordinator", bridge->stats());
  return result;
}

// The shard the coordinator's plan assigned this process: its keys and the
// schedule's length as assigned, the rest planned from the same settings by
// the same rules; reloaded from its checkpoint when the process takes the
// place of one that died.
Result<ShardCore> assigned_shard(Joined& j, const std::string& name) {
  const Assignment& a = j.assignment;
  auto plan = plan_settings(j.config, Placement::processes, std::thread::hardware_concurrency());
  if (!plan) return plan.status();
  plan_clocks(*plan, a.schedule_steps);
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
  if (checkpoint.empty())
    return Status::InvalidArgument("restarted, but the job writes no checkpoints (--checkpoint-dir, --checkpoint-every)");
  if (!std::filesystem::exists(checkpoint, ec)) {
    spdlog::warn("{}: restarted before its first checkpoint ({}): starting again from the initial parameters", name,
                 checkpoint);
    return core;
  }
  auto saved = ShardCore::saved(checkpoint);
  if (!saved) return saved.status();
  if (Status s = core->restore(checkpoint, {}); !s.ok()) return s;
  spdlog::warn("{}: restarted; reloaded {} (written {:.1f} s ago, {} updates applied by then)", name, checkpoint,
               unix_seconds_now() - saved->written_unix_s, saved->stats.updates_applied);
  return core;
}

Status run_shard_process(const ProcessOptions& o, std::stop_token stop) {
  configure_shard_allocator();  // before ZeroMQ's threads start
  // Requests for the shard go straight from the I/O thread to its server.
  auto server = std::make_shared<std::atomic<caf::actor*>>(nullptr);
  auto server_handle = std::make_shared<caf::actor>();
  auto fast = [server](Inbound& in) {
    caf::actor* s = server->load();
    return s && post_to_shard_server(*s, std::move(in));
  };
  auto joined = join(o, Role::shard, "shard", true, fast, stop);
  if (!joined) return joined.status();
  Joined& j = *joined;
  const Assignment& a = j.assignment;
  const std::string name = "shard " + std::to_string(a.index);

  auto actor_cfg = actor_config(1);
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
  *server_handle = system.spawn(shard_server, j.bridge, shard);
  server->store(server_handle.get());
  spdlog::info("{}: keys [{}, {}) for {} workers, serving at {}", name, a.range_begin, a.range_end, a.workers,
               j.bridge->endpoint());
  Status s = serve_until_shutdown(j, name, stop, [](Inbound&) { return Status{}; });
  server->store(nullptr);
  j.bridge->stop();
  const auto st = j.bridge->stats();
  if (st.rejected > 0) spdlog::warn("{}: dropped {} malformed frames", name, st.rejected);
  log_refused(name, st);
  spdlog::info("{}: at most {} requests were unanswered at once (limit {}); reading stopped at the limit {} times",
               name, st.unanswered_peak, shard_max_unanswered(a.workers), st.read_pauses);
  caf::anon_send_exit(*server_handle, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  return s;
}

Status run_worker_process(const ProcessOptions& o, std::stop_token stop) {
  auto joined = join(o, Role::worker, "worker", false, nullptr, stop);
  if (!joined) return joined.status();
  Joined& j = *joined;
  const Assignment& a = j.assignment;
  const JobConfig& cfg = j.config;
  const std::string name = "worker " + std::to_string(a.index);
  auto fail_early = [&](const Status& s) {
    j.bridge->send(j.coordinator, encode(Failure{static_cast<std::int32_t>(s.code()), name + ": " + s.message()},
                                         j.bridge->next_id()));
    j.bridge->stop(std::chrono::seconds(2));
    return s;
  };
  if (a.range_bounds.size() != a.shard_endpoints.size() + 1 || a.shard_endpoints.empty())
    return fail_early(Status::Internal("the assignment's shard ranges do not match its shards"));

  auto loaded = data::load_dataset(cfg.dataset, resolve_data_dir(cfg), cfg.validation_size, cfg.seed);
  if (!loaded) return fail_early(loaded.status());
  auto data = std::make_shared<const data::DatasetSplits>(std::move(loaded).value());
  if (a.partition_end > data->train.count || a.partition_begin > a.partition_end || a.batch == 0)
    return fail_early(Status::Internal("the assigned partition does not fit the training data here"));
  if (a.first_epoch >= cfg.epochs) return fail_early(Status::Internal("assigned to start after the last epoch"));
  // The coordinator's plan as assigned: this worker's share, straggler
  // factor and the schedule's length; the rest planned from the same
  // settings by the same rules, its threads from this host's cores.
  auto plan = plan_settings(cfg, Placement::processes, std::thread::hardware_concurrency());
  if (!plan) return fail_early(plan.status());
  plan_clocks(*plan, a.schedule_steps);
  const auto& train = data->train;
  plan->sample_shape = {train.channels, train.rows, train.cols};
  plan->classes = data->num_classes;
  const WorkerPlan worker_plan =
      plan_worker(a.index, {{a.partition_begin, a.partition_end}, a.batch}, a.straggler, a.first_epoch);
  const auto compute = std::make_shared<ComputeContext>(plan->compute_threads);

  auto actor_cfg = actor_config(1);
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
  auto feeder =
      system.spawn<caf::detached>(data_feeder, feeder_setup(*plan, worker_plan, data, a.first_epoch));
  // A worker process that rejoins a running job starts at an epoch's first
  // step (plan_worker).
  WorkerSetup ws = worker_setup(*plan, worker_plan);
  ws.compute = compute;
  ws.shards = shards;
  ws.feeder = feeder;
  ws.coordinator = system.spawn(remote_coordinator, j.bridge, j.coordinator);
  auto worker_actor = system.spawn(worker, std::move(ws));
  // Tells the coordinator when the worker has finished (a failure it
  // reports itself). Held here: CAF ends an actor nobody refers to.
  auto bridge = j.bridge;
  auto coord = j.coordinator;
  const std::uint32_t index = a.index;
  caf::actor watcher = system.spawn(
      [bridge, coord, index](caf::event_based_actor* self, caf::actor watched) -> caf::behavior {
        self->monitor(watched);
        self->set_down_handler([self, bridge, coord, index](caf::down_msg& dm) {
          if (dm.reason == caf::exit_reason::normal)
            bridge->send(coord, encode(ClockNotice{index, 0, true}, bridge->next_id()));
          self->quit();
        });
        return {[](int) {}};
      },
      worker_actor);
  spdlog::info("{}: samples [{}, {}) in batches of {}, {} shard(s){}", name, a.partition_begin, a.partition_end,
               a.batch, shards.size(),
               a.first_epoch > 0 ? fmt::format(", from epoch {} (in place of a lost process)", a.first_epoch + 1) : "");
  Status s = serve_until_shutdown(j, name, stop, [&](Inbound& in) {
    if (std::holds_alternative<StartTraining>(in.body)) caf::anon_send(worker_actor, start_atom::value);
    if (auto* r = std::get_if<Restarted>(&in.body); r && r->role == Role::shard && r->index < shard_peers.size()) {
      auto resent = j.bridge->reconnect(shard_peers[r->index], r->endpoint);
      if (resent) {
        spdlog::info("{}: shard {} was restarted, now at {}; sent {} unanswered request(s) again", name, r->index,
                     r->endpoint, *resent);
      } else {
        spdlog::error("{}: reconnecting to shard {} at {}: {}", name, r->index, r->endpoint, resent.status().message());
      }
    }
    return Status{};
  });
  j.bridge->stop();
  for (auto& x : shards) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(worker_actor, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(feeder, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
  return s;
}

}  // namespace asgd
