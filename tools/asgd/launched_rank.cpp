// `asgd cluster` under a launcher (Slurm, MPI, Kubernetes, torchrun, ASGD_*):
// every rank runs the same command and plays the part its rank gives it
// (runtime/launcher.hpp), instead of starting local processes.

#include "base/log.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/checkpoint.hpp"
#include "actors/job_plan.hpp"
#include "compute/device.hpp"
#include "messaging/curve_auth.hpp"
#include "runtime/cluster.hpp"
#include "runtime/job_internal.hpp"
#include "runtime/launcher.hpp"
#include "tools/asgd/commands.hpp"
#include "tools/asgd/mpi_session.hpp"

namespace asgd::cli {

namespace {

const char* role_name(RankRole r) {
  return r == RankRole::coordinator ? "coordinator" : r == RankRole::shard ? "shard" : "worker";
}

// Writes `endpoint` to `path` whole or not at all (write_atomically), with
// the run it is of on the next line when the launcher says.
Status write_rendezvous(const std::string& path, const std::string& endpoint, const std::string& run) {
  const Status s = write_atomically(path, endpoint + "\n" + (run.empty() ? "" : "run " + run + "\n"));
  return s.ok() ? s : Status::IOError("--rendezvous " + path + ": " + s.message());
}

// The rendezvous file can be what it must: a file, not a folder or device,
// which rank 0 (`writer`) can write into its folder. Checked on every rank
// before anything starts, so that every rank refuses the same path at once
// (a folder there crashed rank 0 at the end, and an empty one was deleted).
Status usable_rendezvous(const std::string& path, bool writer) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    return Status::InvalidArgument("--rendezvous " + path + ": not a regular file (a folder?); give a file's path");
  if (!writer) return {};
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  if (!std::filesystem::is_directory(folder, ec))
    return Status::InvalidArgument("--rendezvous " + path + ": the folder " + folder.string() + " does not exist");
  if (::access(folder.c_str(), W_OK) != 0)
    return Status::InvalidArgument("--rendezvous " + path + ": cannot write in " + folder.string());
  return {};
}

// Rank 0's rendezvous file once the job is over, if it is still a file.
void remove_rendezvous(const std::string& path) {
  std::error_code ec;
  if (!path.empty() && std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
}

// Rank 0's endpoint from the rendezvous file, waiting for it up to
// `timeout_s`; one written by another run (a file left by an earlier job
// under the same name) is passed over, when the launcher names the run.
Result<std::string> await_rendezvous(const std::string& path, double timeout_s, std::uint32_t rank,
                                     const std::string& run) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string other;  // another run's, seen there
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    std::string endpoint, of;
    if (in && std::getline(in, endpoint) && !endpoint.empty()) {
      std::getline(in, of);
      if (run.empty() || of == "run " + run) return endpoint;
      other = of.empty() ? "no run named" : of;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::Timeout("rank " + std::to_string(rank) + ": rank 0 wrote no endpoint to --rendezvous " + path +
                         " within " + fmt::format("{:g}", timeout_s) + " s (--join-timeout)" +
                         (other.empty() ? "; is it on a filesystem every rank shares, and did rank 0 start?"
                                        : "; it holds another run's (" + other + ", this one is " + run +
                                              "): a file left by an earlier job? Give each job a fresh name"));
}

// A worker's device: with --device cuda, the GPU its local rank picks
// (cuda:LOCAL_RANK mod the host's GPUs), so the workers of one host spread
// over its GPUs; otherwise the job's (a list's item is picked by the worker
// index the coordinator assigns).
std::string worker_device(const Launch& l, const JobConfig& config) {
  if (config.device != "cuda") return "";
  const int gpus = cuda_device_count();
  return gpus > 0 ? "cuda:" + std::to_string(l.local_rank % static_cast<std::uint32_t>(gpus)) : config.device;
}

// What this rank will do, in lines for --print-layout.
void print_layout(const Launch& l, const RoleOfRank& role, const std::string& coordinator, const std::string& listen,
                  const JobConfig& config) {
  std::printf("launcher %s (from %s)\n", to_string(l.kind).c_str(), l.from.c_str());
  std::printf("rank %u of %u, local rank %u\n", l.rank, l.world_size, l.local_rank);
  std::printf("role: %s", role_name(role.role));
  if (role.role != RankRole::coordinator) std::printf(" %u", role.index);
  std::printf("\ncoordinator: %s\n", coordinator.empty() ? "(from --rendezvous, once rank 0 writes it)"
                                                         : coordinator.c_str());
  std::printf("listens on: %s\n", listen.c_str());
  if (role.role == RankRole::worker) {
    std::string device = worker_device(l, config);
    if (device.empty()) {  // its item of a list (the whole list was printed, and checked as one)
      auto devices = parse_worker_devices(config.device, config.workers);
      device = devices && role.index < devices->size() ? (*devices)[role.index] : config.device;
    }
    // Checked here as the worker would check it (a submission checked with
    // --print-layout said "device: cuda" on a host without one).
    const Status usable = device_usable_here(device);
    std::string why = usable.message();  // without its "--device X: "
    if (const auto colon = why.find(": "); why.starts_with("--device ") && colon != std::string::npos)
      why = why.substr(colon + 2);
    std::printf("device: %s%s\n", device.c_str(),
                usable.ok() ? "" : (" (on this host, " + why + ": the worker would refuse to start)").c_str());
  }
  std::fflush(stdout);
}

// `address`, checked before anything starts when it is an IPv4 address:
// one this host can listen on (a bind that failed later was a runtime
// failure, exit 1, not naming where the address came from). Other forms
// are ZeroMQ's to take.
Result<std::string> own_address(const std::string& address, const std::string& from) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  if (::inet_pton(AF_INET, address.c_str(), &at.sin_addr) != 1) return address;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const bool bound = fd >= 0 && ::bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!bound)
    return Status::InvalidArgument(from + " " + address + ": this host cannot listen there (" + std::strerror(err) +
                                   "): give one of its own addresses");
  return address;
}

// This rank's own address when the flags or the environment give one:
// --address, else --interface's, else $ASGD_ADDRESS; empty when none does.
Result<std::string> given_address(const LaunchFlags& lf) {
  if (!lf.address.empty()) return own_address(lf.address, "--address");
  if (!lf.interface.empty()) return interface_address(lf.interface);
  const auto env = process_environment();
  auto it = env.find("ASGD_ADDRESS");
  return it == env.end() || it->second.empty() ? std::string() : own_address(it->second, "ASGD_ADDRESS");
}

// Where rank 0 listens: the launcher's port (or --port, or any), on its own
// address; bound where it announces, never 0.0.0.0 in a rendezvous file.
Result<std::string> coordinator_listen(const LaunchFlags& lf, const std::string& coordinator, std::string address) {
  std::uint16_t port = lf.port;
  if (!coordinator.empty()) {
    auto split = split_tcp_endpoint(coordinator);
    if (!split) return Status::InvalidArgument("ASGD_COORDINATOR: " + split.status().message());
    port = split->second;
  }
  // With a rendezvous file (the others learn where rank 0 is from it) it
  // announces the address its host name has; a launcher that names rank
  // 0's endpoint already told the others, and it listens on every interface.
  if (address.empty() && !lf.rendezvous.empty() && coordinator.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    auto own = address_towards(name);
    address = own.ok() ? *own : "127.0.0.1";
  }
  return "tcp://" + (address.empty() ? std::string("*") : address) + ":" + std::to_string(port);
}

// Rank 0 announcing a loopback address (its host name resolves to one, as
// Debian's /etc/hosts has it, 127.0.1.1) while the ranks span several hosts:
// those elsewhere could never reach it.
void warn_if_unreachable(const std::string& listen, const std::vector<std::string>& rank_hosts) {
  const std::set<std::string> hosts(rank_hosts.begin(), rank_hosts.end());
  if (hosts.size() > 1 && listen.starts_with("tcp://127."))
    logger().warn("rank 0 listens on {}, a loopback address, but the job's ranks run on {} hosts: those on other "
                  "hosts cannot reach it; give --address or --interface (or set ASGD_ADDRESS)",
                  listen, hosts.size());
}

// Where a shard (or a worker's collective) listens: its given address, else
// the one that routes to the coordinator.
Result<std::string> shard_listen(const Launch& launch, const std::string& coordinator, const std::string& address) {
  if (!address.empty()) return "tcp://" + address + ":0";
  auto bare = messaging::split_server_key(coordinator);  // with --auth-keys it carries rank 0's key
  auto split = bare ? split_tcp_endpoint(bare->first) : Result<std::pair<std::string, std::uint16_t>>(bare.status());
  auto own = split ? address_towards(split->first) : Result<std::string>(split.status());
  if (!own)
    return Status::Unavailable("rank " + std::to_string(launch.rank) + ": " + own.status().message() +
                               " (give --address, or set ASGD_ADDRESS)");
  return "tcp://" + *own + ":0";
}

// Where this rank will listen, as --print-layout says it (a shard reading a
// rendezvous file knows only once rank 0 has written it).
std::string layout_listen(const LaunchFlags& lf, const Launch& launch, const RoleOfRank& role,
                          const std::string& address) {
  const char* worker = role.role == RankRole::worker ? " (its collective, for allreduce and gossip)" : "";
  if (role.role != RankRole::coordinator && launch.coordinator.empty() && address.empty())
    return std::string("(the address that routes to rank 0)") + worker;
  auto at = role.role == RankRole::coordinator ? coordinator_listen(lf, launch.coordinator, address)
                                               : shard_listen(launch, launch.coordinator, address);
  if (!at.ok() && role.role == RankRole::worker) return "tcp://127.0.0.1:0" + std::string(worker);
  return (at.ok() ? *at : at.status().message()) + worker;
}

// Under mpirun a rank given --collective mpi when another was not (or the
// other way) waits inside MPI_Init for ranks that never call it, and the
// rest wait for that rank: what a wait that timed out there may be.
std::string mpi_hint(const Launch& launch) {
  return launch.kind == LauncherKind::mpi
             ? "; under mpirun a rank given --collective mpi when the others were not (or the other way) waits "
               "inside MPI_Init: give every rank the same flags"
             : "";
}

int run_rank_coordinator(const JobOptions& jo, const LaunchFlags& lf, const Launch& launch, const JobConfig& config,
                         ProcessOptions po) {
  Interrupts interrupts;
  Status rendezvous;  // writing rank 0's endpoint for the others
  po.shards = config.shards;
  po.workers = config.workers;
  auto result = run_coordinator_process(config, po, progress_callbacks(config, true), interrupts.token(),
                                        [&](const std::string& endpoint) {
                                          std::printf("coordinator listening on %s\n", endpoint.c_str());
                                          std::fflush(stdout);
                                          if (lf.rendezvous.empty()) return;
                                          rendezvous = write_rendezvous(lf.rendezvous, endpoint, launch.run_id);
                                          if (!rendezvous.ok()) interrupts.stop();  // nobody could find it
                                        });
  remove_rendezvous(lf.rendezvous);
  // (The registry's wait for the ranks only, not a timeout during training.)
  if (!result && result.status().code() == StatusCode::timeout && launch.kind == LauncherKind::mpi &&
      result.status().message().find("(--join-timeout)") != std::string::npos)
    result = Status::Timeout(result.status().message() + mpi_hint(launch));
  if (!rendezvous.ok()) {
    print_error(rendezvous.message() + ": the other ranks cannot find rank 0; give a folder every rank can write");
    return kExitUsage;
  }
  // The port may be another job's on this host: said with where it came
  // from and what to change (it was a bare "bind: Address already in use").
  const std::string from = !launch.port_from.empty() ? launch.port_from : lf.port != 0 ? "given with --port" : "";
  if (!result && !from.empty() && result.status().message().find("Address already in use") != std::string::npos) {
    print_error("rank 0 cannot listen on " + po.listen + ": that port, " + from +
                ", is taken on this host (by another job?); " +
                (from == "from ASGD_COORDINATOR" ? "give every rank an ASGD_COORDINATOR with a free port"
                                                 : "give every rank --port P (a free one)"));
    return kExitUsage;
  }
  return report_outcome(result, config, jo.log);
}

// A shard or worker rank: finds rank 0 (from the rendezvous file if need
// be), then serves or trains.
int run_rank_role(const LaunchFlags& lf, const Launch& launch, const RoleOfRank& role, const JobConfig& config,
                  const std::string& address, ProcessOptions po) {
  if (po.coordinator.empty()) {
    auto found = await_rendezvous(lf.rendezvous, lf.join_timeout_s, launch.rank, launch.run_id);
    if (!found) {
      print_error(found.status().message() + mpi_hint(launch));
      return kExitFailure;
    }
    po.coordinator = *found;
  }
  // A shard listens there; so does a worker's collective (allreduce,
  // gossip), which stays on 127.0.0.1 when no address routes to rank 0.
  // Rank 0's name may not resolve yet (a Kubernetes pod's, before its
  // Service has it): a shard asks again until --join-timeout, as a worker
  // waits for its assignment, where it ended at once.
  Interrupts interrupts;
  auto at = shard_listen(launch, po.coordinator, address);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lf.join_timeout_s);
  for (bool said = false; role.role == RankRole::shard && !at && std::chrono::steady_clock::now() < deadline &&
                          !interrupts.token().stop_requested();
       at = shard_listen(launch, po.coordinator, address)) {
    if (!std::exchange(said, true)) logger().warn("{}; asking again until --join-timeout", at.status().message());
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (role.role == RankRole::shard && !at) {
    print_error(at.status().message());
    return kExitFailure;
  }
  if (at) po.listen = *at;
  po.data_dir = config.data_dir;
  if (role.role == RankRole::worker) po.device = worker_device(launch, config);
  const Status s = role.role == RankRole::shard ? run_shard_process(po, interrupts.token())
                                                : run_worker_process(po, interrupts.token());
  if (!s.ok()) {
    print_error(error_text(s));
    return exit_code_for(s);
  }
  return kExitOk;
}

// What every role's process takes from the launcher and the flags.
ProcessOptions rank_process_options(const LaunchFlags& lf, const Launch& launch, const RoleOfRank& role,
                                    std::optional<messaging::CurveOptions> curve) {
  ProcessOptions po;
  po.coordinator = launch.coordinator;
  po.shared_memory = lf.shared_memory;
  po.busy_poll = std::chrono::microseconds(lf.busy_poll_us);
  po.curve = std::move(curve);
  po.index = role.index;
  po.index_from = "rank " + std::to_string(launch.rank) + " (" + launch.from.substr(0, launch.from.find(',')) + ")";
  po.run = launch.run_id;
  // The others wait a little longer than rank 0, so that when a rank never
  // comes they hear rank 0's verdict (which names it) before giving up.
  po.join_timeout_s = lf.join_timeout_s;
  po.join_grace_s = role.role == RankRole::coordinator ? 0.0 : 2.0;
  return po;
}

}  // namespace

int run_launched_rank(const JobOptions& jo, const LaunchFlags& lf, const Launch& launch,
                      std::optional<messaging::CurveOptions> curve) {
  JobConfig config;
  // The data folder is checked after --print-layout, which runs where it may
  // not be (a login node); on every rank, a shard's too (which never reads
  // it), so that a folder missing everywhere ends every rank at once.
  if (auto code = load_job(jo, config, /*devices_here=*/false, /*data_here=*/false)) return *code;
  if (Status s = validate_for_cluster(config, WorkersOn::their_hosts); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  auto role = role_of_rank(launch, config.shards, config.workers);
  if (!role && !config.resume.empty()) {  // its hint would change what a resume keeps
    print_error("launcher " + to_string(launch.kind) + ": " + std::to_string(launch.world_size) +
                " rank(s), but the resumed job keeps its " + std::to_string(config.shards) + " shard(s) and " +
                std::to_string(config.workers) + " worker(s): start " +
                std::to_string(1ull + config.shards + config.workers) + " ranks");
    return kExitUsage;
  }
  auto address = given_address(lf);
  if (!role || !address) {
    print_error((!role ? role.status() : address.status()).message());
    return kExitUsage;
  }
  if (launch.coordinator.empty() && lf.rendezvous.empty()) {
    print_error("launcher " + to_string(launch.kind) +
                ": where rank 0 listens is not known: give --rendezvous PATH (a file on a filesystem every rank "
                "shares) or set ASGD_COORDINATOR=tcp://HOST:PORT");
    return kExitUsage;
  }
  if (Status s = lf.rendezvous.empty() ? Status{} : usable_rendezvous(lf.rendezvous, role->role == RankRole::coordinator);
      !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  ProcessOptions po = rank_process_options(lf, launch, *role, std::move(curve));
  if (lf.print_layout) {
    print_layout(launch, *role, launch.coordinator, layout_listen(lf, launch, *role, *address), config);
    return kExitOk;
  }
  if (auto code = refuse_missing_data(config)) return *code;
  // --collective mpi: every rank takes part in MPI for as long as it runs
  // (MPI_Init and MPI_Finalize are collective), a worker trains with it.
  std::unique_ptr<MpiSession> mpi;
  if (lf.collective == "mpi") {
    if (config.policy != "allreduce") {
      print_error("--collective mpi: for --policy allreduce only, not " + config.policy);
      return kExitUsage;
    }
    if (config.compress == "fp16" && role->role == RankRole::coordinator)
      logger().warn("--compress fp16 changes nothing for --collective mpi: MPI_Allreduce sends float32");
    auto started = MpiSession::start(role->role == RankRole::worker, role->index);
    if (!started) {
      print_error(started.status().message());
      return kExitFailure;
    }
    mpi = std::move(started).value();
    po.collective = mpi->collective();
  }
  // A rank that fails under --collective mpi ends them all (the others may
  // be inside MPI_Allreduce, waiting for it).
  auto end = [&](int code) {
    if (mpi && code != kExitOk) mpi->abort(code);
    return code;
  };
  if (role->role != RankRole::coordinator) return end(run_rank_role(lf, launch, *role, config, *address, std::move(po)));
  auto listen = coordinator_listen(lf, launch.coordinator, *address);
  if (!listen) {
    print_error(listen.status().message());
    return end(kExitUsage);
  }
  po.listen = *listen;
  po.rank_hosts = launch.rank_hosts;
  warn_if_unreachable(*listen, launch.rank_hosts);
  return end(run_rank_coordinator(jo, lf, launch, config, std::move(po)));
}

}  // namespace asgd::cli
