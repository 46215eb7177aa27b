// `asgd cluster` (the job as local processes) and the one-role commands
// `asgd coordinator`, `asgd shard`, `asgd worker` for several hosts.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "messaging/curve_auth.hpp"
#include "runtime/cluster.hpp"
#include "tools/asgd/commands.hpp"

extern char** environ;

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
};

// Between asgd cluster and the coordinator process it starts, one line per
// event. The supervisor writes to the coordinator's stdin
//   exited shard|worker INDEX PID restarting|final TEXT
// when a shard or worker process ends, and the coordinator prints on stdout
//   asgd supervision: silent shard INDEX pid PID
// when a shard process has been silent past --heartbeat-timeout without
// exiting (stopped, hung), for the supervisor to end it.
constexpr std::string_view kSilentShard = "asgd supervision: silent shard ";

// The coordinator side: reads the supervisor's lines from stdin into
// `supervision` until `stop`.
void read_supervisor(std::stop_token stop, const std::shared_ptr<Supervision>& supervision) {
  std::string pending;
  char buf[1024];
  while (!stop.stop_requested()) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n <= 0) return;  // the supervisor is gone
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::istringstream line(pending.substr(0, nl));
      pending.erase(0, nl + 1);
      std::string word, role, how;
      ProcessExit e;
      if (!(line >> word >> role >> e.index >> e.pid >> how) || word != "exited" ||
          (role != "shard" && role != "worker") || (how != "restarting" && how != "final")) {
        spdlog::warn("coordinator: ignored a line from the supervisor that it does not understand");
        continue;
      }
      e.shard = role == "shard";
      e.restarting = how == "restarting";
      std::getline(line >> std::ws, e.what);
      supervision->exited(std::move(e));
    }
  }
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
                    "--coordinator endpoint carries)")
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

void add_process_flags(CLI::App* cmd, ProcessFlags& f, bool listens, bool needs_coordinator) {
  if (needs_coordinator)
    cmd->add_option("--coordinator", f.coordinator, "the coordinator's endpoint, tcp://HOST:PORT")
        ->type_name("ENDPOINT")
        ->required();
  if (listens)
    cmd->add_option("--listen", f.listen, "where to listen (default tcp://127.0.0.1:0, a free port)")
        ->type_name("ENDPOINT");
  cmd->add_option("--join-timeout", f.join_timeout_s, "seconds to wait for the other processes (default 60)")
      ->type_name("S");
  if (needs_coordinator)
    cmd->add_option("--index", f.index, "ask for this index (default: the first free one)")->type_name("K");
}

ProcessOptions process_options(const ProcessFlags& pf) {
  ProcessOptions po;
  po.coordinator = pf.coordinator;
  po.listen = pf.listen;
  po.join_timeout_s = pf.join_timeout_s;
  po.data_dir = pf.data_dir;
  if (pf.index >= 0) po.index = static_cast<std::uint32_t>(pf.index);
  return po;
}

int run_coordinator(const JobOptions& jo, const ProcessFlags& pf) {
  JobConfig config;
  if (auto code = load_job(jo, config)) return *code;
  if (Status s = validate_for_cluster(config); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  ProcessOptions po = process_options(pf);
  if (auto code = load_auth(pf, po)) return *code;
  Interrupts interrupts;
  po.shards = config.shards;
  po.workers = config.workers;
  std::jthread supervisor_lines;
  if (pf.supervised) {
    po.supervision = std::make_shared<Supervision>();
    po.supervision->on_silent_shard = [](std::uint32_t index, std::uint32_t pid) {
      std::printf("%.*s%u pid %u\n", static_cast<int>(kSilentShard.size()), kSilentShard.data(), index, pid);
      std::fflush(stdout);
    };
    supervisor_lines = std::jthread(read_supervisor, po.supervision);
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
  ProcessOptions po = process_options(pf);
  if (auto code = load_auth(pf, po)) return *code;
  Interrupts interrupts;
  Status s = shard ? run_shard_process(po, interrupts.token()) : run_worker_process(po, interrupts.token());
  if (!s.ok()) {
    print_error(s.to_string());
    return exit_code_for(s);
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------
// asgd cluster

struct Child {
  std::string name;
  std::vector<std::string> args;  // how it was started (a shard or worker is started again with them)
  bool shard = false;
  bool worker = false;
  std::uint32_t index = 0;
  bool replaced = false;  // dead, and dealt with: restarted, or left dead
  pid_t pid = -1;
  int out = -1;        // read end of its stdout+stderr
  std::string partial;  // an unfinished line
  bool exited = false;
  int status = 0;
};

// Starts this executable with `args`, its output on a pipe, and with
// `stdin_fd` (when >= 0) as its standard input.
Result<Child> spawn_self(const std::string& name, const std::vector<std::string>& args, int stdin_fd = -1) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::IOError("pipe: " + std::string(std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  if (stdin_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdin_fd, STDIN_FILENO);
  std::vector<std::string> argv_s = {"/proc/self/exe"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return Status::IOError("starting the " + name + " process: " + std::strerror(rc));
  }
  Child c;
  c.name = name;
  c.args = args;
  c.pid = pid;
  c.out = fds[0];
  return c;
}

// Reads what is there; prints whole lines with the child's name in front.
// Returns the lines read (for the coordinator's endpoint).
std::vector<std::string> pump(Child& c) {
  std::vector<std::string> lines;
  char buf[4096];
  const ssize_t n = read(c.out, buf, sizeof buf);
  if (n <= 0) {
    if (!c.partial.empty()) lines.push_back(std::move(c.partial));
    c.partial.clear();
    close(c.out);
    c.out = -1;
  } else {
    c.partial.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = c.partial.find('\n')) != std::string::npos) {
      lines.push_back(c.partial.substr(0, nl));
      c.partial.erase(0, nl + 1);
    }
  }
  for (const auto& l : lines) std::printf("[%s] %s\n", c.name.c_str(), l.c_str());
  std::fflush(stdout);
  return lines;
}

bool reap(Child& c, bool block) {
  if (c.exited) return true;
  int status = 0;
  const pid_t r = waitpid(c.pid, &status, block ? 0 : WNOHANG);
  if (r == c.pid) {
    c.exited = true;
    c.status = status;
  }
  return c.exited;
}

int exit_status(const Child& c) {
  if (WIFEXITED(c.status)) return WEXITSTATUS(c.status);
  return kExitFailure;
}

std::string how_it_ended(const Child& c) {
  if (WIFSIGNALED(c.status)) {
    const int sig = WTERMSIG(c.status);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "exited with status " + std::to_string(exit_status(c));
}

int run_cluster(const JobOptions& jo, const ProcessFlags& pf) {
  JobConfig config;
  if (auto code = load_job(jo, config)) return *code;
  if (Status s = validate_for_cluster(config); !s.ok()) {
    print_error(s.message());
    return kExitUsage;
  }
  // The keys are checked here, for a clear error before anything starts;
  // every process then loads them itself (each would on its own host).
  ProcessOptions checked;
  if (auto code = load_auth(pf, checked)) return *code;
  std::vector<std::string> auth_args;
  if (!pf.auth_keys.empty()) {
    auth_args = {"--auth-keys", std::filesystem::absolute(pf.auth_keys).string()};
    if (!pf.key_file.empty()) {
      auth_args.push_back("--key");
      auth_args.push_back(std::filesystem::absolute(pf.key_file).string());
    }
  }
  print_adjustments(training_settings(config, Placement::processes));
  std::printf("asgd cluster: 1 coordinator, %u shard and %u worker processes on this machine%s\n", config.shards,
              config.workers, checked.curve ? ", authenticated and encrypted (CURVE)" : "");
  std::fflush(stdout);
  Interrupts interrupts;
  const bool restartable = !config.checkpoint_dir.empty() && config.checkpoint_every_s > 0;
  std::vector<std::uint32_t> shard_restarts(config.shards, 0), worker_restarts(config.workers, 0);
  std::vector<std::string> coord_args = {"coordinator", "--supervised", "--listen", pf.listen, "--join-timeout",
                                         std::to_string(pf.join_timeout_s)};
  for (auto& a : given_job_flags(jo)) coord_args.push_back(a);
  coord_args.insert(coord_args.end(), auth_args.begin(), auth_args.end());
  // The coordinator hears of every process that ends through its stdin.
  int to_coordinator[2];
  if (pipe2(to_coordinator, O_CLOEXEC) != 0) {
    print_error(std::string("pipe: ") + std::strerror(errno));
    return kExitFailure;
  }
  std::signal(SIGPIPE, SIG_IGN);  // a coordinator that has ended must not end us
  std::vector<Child> children;
  auto coordinator = spawn_self("coordinator", coord_args, to_coordinator[0]);
  close(to_coordinator[0]);
  if (!coordinator) {
    close(to_coordinator[1]);
    print_error(coordinator.status().message());
    return kExitFailure;
  }
  children.push_back(std::move(coordinator).value());
  auto tell_coordinator = [fd = to_coordinator[1]](const Child& c, bool restarting, std::string what) {
    std::replace(what.begin(), what.end(), '\n', ' ');
    const std::string line = std::string("exited ") + (c.shard ? "shard " : "worker ") + std::to_string(c.index) +
                             " " + std::to_string(c.pid) + (restarting ? " restarting " : " final ") + what + "\n";
    if (write(fd, line.data(), line.size()) < 0 && errno != EPIPE)
      spdlog::warn("telling the coordinator that {} ended: {}", c.name, std::strerror(errno));
  };

  auto stop_all = [&](int sig) {
    for (auto& c : children)
      if (!c.exited) kill(c.pid, sig);
  };
  // Waits for the coordinator's endpoint, then starts the others.
  std::string endpoint;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(pf.join_timeout_s);
  bool started = false;
  const auto started_at = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> coordinator_done;
  std::vector<std::string> silent;  // the coordinator's "silent shard" lines, to act on
  while (true) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.out >= 0) fds.push_back({c.out, POLLIN, 0});
    if (!fds.empty()) poll(fds.data(), fds.size(), 100);
    for (auto& c : children) {
      if (c.out < 0) continue;
      pollfd p{c.out, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) {
        for (const auto& line : pump(c)) {
          const std::string tag = "coordinator listening on ";
          if (&c == &children[0] && endpoint.empty() && line.rfind(tag, 0) == 0) endpoint = line.substr(tag.size());
          if (&c == &children[0] && line.rfind(kSilentShard, 0) == 0) silent.push_back(line.substr(kSilentShard.size()));
        }
      }
    }
    // A shard the coordinator found silent but that has not exited (stopped,
    // hung) is ended here, so it is restarted or given up on like a dead one.
    for (const std::string& text : silent) {
      std::uint32_t index = 0, pid = 0;
      if (std::sscanf(text.c_str(), "%u pid %u", &index, &pid) != 2) continue;
      for (auto& c : children)
        if (c.shard && c.index == index && c.pid == static_cast<pid_t>(pid) && !reap(c, false)) {
          spdlog::warn("{} (pid {}) is silent but has not exited: ending it (SIGKILL)", c.name, c.pid);
          kill(c.pid, SIGKILL);
        }
    }
    silent.clear();
    for (auto& c : children) reap(c, false);
    if (!started && !endpoint.empty()) {
      started = true;
      // Shards first: workers connect to them once the coordinator assigns.
      bool ok = true;
      for (const auto& [role, count] : {std::pair<std::string, std::uint32_t>{"shard", config.shards},
                                        std::pair<std::string, std::uint32_t>{"worker", config.workers}}) {
        for (std::uint32_t i = 0; ok && i < count; ++i) {
          // With CURVE the endpoint carries the coordinator's public key.
          std::vector<std::string> args = {role, "--coordinator", endpoint, "--index", std::to_string(i),
                                           "--join-timeout", std::to_string(pf.join_timeout_s), "--log-level",
                                           jo.log.log_level};
          args.insert(args.end(), auth_args.begin(), auth_args.end());
          auto c = spawn_self(role + " " + std::to_string(i), args);
          if (!c) {
            print_error(c.status().message());
            stop_all(SIGTERM);
            ok = false;
            break;
          }
          c->shard = role == "shard";
          c->worker = role == "worker";
          c->index = i;
          children.push_back(std::move(c).value());
        }
      }
    }
    if (!started && (children[0].exited || std::chrono::steady_clock::now() > deadline)) {
      if (!children[0].exited) print_error("the coordinator did not say where it listens");
      stop_all(SIGTERM);
      break;
    }
    if (interrupts.token().stop_requested()) {
      // Ctrl-C: the coordinator stops the job and tells the others.
      stop_all(SIGTERM);
      break;
    }
    // A shard or worker process that died while the job runs is started
    // again: it registers for its index; the coordinator has a shard reload
    // its checkpoint, and a worker rejoin at the next epoch
    // (docs/cluster.md, "When a process dies").
    std::vector<Child> restarted;
    for (auto& c : children) {
      if (!(c.shard || c.worker) || !c.exited || c.replaced || children[0].exited ||
          interrupts.token().stop_requested())
        continue;
      c.replaced = true;
      if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) continue;
      std::string what = c.name + " (pid " + std::to_string(c.pid) + ") " + how_it_ended(c);
      if (c.shard && !restartable) {
        what += "; the job writes no checkpoints (--checkpoint-dir), so it cannot be restarted";
        spdlog::error("{}", what);
        tell_coordinator(c, false, what);
        continue;
      }
      std::uint32_t& count = (c.shard ? shard_restarts : worker_restarts)[c.index];
      if (count >= pf.max_restarts) {
        what += fmt::format("; it was restarted {} time(s) already and --max-restarts is {}", count, pf.max_restarts);
        spdlog::error("{}", what);
        tell_coordinator(c, false, what);
        continue;
      }
      ++count;
      spdlog::warn("{}; starting it again ({} of at most {})", what, count, pf.max_restarts);
      tell_coordinator(c, true, what);
      auto again = spawn_self(c.name, c.args);
      if (!again) {
        spdlog::error("restarting {}: {}", c.name, again.status().message());
        continue;
      }
      again->shard = c.shard;
      again->worker = c.worker;
      again->index = c.index;
      restarted.push_back(std::move(again).value());
    }
    for (auto& c : restarted) children.push_back(std::move(c));
    if (children[0].exited && !coordinator_done) coordinator_done = std::chrono::steady_clock::now();
    bool all_done = true;
    for (auto& c : children) all_done = all_done && c.exited && c.out < 0;
    if (all_done) break;
    // The others stop when the coordinator says so; give them a few seconds.
    if (coordinator_done && std::chrono::steady_clock::now() - *coordinator_done > std::chrono::seconds(10)) {
      stop_all(SIGTERM);
      break;
    }
  }
  (void)started_at;
  // Drain and reap everyone; a child that ignores SIGTERM for 5 s is killed.
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    bool all = true;
    for (auto& c : children) {
      if (c.out >= 0) {
        pollfd p{c.out, POLLIN, 0};
        if (poll(&p, 1, 20) > 0) pump(c);
      }
      all = reap(c, false) && all;
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > grace) {
      stop_all(SIGKILL);
      for (auto& c : children) reap(c, true);
      break;
    }
  }
  for (auto& c : children)
    while (c.out >= 0) pump(c);
  int failed = 0;
  for (auto& c : children)
    if (exit_status(c) != 0 && &c != &children[0] && !c.replaced) ++failed;
  if (failed > 0) spdlog::warn("{} of the shard and worker processes did not exit cleanly", failed);
  for (const auto& [role, counts] : {std::pair{"shard", &shard_restarts}, std::pair{"worker", &worker_restarts}})
    for (std::uint32_t i = 0; i < counts->size(); ++i)
      if ((*counts)[i] > 0) spdlog::info("{} {}'s process was restarted {} time(s)", role, i, (*counts)[i]);
  close(to_coordinator[1]);
  return exit_status(children[0]);
}

}  // namespace

std::function<int(const std::string&)> add_cluster_commands(CLI::App& app) {
  struct All {
    JobOptions cluster_job, coord_job;
    ProcessFlags cluster, coord, shard, worker;
  };
  auto all = std::make_shared<All>();
  auto* cluster = app.add_subcommand("cluster", "run the job as separate processes on this machine");
  add_job_flags(cluster, all->cluster_job);
  cluster->add_option("--join-timeout", all->cluster.join_timeout_s,
                      "seconds to wait for the processes to start and register (default 60)")
      ->type_name("S");
  cluster->add_option("--max-restarts", all->cluster.max_restarts,
                      "start a worker process that died again (it rejoins at the next epoch), and with "
                      "--checkpoint-dir a shard process (it reloads its checkpoint): at most N times each "
                      "(default 3; 0: never)")
      ->type_name("N");
  add_auth_flags(cluster, all->cluster, false);
  auto* coord = app.add_subcommand("coordinator", "run the coordinator of a job whose shards and workers connect to it");
  add_job_flags(coord, all->coord_job);
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
  add_log_flags(worker, all->worker.log);
  return [all](const std::string& name) {
    if (name == "cluster") return run_cluster(all->cluster_job, all->cluster);
    if (name == "coordinator") return run_coordinator(all->coord_job, all->coord);
    if (name == "shard") return run_role(all->shard, true);
    return run_role(all->worker, false);
  };
}

}  // namespace asgd::cli
