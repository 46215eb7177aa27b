// `asgd cluster` (the job as local processes) and the one-role commands
// `asgd coordinator`, `asgd shard`, `asgd worker` for several hosts.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu_binding.hpp"
#include "base/log.hpp"
#include "base/cpus.hpp"
#include "compute/device.hpp"
#include "messaging/curve_auth.hpp"
#include "runtime/cluster.hpp"
#include "runtime/local_cluster.hpp"
#include "runtime/job_internal.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

struct ProcessFlags {
  std::string coordinator;
  std::string listen = "tcp://127.0.0.1:0";
  std::string data_dir;
  double join_timeout_s = 60.0;
  std::int64_t index = -1;
  LogOptions log;
  std::string auth_keys;        // --auth-keys DIR: CURVE on (docs/security.md)
  std::string key_file;         // --key FILE: this process's secret key
  std::string coordinator_key;  // --coordinator-key FILE: the coordinator's public key
  std::uint32_t max_restarts = 3;  // asgd cluster: restarts of each shard process at most
  bool supervised = false;         // coordinator: started by asgd cluster (hidden flag)
  std::string shared_memory = "on";  // --shared-memory on|off
  std::uint32_t busy_poll_us = 0;    // --busy-poll-us N
  std::string cpus;                  // shard, worker: --cpus LIST
  std::string device;                // worker: --device D, instead of its item of the job's --device
  std::string scheduling = "normal";  // shard, worker: --scheduling normal|batch
  std::string bind_workers = "auto";  // asgd cluster: --bind-workers auto|off
  std::string worker_scheduling = "batch";  // asgd cluster: --worker-scheduling batch|normal
};

void add_shared_memory_flag(CLI::App* cmd, std::string& value) {
  cmd->add_option("--shared-memory", value,
                  "large tensors between processes on the same host through shared memory: on | off "
                  "(default on; always off with --auth-keys)")
      ->type_name("on|off")
      ->check(quietly(CLI::IsMember({"on", "off"})));
}

void add_busy_poll_flag(CLI::App* cmd, std::uint32_t& value) {
  cmd->add_option("--busy-poll-us", value,
                  "shard and worker processes: after a message, poll for N microseconds before sleeping, so a "
                  "round trip wakes fewer threads; costs CPU (default 0: sleep at once)")
      ->type_name("N")
      ->check(quietly(CLI::Range(0u, 1'000'000u)));
}

// Where asgd cluster's worker processes run: --bind-workers, --worker-scheduling.
void add_worker_placement_flags(CLI::App* cmd, ProcessFlags& f) {
  cmd->add_option("--bind-workers", f.bind_workers,
                  "auto: when there are no more workers than CPUs, bind each worker process to CPUs of its own "
                  "(shards and the coordinator run anywhere); off: every process on every CPU (default auto; a "
                  "launcher's ranks are bound by the launcher)")
      ->type_name("auto|off")
      ->check(quietly(CLI::IsMember({"auto", "off"})));
  cmd->add_option("--worker-scheduling", f.worker_scheduling,
                  "batch: the worker processes' threads under Linux's SCHED_BATCH, whose wake-ups do not preempt "
                  "what runs; normal: as started (default batch)")
      ->type_name("batch|normal")
      ->check(quietly(CLI::IsMember({"batch", "normal"})));
}

void add_auth_flags(CLI::App* cmd, ProcessFlags& f, bool needs_coordinator) {
  cmd->add_option("--auth-keys", f.auth_keys,
                  "authenticate and encrypt with CurveZMQ: DIR's *.pub files are the peers allowed, its one *.key "
                  "this process's key (docs/security.md)")
      ->type_name("DIR");
  cmd->add_option("--key", f.key_file, "this process's secret key (default: the one *.key in --auth-keys)")
      ->type_name("FILE");
  if (needs_coordinator)
    cmd->add_option("--coordinator-key", f.coordinator_key,
                    "the coordinator's public key (default: coordinator.pub in --auth-keys, or the key the "
                    "coordinator's endpoint carries)")
        ->type_name("FILE");
}

// The CURVE options the flags ask for into `po`; an exit code when they
// cannot be had (the error is printed, naming the folder or file).
std::optional<int> load_auth(const ProcessFlags& pf, ProcessOptions& po) {
  if (pf.auth_keys.empty()) {
    if (!pf.key_file.empty() || !pf.coordinator_key.empty()) {
      print_error(std::string(pf.key_file.empty() ? "--coordinator-key" : "--key") + " needs --auth-keys DIR");
      return kExitUsage;
    }
    return std::nullopt;
  }
  auto curve = messaging::load_auth_keys({pf.auth_keys, pf.key_file, pf.coordinator_key});
  if (!curve) {
    print_error(curve.status().message());
    return kExitUsage;
  }
  if (!pf.coordinator.empty()) {
    auto split = messaging::split_server_key(pf.coordinator);
    if (!split) {
      print_error("--coordinator: " + split.status().message());
      return kExitUsage;
    }
    if (!split->second && !curve->server_key) {
      print_error("--coordinator " + pf.coordinator +
                  ": the coordinator's public key is not known: give --coordinator-key FILE, or put it in " +
                  pf.auth_keys + "/coordinator.pub");
      return kExitUsage;
    }
  }
  po.curve = std::move(curve).value();
  return std::nullopt;
}

// --coordinator and --listen: a tcp endpoint needs a host and a port in
// range (ZeroMQ took port 99999 as 34463, and an empty host waited out
// --join-timeout); other transports (ipc://) are ZeroMQ's to check.
CLI::Validator endpoint_check(bool any_port) {
  return CLI::Validator(
      [any_port](std::string& text) -> std::string {
        auto bare = messaging::split_server_key(text);  // with --auth-keys it may carry a key
        if (!bare) return bare.status().message();
        const std::string& endpoint = bare->first;
        if (!endpoint.starts_with("tcp://")) return endpoint.find("://") == std::string::npos ? "expected tcp://HOST:PORT" : "";
        auto split = split_tcp_endpoint(any_port && endpoint.ends_with(":0") ? endpoint.substr(0, endpoint.size() - 1) + "1"
                                                                            : endpoint);
        if (!split) return split.status().message() + (any_port ? " (or 0: a free one)" : "");
        if (split->first.empty()) return "expected tcp://HOST:PORT: the host is missing";
        if (!any_port) return "";  // (ZeroMQ resolves a name it connects to, again and again)
        // Where to listen: a host name goes to ZeroMQ as its address.
        auto host = bindable_host(split->first);
        if (!host) return host.status().message();
        if (*host != split->first)
          text = "tcp://" + *host + endpoint.substr(endpoint.rfind(':')) + text.substr(endpoint.size());
        return "";
      },
      "");
}

void add_process_flags(CLI::App* cmd, ProcessFlags& f, bool listens, bool needs_coordinator) {
  if (needs_coordinator)
    cmd->add_option("--coordinator", f.coordinator, "the coordinator's endpoint, tcp://HOST:PORT")
        ->type_name("ENDPOINT")
        ->required()
        ->check(endpoint_check(false));
  if (listens)
    cmd->add_option("--listen", f.listen, "where to listen (default tcp://127.0.0.1:0, a free port)")
        ->type_name("ENDPOINT")
        ->transform(endpoint_check(true));
  else
    cmd->add_option("--listen", f.listen,
                    "allreduce, gossip: the host its collective listens on for the other workers, on a free port "
                    "(default tcp://127.0.0.1:0)")
        ->type_name("ENDPOINT")
        ->transform(endpoint_check(true));
  cmd->add_option("--join-timeout", f.join_timeout_s, "seconds to wait for the other processes (default 60)")
      ->type_name("S")
      ->check(positive(true, kMaxWaitS));
  if (needs_coordinator)
    cmd->add_option("--index", f.index, "ask for this index, 0 or more (default: the first free one)")
        ->type_name("K")
        // (-1, the default's own value, was taken as "first free", and a number
        // past 2^32 was cut to another index without a word.)
        ->check(quietly(CLI::Range(std::int64_t{0}, std::int64_t{std::numeric_limits<std::uint32_t>::max()})));
  add_shared_memory_flag(cmd, f.shared_memory);
  if (needs_coordinator) {  // shard, worker
    add_busy_poll_flag(cmd, f.busy_poll_us);
    cmd->add_option("--cpus", f.cpus,
                    "run on these CPUs only, a list such as 0-3,8 (default: every CPU it was started with)")
        ->type_name("LIST")
        ->check(CLI::Validator(  // "" ran unbound without a word
            [](std::string& v) { return v.empty() ? std::string("an empty CPU list (write it as 0-3,8)") : std::string(); },
            ""));
    cmd->add_option("--scheduling", f.scheduling,
                    "normal, or batch: Linux's SCHED_BATCH for every thread, whose wake-ups then do not preempt "
                    "what runs (asgd cluster starts its workers so; default normal)")
        ->type_name("normal|batch")
        ->check(quietly(CLI::IsMember({"normal", "batch"})));
  }
}

ProcessOptions process_options(const ProcessFlags& pf) {
  ProcessOptions po;
  po.coordinator = pf.coordinator;
  po.listen = pf.listen;
  po.join_timeout_s = pf.join_timeout_s;
  po.data_dir = pf.data_dir;
  po.device = pf.device;
  if (pf.index >= 0) po.index = static_cast<std::uint32_t>(pf.index);
  po.shared_memory = pf.shared_memory == "on";
  po.busy_poll = std::chrono::microseconds(pf.busy_poll_us);
  return po;
}

int run_coordinator(const JobOptions& jo, const ProcessFlags& pf) {
  JobConfig config;
  if (auto code = load_job(jo, config, /*devices_here=*/false)) return *code;
  if (Status s = validate_for_cluster(config, WorkersOn::their_hosts); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  ProcessOptions po = process_options(pf);
  if (auto code = load_auth(pf, po)) return *code;
  Interrupts interrupts;
  po.shards = config.shards;
  po.workers = config.workers;
  std::jthread supervisor_lines, alive;
  if (pf.supervised) {
    po.supervision = std::make_shared<Supervision>();
    po.supervision->on_silent = say_silent;
    po.supervision->on_stopping = say_stopping;
    po.supervision->on_supervisor_gone = [] {
      logger().error("coordinator: the asgd cluster that started it has ended: stopping the job");
      std::raise(SIGTERM);  // as if told to stop: the others are told too
    };
    supervisor_lines = std::jthread(read_supervision, po.supervision);
    alive = std::jthread(say_alive);
  }
  auto result = run_coordinator_process(config, po, progress_callbacks(config), interrupts.token(),
                                        [](const std::string& endpoint) {
                                          // asgd cluster reads this line to find us.
                                          std::printf("coordinator listening on %s\n", endpoint.c_str());
                                          std::fflush(stdout);
                                        });
  return report_outcome(result, config, jo.log);
}

int run_role(const ProcessFlags& pf, bool shard) {
  if (Status s = setup_logging(pf.log); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  // Before any thread starts: each one started later inherits the binding.
  if (!pf.cpus.empty()) {
    auto cpus = parse_cpu_list(pf.cpus);
    Status bound = cpus ? bind_to_cpus(*cpus) : cpus.status();
    if (!bound.ok()) {
      print_error("--cpus " + pf.cpus + ": " + bound.message());
      return kExitUsage;
    }
  }
  if (pf.scheduling == "batch") {
    if (Status batch = use_batch_scheduling(); !batch.ok())
      logger().warn("--scheduling batch: {}; running as started", batch.message());
    else if (batch_scheduled())
      logger().info("{}: every thread under SCHED_BATCH (--scheduling batch)", shard ? "shard" : "worker");
  }
  // A --device given here is checked before joining: a GPU this host lacks
  // was said only after the join (up to --join-timeout, 60 s, when no
  // coordinator answered).
  if (!shard && !pf.device.empty()) {
    if (Status usable = device_usable_here(pf.device); !usable.ok()) {
      print_error(usable.message());
      return kExitUsage;
    }
  }
  ProcessOptions po = process_options(pf);
  if (auto code = load_auth(pf, po)) return *code;
  Interrupts interrupts;
  Status s = shard ? run_shard_process(po, interrupts.token()) : run_worker_process(po, interrupts.token());
  if (!s.ok()) {
    print_error(error_text(s));
    return exit_code_for(s);
  }
  return kExitOk;
}

// "worker 0 0-7, worker 1 8-15"
std::string join_cpu_sets(const std::vector<std::vector<unsigned>>& sets) {
  std::string out;
  for (std::size_t i = 0; i < sets.size(); ++i)
    out += (i > 0 ? ", " : "") + std::string("worker ") + std::to_string(i) + " " + format_cpu_list(sets[i]);
  return out;
}

// --bind-workers auto: the CPUs of each worker process, when each can have
// one or more of its own (as many as --threads asks for, if it does) and no
// control group's CPU limit time-shares them; none otherwise (every process
// on every CPU). Measured on 2 CPUs: 2 bound workers train 7-19% faster, 4
// bound 7% slower (docs/benchmarks.md).
std::vector<std::vector<unsigned>> worker_cpu_sets(const std::string& mode, const JobConfig& config) {
  if (mode != "auto" || config.workers < 2 || usable_cpus() != affinity_cpus()) return {};
  auto sets = split_cpus(allowed_cpus(), config.workers);
  if (!sets.empty() && config.threads > sets.back().size()) return {};  // the last share is the smallest
  return sets;
}

// How `asgd cluster` starts its processes: each one's arguments, its
// CPUs (printed when the workers get their own), the restarts.
LocalClusterOptions local_cluster_options(const JobOptions& jo, const ProcessFlags& pf, const JobConfig& config) {
  std::vector<std::string> auth_args;
  if (!pf.auth_keys.empty()) {
    auth_args = {"--auth-keys", std::filesystem::absolute(pf.auth_keys).string()};
    if (!pf.key_file.empty()) {
      auth_args.push_back("--key");
      auth_args.push_back(std::filesystem::absolute(pf.key_file).string());
    }
  }
  LocalClusterOptions o;
  o.coordinator_args = {"--listen", pf.listen, "--join-timeout", std::to_string(pf.join_timeout_s)};
  for (auto& a : given_job_flags(jo)) o.coordinator_args.push_back(a);
  o.coordinator_args.insert(o.coordinator_args.end(), auth_args.begin(), auth_args.end());
  o.coordinator_args.insert(o.coordinator_args.end(), {"--shared-memory", pf.shared_memory});
  o.role_args = {"--join-timeout", std::to_string(pf.join_timeout_s), "--log-level", jo.log.log_level,
                 "--shared-memory", pf.shared_memory, "--busy-poll-us", std::to_string(pf.busy_poll_us)};
  o.role_args.insert(o.role_args.end(), auth_args.begin(), auth_args.end());
  o.coordinator_silence_s = std::max(config.heartbeat_timeout_s, 3.0);
  const auto cpu_sets = worker_cpu_sets(pf.bind_workers, config);
  // The workers under SCHED_BATCH: their threads hand each step to each
  // other (the reply's decoding, the next batch), and a wake-up that
  // preempts the shard or the computing thread costs more than it gains
  // (docs/benchmarks.md: bound, 1.02-1.08x in six alternations).
  const bool batch = pf.worker_scheduling == "batch";
  o.worker_args.resize(config.workers);
  for (std::uint32_t i = 0; i < config.workers; ++i) {
    if (i < cpu_sets.size()) o.worker_args[i] = {"--cpus", format_cpu_list(cpu_sets[i])};
    if (batch) o.worker_args[i].insert(o.worker_args[i].end(), {"--scheduling", "batch"});
  }
  if (!cpu_sets.empty())
    std::printf("asgd cluster: each worker process on CPUs of its own (%s)%s; --bind-workers off: all share them\n",
                join_cpu_sets(cpu_sets).c_str(), batch ? ", under SCHED_BATCH" : "");
  else if (batch)
    std::printf("asgd cluster: the worker processes under SCHED_BATCH, on every CPU this process may use (%s)\n",
                format_cpu_list(allowed_cpus()).c_str());
  std::fflush(stdout);
  o.shards = config.shards;
  o.workers = config.workers;
  o.join_timeout_s = pf.join_timeout_s;
  o.max_restarts = pf.max_restarts;
  o.shards_restartable = !config.checkpoint_dir.empty() && config.checkpoint_every_s > 0;
  return o;
}

// asgd cluster: under a launcher, this rank's part (launched_rank.cpp);
// else the job as processes on this machine (runtime/local_cluster.hpp).
int run_cluster(const JobOptions& jo, const ProcessFlags& pf, LaunchFlags lf) {
  lf.join_timeout_s = pf.join_timeout_s;
  auto launch = detect_launch(process_environment(), lf.launcher, lf.port);
  if (!launch) {
    print_error(launch.status().message());
    return kExitUsage;
  }
  if (lf.collective != "own" && lf.collective != "mpi") {
    print_error("--collective " + lf.collective + ": own or mpi");
    return kExitUsage;
  }
  if (lf.collective == "mpi" && launch->kind != LauncherKind::mpi) {
    print_error("--collective mpi: this rank was not started by mpirun (launcher " + to_string(launch->kind) +
                "); run every rank under mpirun, or leave out --collective");
    return kExitUsage;
  }
  if (launch->kind != LauncherKind::local) {
    ProcessOptions keyed;  // every rank loads its keys, each on its own host
    if (auto code = load_auth(pf, keyed)) return *code;
    if (keyed.curve && lf.collective == "mpi") {
      print_error("--collective mpi with --auth-keys: MPI's own traffic is neither authenticated nor encrypted; "
                  "leave out --collective (asgd's collective speaks CURVE) or --auth-keys");
      return kExitUsage;
    }
    LaunchFlags launched = lf;
    launched.shared_memory = pf.shared_memory == "on";
    launched.busy_poll_us = pf.busy_poll_us;
    return run_launched_rank(jo, launched, *launch, std::move(keyed.curve));
  }
  JobConfig config;
  // --print-layout checks a submission, not the data folder (cluster.md).
  if (auto code = load_job(jo, config, /*devices_here=*/true, /*data_here=*/!lf.print_layout)) return *code;
  if (Status s = validate_for_cluster(config, WorkersOn::this_host); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  // The checkpoint folder, said once before any process starts: each of
  // the processes said it after their coordinator.
  if (auto held = lf.print_layout ? std::optional<FolderLock>() : hold_checkpoint_dir(config); !held) {
    print_error(held.status().message());
    return kExitUsage;
  }
  // The keys are checked here, for a clear error before anything starts;
  // every process then loads them itself (each would on its own host).
  ProcessOptions checked;
  if (auto code = load_auth(pf, checked)) return *code;
  // No launcher here (--launcher auto found none): flags for ranks under one
  // mean nothing, and saying so catches a launcher whose variables are missing.
  const std::pair<bool, const char*> launched_only[] = {{!lf.rendezvous.empty(), "--rendezvous"},
                                                        {lf.port != 0, "--port"},
                                                        {!lf.address.empty(), "--address"},
                                                        {!lf.interface.empty(), "--interface"}};
  for (const auto& [given, flag] : launched_only)
    if (given)
      logger().warn("{} is for ranks under a launcher, and no launcher started this process (--launcher {}): ignored",
                    flag, lf.launcher);
  if (lf.print_layout) {
    std::printf("launcher local: asgd cluster starts 1 coordinator, %u shard and %u worker processes on this "
                "machine\n", config.shards, config.workers);
    return kExitOk;
  }
  print_job_heading("cluster", config, Placement::processes);
  std::printf("asgd cluster: 1 coordinator, %u shard and %u worker processes on this machine%s\n", config.shards,
              config.workers, checked.curve ? ", authenticated and encrypted (CURVE)" : "");
  std::fflush(stdout);
  LocalClusterOptions o = local_cluster_options(jo, pf, config);
  Interrupts interrupts;
  auto status = LocalCluster(std::move(o)).run(interrupts.token());
  if (!status) {
    print_error(status.status().message());
    return kExitFailure;
  }
  return *status;
}

}  // namespace

// asgd cluster's flags for a rank a launcher started (Slurm, MPI, ...).
void add_launch_flags(CLI::App* cluster, LaunchFlags& launch) {
  const std::string launched = "Under a launcher (each rank runs this same command)";
  cluster->add_option("--launcher", launch.launcher,
                      "who started this process: auto | local | env | slurm | mpi | kubernetes | torchrun "
                      "(default auto: read from the environment; local: start the processes here)")
      ->type_name("NAME")
      ->group(launched);
  cluster->add_option("--port", launch.port,
                      "the coordinator's port when the launcher gives none (default: derived from Slurm's job id)")
      ->type_name("P")
      ->group(launched);
  cluster->add_option("--rendezvous", launch.rendezvous,
                      "a file on a filesystem every rank shares: rank 0 writes its endpoint there, the others wait "
                      "for it (MPI without ASGD_COORDINATOR)")
      ->type_name("FILE")
      ->group(launched);
  cluster->add_option("--address", launch.address,
                      "this rank's address to listen on and announce (default $ASGD_ADDRESS, else the one that "
                      "routes to the coordinator)")
      ->type_name("ADDR")
      ->group(launched);
  cluster->add_option("--interface", launch.interface,
                      "listen on and announce the address of this network interface (eth0, ib0, ...)")
      ->type_name("NAME")
      ->group(launched);
  cluster->add_option("--collective", launch.collective,
                      "allreduce's all-reduce among the workers: own (asgd's ring, or shared memory on one host) | "
                      "mpi (Open MPI's MPI_Allreduce; under mpirun) (default own)")
      ->type_name("NAME")
      ->group(launched);
  cluster->add_flag("--print-layout", launch.print_layout,
                    "print what this rank detected (launcher, rank, role, coordinator, address) and exit")
      ->group(launched);
}

std::function<int(const std::string&)> add_cluster_commands(CLI::App& app) {
  struct All {
    JobOptions cluster_job, coord_job;
    ProcessFlags cluster, coord, shard, worker;
    LaunchFlags launch;
  };
  auto all = std::make_shared<All>();
  auto* cluster = app.add_subcommand("cluster", "run the job as separate processes on this machine");
  add_job_flags(cluster, all->cluster_job, false);
  cluster->add_option("--join-timeout", all->cluster.join_timeout_s,
                      "seconds to wait for the processes to start and register (default 60)")
      ->type_name("S")
      ->check(positive(true, kMaxWaitS));
  cluster->add_option("--max-restarts", all->cluster.max_restarts,
                      "start a worker process that died again (it rejoins at the next epoch), and with "
                      "--checkpoint-dir a shard process (it reloads its checkpoint): at most N times each "
                      "(default 3; 0: never); never one that exited with a usage error (status 2)")
      ->type_name("N");
  add_auth_flags(cluster, all->cluster, true);  // --coordinator-key: under a launcher
  add_shared_memory_flag(cluster, all->cluster.shared_memory);
  add_busy_poll_flag(cluster, all->cluster.busy_poll_us);
  add_worker_placement_flags(cluster, all->cluster);
  add_launch_flags(cluster, all->launch);
  auto* coord = app.add_subcommand("coordinator", "run the coordinator of a job whose shards and workers connect to it");
  add_job_flags(coord, all->coord_job, false);
  add_process_flags(coord, all->coord, true, false);
  add_auth_flags(coord, all->coord, false);
  // asgd cluster's own: it tells the coordinator which processes ended.
  coord->add_flag("--supervised", all->coord.supervised)->group("");
  auto* shard = app.add_subcommand("shard", "run one parameter shard for the coordinator at --coordinator");
  add_process_flags(shard, all->shard, true, true);
  add_auth_flags(shard, all->shard, true);
  add_log_flags(shard, all->shard.log);
  auto* worker = app.add_subcommand("worker", "run one worker for the coordinator at --coordinator");
  add_process_flags(worker, all->worker, false, true);
  add_auth_flags(worker, all->worker, true);
  worker->add_option("--data-dir", all->worker.data_dir, "the dataset's folder on this host (default: the job's)")
      ->type_name("DIR");
  worker->add_option("--device", all->worker.device,
                     "compute here on cpu, cuda (GPU 0) or cuda:K instead of the job's --device item for this "
                     "worker's index")
      ->type_name("DEVICE")
      ->check(CLI::Validator(
          [](std::string& text) {
            auto device = Device::parse(text);
            return device ? std::string() : device.status().message();
          },
          "", "device"));
  add_log_flags(worker, all->worker.log);
  return [all](const std::string& name) {
    if (name == "cluster") return run_cluster(all->cluster_job, all->cluster, all->launch);
    if (name == "coordinator") return run_coordinator(all->coord_job, all->coord);
    if (name == "shard") return run_role(all->shard, true);
    return run_role(all->worker, false);
  };
}

}  // namespace asgd::cli
