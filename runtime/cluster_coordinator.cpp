// The coordinator process of a job across processes: it waits for the
// shard and worker processes to register, places the job's shards and
// workers on them (ClusterPlacement), and keeps the membership during the
// job (a silent shard, a process that registers in a dead one's place).

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "actors/coordinator.hpp"
#include "messaging/bridge.hpp"
#include "runtime/cluster.hpp"
#include "runtime/cluster_internal.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"

namespace asgd {

namespace {

using namespace messaging;
using namespace cluster_detail;

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

}  // namespace asgd
