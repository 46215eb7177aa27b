#pragma once
// The registry's state (cluster_registry.cpp): which process holds each
// shard and worker slot, and what the registry is waiting for. Internal to
// the registry's actor; not thread-safe.

#include <caf/all.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "base/cpus.hpp"
#include "messaging/bridge.hpp"
#include "messaging/protocol.hpp"
#include "runtime/cluster_internal.hpp"
#include "runtime/cluster_registry.hpp"

namespace asgd::cluster_detail {

using messaging::Bridge;
using messaging::PeerId;
using messaging::Registration;

struct Member {
  PeerId peer;
  Registration reg;
  SteadyClock::time_point since = SteadyClock::now();  ///< when it registered
};

// A process that registered during the job for a slot whose process may
// still be alive; refused once refuse_at passes with the old one alive.
struct Newcomer {
  Member member;
  SteadyClock::time_point refuse_at;
};

// A shard process that was sent its assignment and has not served yet.
struct Unready {
  std::uint32_t index = 0;
  bool restart = false;  // takes the place of a dead process mid-job
  SteadyClock::time_point deadline;
  Member member;
};

using Slots = std::vector<std::optional<Member>>;

struct RegistryState {
  RegistrySetup setup;
  std::shared_ptr<Bridge> bridge;
  Slots shards, workers;  // by index: the process that holds each slot
  bool registering = true;
  std::optional<Status> registration;               // how registration ended
  std::optional<caf::response_promise> awaiting;  // the main thread's await
  std::map<PeerId, SteadyClock::time_point> heard;  // each process's last heartbeat
  std::map<PeerId, std::string> given_up;            // processes given up for dead, and what they are told if they speak again
  std::set<std::uint32_t> ended;                      // pids the supervisor saw end
  std::vector<Newcomer> newcomers;
  std::map<PeerId, Unready> unready;
  std::vector<std::optional<ShardPlaced>> placed;  // by shard index
  caf::actor coordinator;
  caf::actor ready_waiter;                          // told once every placed shard serves
  std::optional<Status> placement;                  // set once a placed shard failed to take its assignment
  bool ready_told = false;
  std::map<PeerId, caf::actor> proxies;             // worker process -> the actor that stands for it
  std::vector<bool> said_silent;                    // silence reported for the shard's current process
  bool stopped = false;
  std::optional<std::set<std::uint32_t>> preparing;  // the job's start waits for these workers to be ready
  static inline const char* name = "registry";
};

using Self = caf::stateful_actor<RegistryState>*;

// runtime/cluster_registry_slots.cpp:
// Warns when shard `slot` announces an endpoint processes on other hosts
// cannot dial (0.0.0.0, or a loopback address from another host).
void warn_if_unreachable(const Registration& reg, std::size_t slot);
// "shard 1, worker 0 (rank 3 under a launcher)": the slots nobody took.
std::string missing_slots(const RegistryState& st);
// The launcher rank whose process takes a role's slot: rank 0 the
// coordinator, then the shards, then the workers (role_of_rank).
std::size_t rank_of_slot(const RegistryState& st, messaging::Role role, std::size_t slot);
// Whether `peer` is a process this registry took in.
bool known(const RegistryState& st, const PeerId& peer);

inline std::size_t filled(const Slots& slots) {
  return static_cast<std::size_t>(std::count_if(slots.begin(), slots.end(), [](const auto& m) { return m.has_value(); }));
}

// How many of the worker processes compute on any of the CPUs `key` names
// (cpu_keys_overlap): those whose threads compete with its.
inline std::uint32_t workers_with_cpu_key(const Slots& workers, const std::string& key) {
  return static_cast<std::uint32_t>(std::count_if(
      workers.begin(), workers.end(), [&](const auto& m) { return m && cpu_keys_overlap(m->reg.cpu_key, key); }));
}

// How many of the worker processes compute on any of worker w's CPUs (w
// included): those whose threads w's are to share them with.
inline std::uint32_t cpu_sharers(const Slots& workers, std::uint32_t w) {
  if (w >= workers.size() || !workers[w] || workers[w]->reg.cpu_key.empty()) return 1;
  return workers_with_cpu_key(workers, workers[w]->reg.cpu_key);
}

}  // namespace asgd::cluster_detail
