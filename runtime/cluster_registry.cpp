#include "runtime/cluster_registry.hpp"

#include <spdlog/fmt/fmt.h>
#include "base/log.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "base/cpus.hpp"
#include "messaging/protocol.hpp"
#include "runtime/cluster_internal.hpp"
#include "runtime/launcher.hpp"
#include "runtime/cluster_registry_state.hpp"

namespace asgd::cluster_detail {

namespace {

using namespace messaging;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;

// How often the registry looks at the time: shard silence, shards that
// have not taken their assignment, newcomers waiting for a slot.
constexpr auto kCheckEvery = std::chrono::milliseconds(200);

// Tells process `peer` to stop, saying why: the job's end, or a
// registration refused (`refused`: the process's own mistake, exit 2).
void tell_to_stop(Self self, const PeerId& peer, const std::string& why, bool refused = false) {
  self->state.bridge->send(peer, encode(Shutdown{why, refused}, self->state.bridge->next_id()));
}
void refuse(Self self, const PeerId& peer, const std::string& why) { tell_to_stop(self, peer, why, true); }

// Sends `message` to every worker process in the job, but the one of worker `but`.
template <class M>
void tell_workers(Self self, const M& message, std::optional<std::uint32_t> but = std::nullopt) {
  auto& st = self->state;
  for (std::uint32_t i = 0; i < st.workers.size(); ++i)
    if (st.workers[i] && i != but) st.bridge->send(st.workers[i]->peer, encode(message, st.bridge->next_id()));
}

template <class... Ts>
void tell_coordinator(Self self, Ts&&... xs) {
  if (self->state.coordinator) caf::anon_send(self->state.coordinator, std::forward<Ts>(xs)...);
}

std::string role_name(const Registration& reg) { return reg.role == Role::shard ? "shard" : "worker"; }

// The main thread's await, once registration has ended: (code, what,
// shard endpoints, worker processes on this process's CPUs).
void answer_await(Self self) {
  auto& st = self->state;
  if (!st.awaiting || !st.registration) return;
  const Status& s = *st.registration;
  std::vector<std::string> endpoints;
  if (s.ok())
    for (const auto& m : st.shards) endpoints.push_back(m->reg.endpoint);
  st.awaiting->deliver(static_cast<std::int32_t>(s.code()), s.message(), std::move(endpoints),
                       workers_with_cpu_key(st.workers, cpu_set_key()));
  st.awaiting.reset();
}

// Registration ends, once: every slot filled (ok), --join-timeout, cancel.
void end_registration(Self self, Status s) {
  auto& st = self->state;
  if (!st.registering) return;
  st.registering = false;
  st.registration = std::move(s);
  answer_await(self);
}

// Before the job: a process asks for a slot (a given --index, else the first free one).
void registered(Self self, const PeerId& peer, const Registration& reg) {
  auto& st = self->state;
  if (reg.role == Role::coordinator) return refuse(self, peer, "a coordinator cannot join a job");
  Slots& slots = reg.role == Role::shard ? st.shards : st.workers;
  const std::string from = reg.index_from.empty() ? "--index " + std::to_string(reg.index) : reg.index_from;
  const std::string same_counts =
      reg.index_from.starts_with("rank ") ? "; give every rank the same --shards and --workers" : "";
  if (reg.index != kAnyIndex && reg.index >= slots.size())  // --index K
    return refuse(self, peer, fmt::format("{}: the job has {} {} process(es), 0 to {}{}", from, slots.size(),
                                          role_name(reg), slots.size() - 1, same_counts));
  if (reg.index != kAnyIndex && slots[reg.index])
    return refuse(self, peer, fmt::format("{}: {} {} is taken (pid {} on {})", from, role_name(reg),
                                          reg.index, slots[reg.index]->reg.pid, slots[reg.index]->reg.host));
  std::size_t slot = reg.index < slots.size() ? reg.index : slots.size();
  for (std::size_t i = 0; slot == slots.size() && i < slots.size(); ++i)
    if (!slots[i]) slot = i;
  if (slot == slots.size()) return refuse(self, peer, "the job needs no more of these");
  if (reg.role == Role::shard && reg.endpoint.empty()) return refuse(self, peer, "a shard must give its endpoint");
  // A launched rank takes its role from its own --shards and --workers: a
  // rank whose differ from rank 0's asks for another rank's slot (which
  // then went missing, blamed on a rank that had come).
  if (reg.index_from.starts_with("rank ")) {
    if (const std::string rank = "rank " + std::to_string(rank_of_slot(st, reg.role, slot));
        !reg.index_from.starts_with(rank + " "))
      return refuse(self, peer, fmt::format("{} asks for {} {}, which is {}'s in rank 0's job ({} shard(s), {} "
                                            "worker(s)){}",
                                            from, role_name(reg), slot, rank, st.shards.size(), st.workers.size(),
                                            same_counts));
  }
  logger().info("{} {} registered: pid {} on {}{}", role_name(reg), slot, reg.pid, reg.host,
               reg.endpoint.empty() ? "" : ", at " + reg.endpoint);
  warn_if_unreachable(reg, slot);
  slots[slot] = Member{peer, reg};
  if (filled(st.shards) == st.shards.size() && filled(st.workers) == st.workers.size()) end_registration(self, {});
}

// A process that registered gave up before the job started (Ctrl-C, its
// own --join-timeout): its slot is free for another. True when `peer`
// held one.
bool left_before_the_job(Self self, const PeerId& peer, const std::string& why) {
  auto& st = self->state;
  for (Slots* group : {&st.shards, &st.workers})
    for (std::size_t i = 0; i < group->size(); ++i) {
      auto& m = (*group)[i];
      if (!m || m->peer != peer) continue;
      logger().warn("{} {} (pid {} on {}) left before the job started ({}); its slot is free for another process",
                    role_name(m->reg), i, m->reg.pid, m->reg.host, why);
      m.reset();
      return true;
    }
  return false;
}

// A newcomer's old process is dead: the supervisor saw it end, or it missed kPresumedDead of heartbeats.
bool dead(const RegistryState& st, const Member& old) {
  if (st.ended.count(old.reg.pid) > 0) return true;
  const auto h = st.heard.find(old.peer);
  return h == st.heard.end() || SteadyClock::now() - h->second > kPresumedDead;
}

// A second process for a live one's slot: refused, saying why.
void refuse_second(Self self, const PeerId& peer, const Registration& reg, const Member& old) {
  logger().warn("{} {} registered again (pid {} on {}), but its process pid {} still sends heartbeats: refused",
               role_name(reg), reg.index, reg.pid, reg.host, old.reg.pid);
  refuse(self, peer, fmt::format("{} {} is alive (pid {} on {}); a second process for it is refused",
                                       role_name(reg), reg.index, old.reg.pid, old.reg.host));
}

// The newcomer takes the slot: a worker rejoins at once (the coordinator
// places it); a shard first reloads its checkpoint (shard_served).
void take_place(Self self, const Member& fresh, const Member& old) {
  auto& st = self->state;
  const Registration& reg = fresh.reg;
  st.given_up[old.peer] = fmt::format("another process (pid {} on {}) took the place of this {} {}, which had gone "
                                      "silent", reg.pid, reg.host, role_name(reg), reg.index);
  if (reg.role == Role::worker) {
    logger().warn("worker {} registered again: pid {} on {}; it takes the place of pid {}", reg.index, reg.pid,
                 reg.host, old.reg.pid);
    st.workers[reg.index] = fresh;
    tell_coordinator(self, rejoin_atom::value, reg.index);
    return;
  }
  logger().warn("shard {} registered again: pid {} on {}, at {}; it takes the place of pid {} and reloads its "
               "checkpoint, if one was written", reg.index, reg.pid, reg.host, reg.endpoint, old.reg.pid);
  st.heard.erase(old.peer);
  Assignment a = *st.placed[reg.index]->assignment;
  a.restore = true;
  a.restart.clear();  // its latest checkpoint's own clocks, not a resume's
  st.unready[fresh.peer] =
      Unready{reg.index, true, SteadyClock::now() + millis(st.setup.join_timeout_s), fresh};
  // The initial parameters go exact whatever --compress says (it rounds
  // the steps' traffic, not the model the job starts from).
  st.bridge->send(fresh.peer, encode(a, st.bridge->next_id(), *st.placed[reg.index]->initial));
}

void settle_newcomers(Self self) {
  auto& st = self->state;
  std::vector<Newcomer> waiting;
  for (Newcomer& n : st.newcomers) {
    const Registration& reg = n.member.reg;
    const Member& old = *(reg.role == Role::shard ? st.shards : st.workers)[reg.index];
    if (dead(st, old)) {
      take_place(self, n.member, old);
    } else if (SteadyClock::now() > n.refuse_at) {
      refuse_second(self, n.member.peer, reg, old);
    } else {
      waiting.push_back(std::move(n));
    }
  }
  st.newcomers = std::move(waiting);
}

// During the job: a process registers for a slot, to take a dead one's place.
void registered_during_job(Self self, const PeerId& peer, const Registration& reg) {
  auto& st = self->state;
  const bool shard = reg.role == Role::shard && reg.index < st.shards.size() && !reg.endpoint.empty();
  const bool worker = reg.role == Role::worker && reg.index < st.workers.size();
  if (!shard && !worker) return refuse(self, peer, "the job has started and needs no more of these");
  if (!st.registration || !st.registration->ok() || !st.ready_waiter ||
      (shard && (reg.index >= st.placed.size() || !st.placed[reg.index])))
    return tell_to_stop(self, peer, "the job's processes are still being placed: start this one again in a moment");
  const auto& cfg = st.setup.config;
  if (shard && (cfg.checkpoint_dir.empty() || cfg.checkpoint_every_s <= 0)) {
    if (const Member& old = *st.shards[reg.index]; !dead(st, old)) return refuse_second(self, peer, reg, old);
    return refuse(self, peer, "shard " + std::to_string(reg.index) + " cannot be restarted: the job writes no "
                                    "checkpoints (--checkpoint-dir, --checkpoint-every)");
  }
  st.newcomers.push_back({Member{peer, reg}, SteadyClock::now() + millis(cfg.heartbeat_timeout_s)});
  settle_newcomers(self);
}

bool every_shard_serves(const RegistryState& st) {
  for (const auto& [peer, u] : st.unready)
    if (!u.restart) return false;
  return st.placed.size() == st.shards.size() &&
         std::all_of(st.placed.begin(), st.placed.end(), [](const auto& p) { return p.has_value(); });
}

// Tells the coordinator, once, that every shard serves or that one did not take its assignment.
void tell_ready_waiter(Self self) {
  auto& st = self->state;
  if (!st.ready_waiter || st.ready_told) return;
  if (!st.placement && !every_shard_serves(st)) return;
  const Status s = st.placement.value_or(Status{});
  st.ready_told = true;
  caf::anon_send(st.ready_waiter, ready_atom::value, static_cast<std::int32_t>(s.code()), s.message());
}

// Shard process `peer` sent its first heartbeat after its assignment: it
// serves. A restarted one takes its slot now, and everyone is told.
void shard_served(Self self, const PeerId& peer) {
  auto& st = self->state;
  auto it = st.unready.find(peer);
  if (it == st.unready.end()) return;
  const Unready u = std::move(it->second);
  st.unready.erase(it);
  if (!u.restart) {
    tell_ready_waiter(self);
    return;
  }
  auto resent = st.bridge->reconnect(st.placed[u.index]->link, u.member.reg.endpoint);
  if (!resent) {
    tell_coordinator(self, failed_atom::value, static_cast<std::int32_t>(resent.status().code()),
                     "restarting shard " + std::to_string(u.index) + ": " + resent.status().message());
    return;
  }
  if (*resent > 0) logger().info("coordinator: sent {} unanswered request(s) to shard {} again", *resent, u.index);
  st.shards[u.index] = u.member;
  st.said_silent[u.index] = false;
  tell_workers(self, Restarted{Role::shard, u.index, u.member.reg.endpoint});
  tell_coordinator(self, restarted_atom::value, u.index);
}

// Shards that did not take their assignment in time.
void check_unready(Self self) {
  auto& st = self->state;
  const auto now = SteadyClock::now();
  for (auto it = st.unready.begin(); it != st.unready.end();) {
    const Unready& u = it->second;
    if (now <= u.deadline) {
      ++it;
      continue;
    }
    const Status late = Status::Timeout(fmt::format(
        "shard process {} (pid {} on {}) did not take its assignment within {:g} s", u.index, u.member.reg.pid,
        u.member.reg.host, st.setup.join_timeout_s));
    if (u.restart) {
      tell_coordinator(self, failed_atom::value, static_cast<std::int32_t>(late.code()),
                       "restarting shard " + std::to_string(u.index) + ": " + late.message());
    } else if (!st.placement) {
      st.placement = late;
      tell_ready_waiter(self);
    }
    it = st.unready.erase(it);
  }
}

// Shard processes that went silent: the supervisor ends them, or the job
// waits for a restart (with checkpoints), or fails.
void check_silence(Self self) {
  auto& st = self->state;
  const auto& cfg = st.setup.config;
  const auto now = SteadyClock::now();
  for (std::uint32_t i = 0; i < st.shards.size(); ++i) {
    const Member& m = *st.shards[i];
    const auto h = st.heard.find(m.peer);
    if (h == st.heard.end() || now - h->second <= millis(cfg.heartbeat_timeout_s)) {
      st.said_silent[i] = false;
      continue;
    }
    if (st.said_silent[i]) continue;
    st.said_silent[i] = true;
    const std::string what = fmt::format("shard {}'s process (pid {} on {}) sent no heartbeat for {:g} s "
                                         "(--heartbeat-timeout)",
                                         i, m.reg.pid, m.reg.host, cfg.heartbeat_timeout_s);
    // A stopped or hung process never exits: its supervisor ends it, then
    // restarts it or says it will not (exited).
    if (st.setup.supervision && st.setup.supervision->on_silent) {
      logger().warn("{}: asking the supervisor to end it", what);
      st.setup.supervision->on_silent(true, i, m.reg.pid);
    } else if (!cfg.checkpoint_dir.empty() && cfg.checkpoint_every_s > 0) {
      logger().warn("{}: waiting for it to be restarted; workers wait for it up to --rpc-timeout ({:g} s)", what,
                   cfg.rpc_timeout_s);
    } else {
      tell_coordinator(self, failed_atom::value, static_cast<std::int32_t>(StatusCode::timeout),
                       what + "; without --checkpoint-dir and --checkpoint-every it cannot be restarted, so the job "
                              "stops");
    }
  }
}

// Worker w is lost: under allreduce and gossip the others' collectives stop
// waiting for it; its process, if it has not exited (stopped, hung), is
// ended (another may rejoin), so that it cannot wake up and write into an
// all-reduce the others share, nor hold the supervisor after the job. A
// process that registered within --heartbeat-timeout is not the one lost
// but its replacement, which took the slot before the loss was told.
void worker_lost(Self self, std::uint32_t w) {
  auto& s = self->state;
  tell_workers(self, ClockNotice{w, 0, true}, w);
  if (w >= s.workers.size() || !s.workers[w] ||
      SteadyClock::now() - s.workers[w]->since < millis(s.setup.config.heartbeat_timeout_s))
    return;
  s.given_up[s.workers[w]->peer] = fmt::format("this process was declared lost after {:g} s without a heartbeat "
                                               "(--heartbeat-timeout); the job goes on without it",
                                               s.setup.config.heartbeat_timeout_s);
  if (s.ended.count(s.workers[w]->reg.pid) || !s.setup.supervision || !s.setup.supervision->on_silent) return;
  logger().warn("worker {}'s process (pid {}) was declared lost but has not exited: asking the supervisor to end it", w,
                s.workers[w]->reg.pid);
  s.setup.supervision->on_silent(false, w, s.workers[w]->reg.pid);
}

// Every worker the job's start waits for is ready, or gone: the coordinator starts its clock and then the workers.
void settle_preparing(Self self) {
  auto& st = self->state;
  if (!st.preparing || !st.preparing->empty()) return;
  st.preparing.reset();
  tell_coordinator(self, prepared_atom::value);
}

// The job's start waits for workers 0..workers-1 to be ready, at most --join-timeout.
void prepare(Self self, std::uint32_t workers) {
  auto& st = self->state;
  st.preparing.emplace();
  for (std::uint32_t w = 0; w < workers && w < st.workers.size(); ++w) st.preparing->insert(w);
  self->delayed_send(self, millis(st.setup.join_timeout_s), prepare_due_atom::value);
}

void preparing_timed_out(Self self) {
  auto& st = self->state;
  if (!st.preparing) return;
  std::string who;
  for (std::uint32_t w : *st.preparing) who += (who.empty() ? "worker " : ", ") + std::to_string(w);
  logger().warn("{} not ready {:g} s after the assignments (--join-timeout): training starts without waiting for it",
                who, st.setup.join_timeout_s);
  st.preparing->clear();
  settle_preparing(self);
}

// Worker w's process starts training.
void start_worker(Self self, std::uint32_t w) {
  auto& st = self->state;
  if (w < st.workers.size() && st.workers[w])
    st.bridge->send(st.workers[w]->peer, encode(StartTraining{}, st.bridge->next_id()));
}

// Worker w is ready, or its process ended: the job's start no longer waits for it.
void stop_waiting_for(Self self, std::uint32_t w) {
  auto& st = self->state;
  if (!st.preparing) return;
  st.preparing->erase(w);
  settle_preparing(self);
}

void worker_ready(Self self, const PeerId& peer, std::uint32_t w) {
  auto& st = self->state;
  if (w < st.workers.size() && st.workers[w] && st.workers[w]->peer == peer) stop_waiting_for(self, w);
}

// The supervisor saw a process end: its slot is free at once. One that
// ends for good before it registered (a bad flag, no data, restarts used
// up) stops the start at once: its slot would never fill, and waiting for
// --join-timeout would only hide why.
void exited(Self self, const ProcessExit& e) {
  auto& st = self->state;
  st.ended.insert(e.pid);
  const Slots& group = e.shard ? st.shards : st.workers;
  if (st.registering && !e.restarting && (e.index >= group.size() || !group[e.index])) {
    end_registration(self, Status::Unavailable(e.what + "; it never registered, so the job cannot start (its own "
                                                         "error is in its log above)"));
    return;
  }
  if (!e.shard) {
    stop_waiting_for(self, e.index);  // the start does not wait for it: it is lost once training starts
    // Lost now, restarted or not (a new process rejoins as usual); unless
    // a new process has already taken its place.
    const auto& slot = e.index < st.workers.size() ? st.workers[e.index] : std::nullopt;
    if (slot && slot->reg.pid == e.pid) tell_coordinator(self, lost_atom::value, e.index, e.what);
  } else if (!e.restarting) {
    tell_coordinator(self, failed_atom::value, static_cast<std::int32_t>(StatusCode::unavailable),
                     e.what + "; the job stops");
  } else {
    logger().warn("{}; its supervisor starts it again", e.what);
  }
  settle_newcomers(self);
}

// What the bridge received.
void route(Self self, Inbound& in) {
  auto& st = self->state;
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Registration>) {
          if (st.stopped) return tell_to_stop(self, in.peer, "the job is over");
          if (auto why = another_run(st.setup.run, m)) return refuse(self, in.peer, *why);
          st.registering ? registered(self, in.peer, m) : registered_during_job(self, in.peer, m);
        } else if constexpr (std::is_same_v<T, EpochReport> || std::is_same_v<T, WorkerProgress>) {
          tell_coordinator(self, std::move(m));
        } else if constexpr (std::is_same_v<T, WorkerReady>) {
          worker_ready(self, in.peer, m.index);
        } else if constexpr (std::is_same_v<T, Calibration>) {
          tell_coordinator(self, calibrate_atom::value, m.index, m.fixed_s, m.per_sample_s);
        } else if constexpr (std::is_same_v<T, Failure>) {
          if (st.registering && left_before_the_job(self, in.peer, m.what)) return;
          if (auto w = st.proxies.find(in.peer); w != st.proxies.end())
            caf::anon_send(w->second, failed_atom::value, m.code, m.what);
          else
            tell_coordinator(self, failed_atom::value, m.code, m.what);
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          // A process stopped past --heartbeat-timeout that woke up (a
          // worker trained on, its pushes refused; a shard served no one)
          // hears why, not its coordinator's silence.
          if (auto gone = st.given_up.extract(in.peer)) return tell_to_stop(self, in.peer, gone.mapped());
          // A process another coordinator took in, reconnected to this one
          // on the same endpoint (that coordinator was restarted): echoed,
          // it trained on with no coordinator for the whole job.
          if (!known(st, in.peer))
            return tell_to_stop(self, in.peer,
                                "this coordinator did not take it in: the coordinator it registered with is gone "
                                "(restarted on the same endpoint?); start it again to join this one");
          if (auto w = st.proxies.find(in.peer); w != st.proxies.end()) caf::anon_send(w->second, alive_atom::value);
          st.heard[in.peer] = SteadyClock::now();
          shard_served(self, in.peer);
          // Echo it: the process learns the coordinator is alive.
          st.bridge->send(in.peer, encode(Heartbeat{Role::coordinator, 0, m.sequence}, in.request_id));
        } else if constexpr (std::is_same_v<T, ClockNotice>) {
          if (auto w = st.proxies.find(in.peer); w != st.proxies.end() && m.leaving)
            caf::anon_send(w->second, done_atom::value);
        }
      },
      in.body);
}

// Tells every process to stop and forgets the job's actors.
void stop_all(Self self, const std::string& why, bool usage_error) {
  auto& st = self->state;
  for (const Slots* group : {&st.shards, &st.workers})
    for (const auto& m : *group)
      if (m) tell_to_stop(self, m->peer, why, usage_error);
  for (const Newcomer& n : st.newcomers) tell_to_stop(self, n.member.peer, why, usage_error);
  st.newcomers.clear();
  st.coordinator = nullptr;
  st.ready_waiter = nullptr;
  st.proxies.clear();
  st.stopped = true;
  end_registration(self, Status::Cancelled("the job stopped while processes registered: " + why));
}

caf::behavior running(Self self) {
  return {
      [self](Post& p) { route(self, *p.in); },
      [self](await_atom) {
        auto& s = self->state;
        auto rp = self->make_response_promise();
        s.awaiting.emplace(rp);
        answer_await(self);
        return rp;
      },
      [self](deadline_atom) {
        auto& s = self->state;
        end_registration(self, Status::Timeout(fmt::format(
                               "{} of {} shard and {} of {} worker processes registered within {:g} s "
                               "(--join-timeout); missing: {}",
                               filled(s.shards), s.shards.size(), filled(s.workers), s.workers.size(),
                               s.setup.join_timeout_s, missing_slots(s))));
      },
      [self](cancel_atom) {
        end_registration(self, Status::Cancelled("the job was cancelled while processes registered"));
      },
      [self](coordinator_atom, caf::actor c) { self->state.coordinator = std::move(c); },
      [self](ShardPlaced& p) {
        auto& s = self->state;
        const std::uint32_t index = p.assignment->index;
        s.placed.resize(s.shards.size());
        if (index >= s.shards.size()) return;
        const Member& m = *s.shards[index];
        s.unready[m.peer] = Unready{index, false, SteadyClock::now() + millis(s.setup.join_timeout_s), m};
        s.bridge->send(m.peer, encode(*p.assignment, s.bridge->next_id(), *p.initial));  // exact (--compress: steps)
        s.placed[index] = std::move(p);
      },
      [self](ready_atom, caf::actor waiter) {
        auto& s = self->state;
        s.ready_waiter = std::move(waiter);
        tell_ready_waiter(self);
      },
      [self](proxy_atom, std::uint32_t w, caf::actor proxy) {
        auto& s = self->state;
        if (w < s.workers.size() && s.workers[w]) s.proxies[s.workers[w]->peer] = std::move(proxy);
      },
      [self](WorkerStart& start) {
        auto& s = self->state;
        Assignment a = *start.assignment;
        for (const auto& m : s.shards) a.shard_endpoints.push_back(m->reg.endpoint);
        // Where each worker's collective listens (the decentralized policies).
        for (const auto& m : s.workers) a.peer_endpoints.push_back(m ? m->reg.endpoint : std::string());
        a.cpu_sharers = cpu_sharers(s.workers, a.index);
        s.bridge->send(s.workers.at(a.index)->peer, encode(a, s.bridge->next_id()));
        if (start.start && !a.calibrate) start_worker(self, a.index);
      },
      [self](prepare_atom, std::uint32_t workers) { prepare(self, workers); },
      [self](prepare_due_atom) { preparing_timed_out(self); },
      [self](start_atom, std::uint32_t w) { start_worker(self, w); },
      [self](stop_atom) { tell_workers(self, StopTraining{}); },  // --stop-at-target
      [self](dismiss_atom, std::uint32_t w, const std::string& why) {
        auto& s = self->state;
        // Refused, exit 2: a supervisor that started it again would be
        // refused again (each reason holds for the rest of the job).
        if (w < s.workers.size() && s.workers[w]) refuse(self, s.workers[w]->peer, why);
      },
      [self](leave_atom, std::uint32_t w) { worker_lost(self, w); },
      [self](Exited& e) { exited(self, e.exit); },
      [self](tick_atom) {
        auto& s = self->state;
        if (s.stopped) return;
        if (s.registration && s.registration->ok()) {
          check_silence(self);
          check_unready(self);
          settle_newcomers(self);
        }
        self->delayed_send(self, kCheckEvery, tick_atom::value);
      },
      [self](stop_atom, const std::string& why, bool usage_error) {
        stop_all(self, why, usage_error);
        self->quit();
        return true;
      },
  };
}

}  // namespace

// The registry's start. Its setup is an argument of the spawn, not a
// capture: CAF 0.17 binds a reference to a null pointer when it starts an
// actor spawned with no arguments, which UBSan reports.
caf::behavior registry_actor(Self self, RegistrySetup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.shards.resize(st.setup.config.shards);
  st.workers.resize(st.setup.config.workers);
  st.said_silent.assign(st.setup.config.shards, false);
  // Until the bridge comes, everything else waits in the mailbox.
  self->set_default_handler(caf::skip);
  return {
      [self](std::shared_ptr<Bridge>& bridge) {
        auto& s = self->state;
        s.bridge = std::move(bridge);
        self->set_default_handler(caf::print_and_drop);
        self->delayed_send(self, millis(s.setup.join_timeout_s), deadline_atom::value);
        self->delayed_send(self, kCheckEvery, tick_atom::value);
        self->become(running(self));
      },
  };
}

caf::actor spawn_registry(caf::actor_system& system, RegistrySetup setup) {
  return system.spawn(registry_actor, std::move(setup));
}

}  // namespace asgd::cluster_detail
