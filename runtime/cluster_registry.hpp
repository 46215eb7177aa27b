#pragma once
// The coordinator process's registry: an actor that alone knows which
// process holds which shard and worker slot. The coordinator process's
// bridge posts everything it receives here (Post); the registry answers
// registrations, routes reports, failures and heartbeats to the job's
// coordinator and to the actors that stand for worker processes, hands
// placed shards and started workers their assignments, and keeps the
// membership during the job: a shard that goes silent, a process the
// supervisor saw end, a process that registers in a dead one's place (a
// worker rejoins, a shard restarts from its checkpoint).
//
// Every wait is a timer or a message, none blocks: registration ends when
// the last slot fills or at --join-timeout; a shard is ready at its first
// heartbeat after its assignment, or fails at --join-timeout; a newcomer
// for a slot waits until the old process is declared dead (the supervisor
// says so, or it missed kPresumedDead of heartbeats), or is refused after
// --heartbeat-timeout.
//
// It runs in an actor system of the coordinator process's own, which
// outlives the job's; it talks to the job's actors with anonymous sends
// only, so neither system's threads run the other's actors.
//
// Accepts:
//   Post                          from the bridge's handler: one inbound message
//   (await_atom)                  -> (int32 code, string what, vector<string> shard endpoints,
//                                 uint32 worker processes registered with this process's CPU key):
//                                 answered once every slot is filled, at --join-timeout, or on cancel
//   (cancel_atom)                 the job was cancelled while processes registered
//   (coordinator_atom, actor)     the job's coordinator, to route to
//   ShardPlaced                   the coordinator placed a shard: send its assignment
//   (ready_atom, actor)           tell this coordinator (ready_atom, int32 code, string what)
//                                 once every placed shard serves
//   (proxy_atom, uint32 w, actor) the actor that stands for worker w's current process
//   WorkerStart                   worker w's assignment (the registry adds the shard endpoints)
//   (prepare_atom, uint32 n)      the job's start: tell the coordinator (prepared_atom) once workers
//                                 0..n-1 are ready (WorkerReady), or at --join-timeout
//   (start_atom, uint32 w)        send worker w its StartTraining
//   (dismiss_atom, uint32 w, string why)   tell worker w's new process to stop
//   ProcessExit (as Exited)       the supervisor saw a process end
//   (stop_atom, string why)       -> bool: tell every process to stop, forget the job's actors, quit

#include <caf/all.hpp>

#include <memory>
#include <string>
#include <vector>

#include "asgd/job.hpp"
#include "messaging/bridge.hpp"
#include "runtime/cluster.hpp"

namespace asgd::cluster_detail {

using await_atom = caf::atom_constant<caf::atom("await")>;
using coordinator_atom = caf::atom_constant<caf::atom("coord")>;
using proxy_atom = caf::atom_constant<caf::atom("proxy")>;
using dismiss_atom = caf::atom_constant<caf::atom("dismiss")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using prepare_atom = caf::atom_constant<caf::atom("prepare")>;

/// One inbound message, as the bridge's handler posts it.
struct Post {
  std::shared_ptr<messaging::Inbound> in;
};

/// A shard the coordinator placed: its assignment and initial parameters
/// (kept for a restart before any checkpoint), and the coordinator
/// process's connection to it.
struct ShardPlaced {
  std::shared_ptr<const messaging::Assignment> assignment;
  std::shared_ptr<const std::vector<float>> initial;
  messaging::PeerId link;
};

/// Worker w's assignment; `start`: with its StartTraining (a worker that
/// rejoins a running job), else it is started later ((start_atom, w)).
struct WorkerStart {
  std::shared_ptr<const messaging::Assignment> assignment;
  bool start = true;
};

/// What the supervisor saw.
struct Exited {
  ProcessExit exit;
};

struct RegistrySetup {
  JobConfig config;
  double join_timeout_s = 60.0;
  std::shared_ptr<Supervision> supervision;  ///< may be null
  std::vector<std::string> rank_hosts;       ///< ProcessOptions::rank_hosts
  std::string run;                           ///< ProcessOptions::run
};

/// Spawns the registry in `system`. Until it is sent the bridge (a
/// shared_ptr<Bridge>) it keeps every other message for later.
caf::actor spawn_registry(caf::actor_system& system, RegistrySetup setup);

}  // namespace asgd::cluster_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(asgd::cluster_detail::Post)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(asgd::cluster_detail::ShardPlaced)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(asgd::cluster_detail::WorkerStart)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(asgd::cluster_detail::Exited)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<asgd::messaging::Bridge>)
