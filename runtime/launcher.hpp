#pragma once
// Who started this process: a launcher that runs the same command on every
// rank (Slurm, MPI, a Kubernetes Indexed Job, torchrun, or asgd's own
// ASGD_* variables), or nobody (then `asgd cluster` starts its processes
// itself). Read from the environment by pure functions, so tests give it
// any environment they like.
//
// Roles by rank: rank 0 is the coordinator, ranks 1..S the shards, the rest
// the workers.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

enum class LauncherKind { local, env, slurm, mpi, kubernetes, torchrun };

/// "local", "env", "slurm", "mpi", "kubernetes", "torchrun".
std::string to_string(LauncherKind kind);

using Environment = std::map<std::string, std::string>;

/// This process's environment.
Environment process_environment();

struct Launch {
  LauncherKind kind = LauncherKind::local;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  std::uint32_t local_rank = 0;  ///< among the ranks on this host
  /// tcp://HOST:PORT where rank 0 listens; empty when the launcher does not
  /// say (MPI without ASGD_COORDINATOR: a --rendezvous file tells).
  std::string coordinator;
  std::vector<std::string> hosts;  ///< Slurm: the job's nodes, in order
  /// Per rank, the host the launcher put it on, where it says (Slurm's
  /// block distribution: SLURM_TASKS_PER_NODE over the node list); else empty.
  std::vector<std::string> rank_hosts;
  std::string job_id;              ///< Slurm's
  /// Where the coordinator's port came from ("derived from SLURM_JOB_ID=49
  /// and SLURM_STEP_ID=0", "given with --port", "MASTER_PORT=29500", "from
  /// ASGD_COORDINATOR"); empty where rank 0 takes --port or any free port
  /// (under mpirun, with a rendezvous file).
  std::string port_from;
  /// This run's identity, the same on every rank and another for the next
  /// run, where the launcher gives one (Slurm's job and step, Open MPI's
  /// job id or PMIx namespace, torchrun's run id); else empty. A rendezvous
  /// file carries it, so that one left by another run is not read.
  std::string run_id;
  std::string from;                ///< the variables it was read from, for --print-layout
};

/// The launcher `wanted` names (auto | local | env | slurm | mpi |
/// kubernetes | torchrun). auto takes the first whose variables are set, in
/// this order: ASGD_RANK (env), OMPI_COMM_WORLD_RANK (mpi: mpirun inside a
/// Slurm allocation), SLURM_PROCID (slurm; an srun task, with SLURM_STEP_ID),
/// PMIX_RANK or PMI_RANK (mpi), JOB_COMPLETION_INDEX (kubernetes), RANK with
/// WORLD_SIZE (torchrun); none: local. ASGD_COORDINATOR, when set, is the
/// coordinator under every launcher; otherwise Slurm's is the first host of
/// the step's node list at `port` (0: port_for_job of SLURM_JOB_ID and
/// SLURM_STEP_ID), and torchrun's MASTER_ADDR:MASTER_PORT. Errors: invalid_argument naming the
/// variable that is missing or malformed, or an unknown `wanted`.
Result<Launch> detect_launch(const Environment& env, const std::string& wanted, std::uint16_t port = 0);

/// Expands Slurm's compressed host list ("node[01-04,07],gpu-a[1-2]"), in
/// order, keeping each range's zero padding. Errors: invalid_argument
/// naming the list (an unclosed bracket, a range that runs backwards, ...).
Result<std::vector<std::string>> expand_hostlist(const std::string& list);

/// Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of 3 nodes, then
/// 1) as tasks per node, in order. Errors: invalid_argument naming it.
Result<std::vector<std::uint32_t>> parse_tasks_per_node(const std::string& text);

/// A port in [10000, 30000), below Linux's ephemeral ports, that every rank
/// of run `id` derives alike.
std::uint16_t port_for_job(const std::string& id);

enum class RankRole { coordinator, shard, worker };

struct RoleOfRank {
  RankRole role = RankRole::coordinator;
  std::uint32_t index = 0;  ///< the shard's or worker's index
};

/// Rank 0 the coordinator, 1..shards the shards, the rest the workers.
/// Errors: invalid_argument when the world size is not 1 + shards + workers
/// (saying which it would take).
Result<RoleOfRank> role_of_rank(const Launch& launch, std::uint32_t shards, std::uint32_t workers);

/// The local address this host uses to reach `host` (the interface that
/// routes there), as text; no packet is sent. Errors: not_found when
/// `host` does not resolve, unavailable when nothing routes to it.
Result<std::string> address_towards(const std::string& host);

/// The IPv4 address of network interface `name` ("eth0", "ib0"). Errors:
/// not_found naming the interfaces there are.
Result<std::string> interface_address(const std::string& name);

/// What ZeroMQ can bind for HOST: "*", an IPv4 address and an interface
/// name as they are, a host name as its IPv4 address (ZeroMQ took "hostB"
/// for an interface and failed: "No such device"). Errors: invalid_argument
/// when the name does not resolve.
Result<std::string> bindable_host(const std::string& host);

/// "tcp://HOST:PORT" split into HOST and PORT. Errors: invalid_argument.
Result<std::pair<std::string, std::uint16_t>> split_tcp_endpoint(const std::string& endpoint);

}  // namespace asgd
