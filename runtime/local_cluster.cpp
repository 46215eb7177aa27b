#include "runtime/local_cluster.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include "actors/checkpoint.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

extern char** environ;

namespace asgd {

namespace {

constexpr std::string_view kSupervision = "asgd supervision: ";  // lines for the supervisor, not shown
constexpr std::string_view kSilent = "asgd supervision: silent ";
constexpr std::string_view kAlive = "asgd supervision: alive";
constexpr std::string_view kStopping = "asgd supervision: stopping";
constexpr std::string_view kListening = "coordinator listening on ";
constexpr auto kAliveEvery = std::chrono::seconds(1);
using SteadyClock = std::chrono::steady_clock;

}  // namespace

struct LocalCluster::Child {
  std::string name;
  std::vector<std::string> args;  // how it was started (a shard or worker is started again with them)
  bool shard = false;
  bool worker = false;
  std::uint32_t index = 0;
  bool replaced = false;  // dead, and dealt with: restarted, or left dead
  bool restart = false;   // started again in a dead one's place
  pid_t pid = -1;
  int out = -1;         // read end of its stdout+stderr
  std::string partial;  // an unfinished line
  bool exited = false;
  int status = 0;
  bool said_waiting = false;  // drain_and_reap said why it waits for it

  ~Child() {
    if (out >= 0) close(out);
  }

  // Reads what is there; prints whole lines with the child's name in front.
  // Returns the lines read.
  std::vector<std::string> pump() {
    std::vector<std::string> lines;
    char buf[4096];
    const ssize_t n = read(out, buf, sizeof buf);
    if (n <= 0) {
      if (!partial.empty()) lines.push_back(std::move(partial));
      partial.clear();
      close(out);
      out = -1;
    } else {
      partial.append(buf, static_cast<std::size_t>(n));
      std::size_t nl;
      while ((nl = partial.find('\n')) != std::string::npos) {
        lines.push_back(partial.substr(0, nl));
        partial.erase(0, nl + 1);
      }
    }
    for (const auto& l : lines)
      if (!l.starts_with(kSupervision)) std::printf("[%s] %s\n", name.c_str(), l.c_str());
    std::fflush(stdout);
    return lines;
  }

  bool reap(bool block) {
    if (exited) return true;
    int s = 0;
    if (waitpid(pid, &s, block ? 0 : WNOHANG) == pid) {
      exited = true;
      status = s;
    }
    return exited;
  }

  int exit_status() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 1; }

  std::string how_it_ended() const { return asgd::how_it_ended(status); }
};

namespace {

// Starts `program` with `args`, its output on a pipe, and with `stdin_fd`
// (when >= 0) as its standard input.
Result<std::unique_ptr<LocalCluster::Child>> spawn(const std::string& program, const std::string& name,
                                                   const std::vector<std::string>& args, int stdin_fd = -1) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::IOError("pipe: " + std::string(std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  if (stdin_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdin_fd, STDIN_FILENO);
  std::vector<std::string> argv_s = {program == "/proc/self/exe" ? own_program_path() : program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return Status::IOError("starting the " + name + " process: " + std::strerror(rc));
  }
  auto c = std::make_unique<LocalCluster::Child>();
  c->name = name;
  c->args = args;
  c->pid = pid;
  c->out = fds[0];
  return c;
}

}  // namespace

LocalCluster::LocalCluster(LocalClusterOptions options)
    : options_(std::move(options)),
      shard_restarts_(options_.shards, 0),
      worker_restarts_(options_.workers, 0) {}

LocalCluster::~LocalCluster() {
  if (to_coordinator_ >= 0) close(to_coordinator_);
}

Result<int> LocalCluster::run(std::stop_token stop) {
  std::vector<std::string> args = {"coordinator", "--supervised"};
  args.insert(args.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  // The coordinator hears of every process that ends through its stdin.
  int to_coordinator[2];
  if (pipe2(to_coordinator, O_CLOEXEC) != 0) return Status::IOError(std::string("pipe: ") + std::strerror(errno));
  std::signal(SIGPIPE, SIG_IGN);  // a coordinator that has ended must not end us
  auto coordinator = spawn(options_.program, "coordinator", args, to_coordinator[0]);
  close(to_coordinator[0]);
  to_coordinator_ = to_coordinator[1];
  if (!coordinator) return coordinator.status();
  children_.push_back(std::move(coordinator).value());
  supervise(stop);
  drain_and_reap();
  const Child& ended = *children_[0];
  if (WIFSIGNALED(ended.status) && !said_coordinator_end_)
    logger().error("the coordinator (pid {}) {}", ended.pid, ended.how_it_ended());
  int failed = 0;
  for (std::size_t i = 1; i < children_.size(); ++i)
    if (children_[i]->exit_status() != 0 && !children_[i]->replaced) ++failed;
  // (When the job failed, the others were told so and exit with a failure too.)
  if (failed > 0 && ended.exit_status() == 0)
    logger().warn("{} of the shard and worker processes did not exit cleanly", failed);
  // Restarts the coordinator refused (a usage error's exit) were no restarts.
  const auto refused = [&](bool shard, std::uint32_t i) {
    return std::count_if(children_.begin(), children_.end(), [&](const auto& c) {
      return c->restart && c->shard == shard && c->index == i && WIFEXITED(c->status) &&
             WEXITSTATUS(c->status) == options_.usage_exit_status;
    });
  };
  for (const bool shard : {true, false})
    for (std::uint32_t i = 0; i < (shard ? shard_restarts_ : worker_restarts_).size(); ++i)
      if (const std::uint32_t count = (shard ? shard_restarts_ : worker_restarts_)[i]; count > 0) {
        const auto no = refused(shard, i);
        logger().info("{} {}'s process was restarted {} time(s){}", shard ? "shard" : "worker", i, count,
                      no > 0 ? fmt::format(" ({} of them refused by the coordinator)", no) : "");
      }
  return ended.exit_status();
}

// Waits for the coordinator's endpoint, starts the others, and keeps them
// going until the coordinator has ended and the rest followed.
void LocalCluster::supervise(std::stop_token stop) {
  std::string endpoint;
  const auto deadline = SteadyClock::now() + std::chrono::duration<double>(options_.join_timeout_s);
  bool started = false;
  std::optional<SteadyClock::time_point> coordinator_done;
  const Child& coordinator = *children_[0];
  while (true) {
    std::vector<std::string> silent;  // the coordinator's "silent shard" lines, to act on
    read_output(endpoint, silent);
    end_silent(silent);
    for (auto& c : children_) c->reap(false);
    if (!started && !endpoint.empty()) {
      started = true;
      if (!start_roles(endpoint)) stop_all(SIGTERM);
    }
    if (!started && (coordinator.exited || SteadyClock::now() > deadline)) {
      if (!coordinator.exited) logger().error("the coordinator did not say where it listens");
      stop_all(SIGTERM);
      return;
    }
    if (stop.stop_requested()) {
      // Ctrl-C: the coordinator stops the job and tells the others.
      stop_all(SIGTERM);
      return;
    }
    if (started && coordinator_silent()) {
      logger().error("the coordinator (pid {}) has said nothing for {:g} s (--heartbeat-timeout): it is stopped or "
                     "hung; ending it (SIGKILL) and the job",
                     coordinator.pid, options_.coordinator_silence_s);
      kill(coordinator.pid, SIGKILL);
      stop_all(SIGTERM);
      return;
    }
    restart_dead(stop);
    if (coordinator.exited && !coordinator_done) {
      coordinator_done = SteadyClock::now();
      // Said first: the others, stopped for it, each say they were
      // interrupted (the cause came last, after all of theirs).
      if (WIFSIGNALED(coordinator.status) && !said_coordinator_end_) {
        logger().error("the coordinator (pid {}) {}: the job stops", coordinator.pid, coordinator.how_it_ended());
        said_coordinator_end_ = true;
      }
    }
    const bool all_done =
        std::all_of(children_.begin(), children_.end(), [](const auto& c) { return c->exited && c->out < 0; });
    if (all_done) return;
    // The others stop when the coordinator says so; give them a few seconds.
    // A coordinator that ended without telling them (it failed before the
    // job started: a bad --metrics-out) leaves nobody to wait for.
    if (coordinator_done &&
        ((coordinator.out < 0 && !stopping_) || SteadyClock::now() - *coordinator_done > std::chrono::seconds(10))) {
      stop_all(SIGTERM);
      return;
    }
  }
}

// Prints what the processes wrote (waiting up to 100 ms for any), and picks
// the coordinator's endpoint and its "silent" lines out of its output.
void LocalCluster::read_output(std::string& endpoint, std::vector<std::string>& silent) {
  std::vector<pollfd> fds;
  for (auto& c : children_)
    if (c->out >= 0) fds.push_back({c->out, POLLIN, 0});
  if (!fds.empty()) poll(fds.data(), fds.size(), 100);
  for (auto& c : children_) {
    if (c->out < 0) continue;
    pollfd p{c->out, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) continue;
    for (const auto& line : c->pump()) {
      if (c != children_[0]) continue;
      if (endpoint.empty() && line.starts_with(kListening)) endpoint = line.substr(kListening.size());
      if (line.starts_with(kSilent)) silent.push_back(line.substr(kSilent.size()));
      if (line.starts_with(kAlive)) last_alive_ = SteadyClock::now();
      if (line.starts_with(kStopping)) stopping_ = true;
    }
  }
}

// A shard the coordinator found silent, or a worker it declared lost, that
// has not exited (stopped, hung) is ended here, so that it is restarted or
// given up on like a dead one.
void LocalCluster::end_silent(const std::vector<std::string>& silent) {
  for (const std::string& text : silent) {
    char role[16] = {};
    std::uint32_t index = 0, pid = 0;
    if (std::sscanf(text.c_str(), "%15s %u pid %u", role, &index, &pid) != 3) continue;
    const bool shard = std::string_view(role) == "shard";
    if (!shard && std::string_view(role) != "worker") continue;
    for (auto& c : children_)
      if (c->shard == shard && c->index == index && c->pid == static_cast<pid_t>(pid) && !c->reap(false)) {
        logger().warn("{} (pid {}) is silent but has not exited: ending it (SIGKILL)", c->name, c->pid);
        kill(c->pid, SIGKILL);
      }
  }
}

// Shards first: workers connect to them once the coordinator assigns.
bool LocalCluster::start_roles(const std::string& endpoint) {
  for (const auto& [role, count] : {std::pair<std::string, std::uint32_t>{"shard", options_.shards},
                                    std::pair<std::string, std::uint32_t>{"worker", options_.workers}}) {
    for (std::uint32_t i = 0; i < count; ++i) {
      // With CURVE the endpoint carries the coordinator's public key.
      std::vector<std::string> args = {role, "--coordinator", endpoint, "--index", std::to_string(i)};
      args.insert(args.end(), options_.role_args.begin(), options_.role_args.end());
      if (role == "worker" && i < options_.worker_args.size())
        args.insert(args.end(), options_.worker_args[i].begin(), options_.worker_args[i].end());
      auto c = spawn(options_.program, role + " " + std::to_string(i), args);
      if (!c) {
        logger().error("{}", c.status().message());
        return false;
      }
      (*c)->shard = role == "shard";
      (*c)->worker = role == "worker";
      (*c)->index = i;
      children_.push_back(std::move(c).value());
    }
  }
  return true;
}

// A shard or worker process that died while the job runs is started again:
// it registers for its index; the coordinator has a shard reload its
// checkpoint, and a worker rejoin at the next epoch (docs/cluster.md, "When
// a process dies").
void LocalCluster::restart_dead(std::stop_token stop) {
  std::vector<std::unique_ptr<Child>> restarted;
  // A process that gave up on a coordinator gone quiet is not restarted
  // while it is quiet: it may be stopped (then it is ended), not slow. (A
  // process gives up 3 s after its last echo, at least 2 s after the last
  // "alive" line; a late line only delays a restart.)
  const bool coordinator_heard =
      last_alive_ && SteadyClock::now() - *last_alive_ < kAliveEvery + std::chrono::milliseconds(500);
  for (auto& c : children_) {
    if (!(c->shard || c->worker) || !c->exited || c->replaced || children_[0]->exited || stop.stop_requested() ||
        (!coordinator_heard && !stopping_))
      continue;
    c->replaced = true;
    if (WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0) continue;
    const bool usage_error = WIFEXITED(c->status) && WEXITSTATUS(c->status) == options_.usage_exit_status;
    if (stopping_ && !usage_error) continue;  // the job has ended: told to stop, it said why itself
    std::string what = c->name + " (pid " + std::to_string(c->pid) + ") " + c->how_it_ended();
    std::uint32_t& count = (c->shard ? shard_restarts_ : worker_restarts_)[c->index];
    // Why it stays dead, if it does.
    std::string given_up;
    if (c->shard && !options_.shards_restartable)
      given_up = "the job writes no checkpoints (--checkpoint-dir), so it cannot be restarted";
    else if (usage_error)
      given_up = "that status is a usage error (its arguments, this host or the coordinator refused it), which a restart would "
                 "repeat";
    else if (count >= options_.max_restarts)
      given_up = fmt::format("it was restarted {} time(s) already and --max-restarts is {}", count,
                             options_.max_restarts);
    if (!given_up.empty()) {
      what += "; " + given_up;
      logger().error("{}", what);
      tell_coordinator(*c, false, what);
      continue;
    }
    ++count;
    logger().warn("{}; starting it again ({} of at most {})", what, count, options_.max_restarts);
    tell_coordinator(*c, true, what);
    auto again = spawn(options_.program, c->name, c->args);
    if (!again) {
      logger().error("restarting {}: {}", c->name, again.status().message());
      continue;
    }
    (*again)->shard = c->shard;
    (*again)->worker = c->worker;
    (*again)->index = c->index;
    (*again)->restart = true;
    restarted.push_back(std::move(again).value());
  }
  for (auto& c : restarted) children_.push_back(std::move(c));
}

// Whether the coordinator, which says it is alive each second, has said
// nothing for --heartbeat-timeout (only once it has said it at all: before,
// it is starting, and --join-timeout applies).
bool LocalCluster::coordinator_silent() const {
  if (!last_alive_ || children_[0]->exited) return false;
  return SteadyClock::now() - *last_alive_ > std::chrono::duration<double>(options_.coordinator_silence_s);
}

void LocalCluster::tell_coordinator(const Child& c, bool restarting, std::string what) {
  std::replace(what.begin(), what.end(), '\n', ' ');
  const std::string line = std::string("exited ") + (c.shard ? "shard " : "worker ") + std::to_string(c.index) + " " +
                           std::to_string(c.pid) + (restarting ? " restarting " : " final ") + what + "\n";
  if (write(to_coordinator_, line.data(), line.size()) < 0 && errno != EPIPE)
    logger().warn("telling the coordinator that {} ended: {}", c.name, std::strerror(errno));
}

void LocalCluster::stop_all(int signal) {
  for (auto& c : children_)
    if (!c->exited) kill(c->pid, signal);
}

// Drains and reaps everyone. A process still there 5 s after it was told
// to stop is killed (SIGKILL), but a shard only after kShardStopWait more:
// told to stop, it writes its last checkpoint, which a big shard on a slow
// disk may take that long to do (it gives up on it by itself then).
void LocalCluster::drain_and_reap() {
  const auto told = SteadyClock::now();
  constexpr auto kGrace = std::chrono::seconds(5);
  while (true) {
    bool all = true, waited_for_output = false;
    for (auto& c : children_) {
      if (c->out >= 0) {
        pollfd p{c->out, POLLIN, 0};
        waited_for_output = true;
        if (poll(&p, 1, 20) > 0) c->pump();
      }
      if (c->reap(false)) continue;
      const auto waited = SteadyClock::now() - told;
      if (waited > kGrace + (c->shard ? kShardStopWait : std::chrono::seconds(0))) {
        logger().warn("{} (pid {}) has not ended {:.0f} s after it was told to stop: ending it (SIGKILL)", c->name,
                      c->pid, std::chrono::duration<double>(waited).count());
        kill(c->pid, SIGKILL);
        c->reap(true);
        continue;
      }
      if (c->shard && waited > kGrace && !std::exchange(c->said_waiting, true))
        logger().info("waiting for {} (pid {}) to end: a shard told to stop may take up to {} s to write its last "
                      "checkpoint", c->name, c->pid, kShardStopWait.count());
      all = false;
    }
    if (all) break;
    // A process that closed its output gives no poll to wait on: the shard's
    // 30 s are not spent spinning.
    if (!waited_for_output) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : children_)
    while (c->out >= 0) c->pump();
}

namespace {

// One line to the supervisor on stdout, at once (one write: whole among
// the other threads' lines).
void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

void say_stopping() { say(std::string(kStopping)); }

void say_alive(std::stop_token stop) {
  auto next = SteadyClock::now();
  while (!stop.stop_requested()) {
    if (SteadyClock::now() >= next) {
      say(std::string(kAlive));
      next += kAliveEvery;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void say_silent(bool shard, std::uint32_t index, std::uint32_t pid) {
  say(std::string(kSilent) + (shard ? "shard " : "worker ") + std::to_string(index) + " pid " + std::to_string(pid));
}

void read_supervision(std::stop_token stop, const std::shared_ptr<Supervision>& supervision) {
  std::string pending;
  char buf[1024];
  while (!stop.stop_requested()) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n <= 0) {  // the supervisor is gone
      if (supervision->on_supervisor_gone) supervision->on_supervisor_gone();
      return;
    }
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::istringstream line(pending.substr(0, nl));
      pending.erase(0, nl + 1);
      std::string word, role, how;
      ProcessExit e;
      if (!(line >> word >> role >> e.index >> e.pid >> how) || word != "exited" ||
          (role != "shard" && role != "worker") || (how != "restarting" && how != "final")) {
        logger().warn("coordinator: ignored a line from the supervisor that it does not understand");
        continue;
      }
      e.shard = role == "shard";
      e.restarting = how == "restarting";
      std::getline(line >> std::ws, e.what);
      supervision->exited(std::move(e));
    }
  }
}

}  // namespace asgd
