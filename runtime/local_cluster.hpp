#pragma once
// LocalCluster: a job as processes on this machine (asgd cluster). It starts
// the coordinator process, reads where it listens, starts the shard and
// worker processes, prints every process's output with its name in front,
// restarts a shard or worker process that dies (within --max-restarts; a
// shard only when the job checkpoints), tells the coordinator of every
// death through its standard input, and ends a shard the coordinator finds
// silent without exiting. It ends when the coordinator has ended and every
// process has been reaped.
//
// The supervision protocol between the two, one line per event: the
// supervisor writes to the coordinator's stdin
//   exited shard|worker INDEX PID restarting|final TEXT
// and the coordinator prints on stdout
//   asgd supervision: silent shard|worker INDEX pid PID
//   asgd supervision: alive        (each second; not shown)
//   asgd supervision: stopping     (the job has ended: restart nothing)
// (read_supervision, say_alive, say_stopping and say_silent below
// are the coordinator's side). A coordinator that says nothing for
// --heartbeat-timeout (stopped, hung) is ended, and the job with it; a
// coordinator whose supervisor is gone (its stdin closed) stops the job.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "asgd/status.hpp"
#include "runtime/cluster.hpp"

namespace asgd {

struct LocalClusterOptions {
  /// The asgd executable every process runs (its `coordinator`, `shard` and
  /// `worker` commands).
  std::string program = "/proc/self/exe";
  /// The coordinator's arguments after `coordinator --supervised`: where it
  /// listens, the job's flags, the keys.
  std::vector<std::string> coordinator_args;
  /// Added to every shard's and worker's arguments (after --coordinator
  /// ENDPOINT --index I): the join timeout, the log level, the keys.
  std::vector<std::string> role_args;
  /// Added to worker i's arguments after role_args where there is an
  /// entry i (its CPUs and scheduling: `--cpus LIST`, `--scheduling batch`).
  std::vector<std::vector<std::string>> worker_args;
  std::uint32_t shards = 1;
  std::uint32_t workers = 2;
  /// How long the coordinator has to say where it listens.
  double join_timeout_s = 60.0;
  /// Restarts of each shard or worker process, at most.
  std::uint32_t max_restarts = 3;
  /// Whether a dead shard can be restarted: the job writes checkpoints.
  bool shards_restartable = false;
  /// The exit status with which a process refuses its arguments or its
  /// host (asgd's usage errors: a bad flag, a device it lacks). Such a
  /// process is not started again: it would refuse the same way.
  int usage_exit_status = 2;
  /// How long the coordinator may say nothing before it is taken for
  /// stopped or hung (the job's --heartbeat-timeout, at least 3 s, as the
  /// shards and workers wait for it).
  double coordinator_silence_s = 10.0;
};

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  /// Runs the job's processes until the coordinator has ended and every
  /// process is reaped (`stop`: each is sent SIGTERM, and the coordinator
  /// stops the job). Returns the coordinator's exit status. Errors:
  /// io_error when the coordinator cannot be started.
  Result<int> run(std::stop_token stop);

  struct Child;

 private:
  void supervise(std::stop_token stop);
  void read_output(std::string& endpoint, std::vector<std::string>& silent);
  void end_silent(const std::vector<std::string>& silent);
  bool start_roles(const std::string& endpoint);
  void restart_dead(std::stop_token stop);
  void stop_all(int signal);
  void drain_and_reap();
  void tell_coordinator(const Child& c, bool restarting, std::string what);
  bool coordinator_silent() const;

  LocalClusterOptions options_;
  std::vector<std::unique_ptr<Child>> children_;  // [0]: the coordinator
  std::vector<std::uint32_t> shard_restarts_;
  std::vector<std::uint32_t> worker_restarts_;
  int to_coordinator_ = -1;  // the write end of the coordinator's stdin
  std::optional<std::chrono::steady_clock::time_point> last_alive_;  // the coordinator's last "alive" line
  bool stopping_ = false;  // the coordinator said the job has ended
  bool said_coordinator_end_ = false;  // its death by a signal was logged as it was seen
};

/// A supervised coordinator's line, printed before it tells the processes
/// that the job has ended.
void say_stopping();

/// A supervised coordinator's "alive" line, printed each second until `stop`.
void say_alive(std::stop_token stop);

/// A supervised coordinator's line when shard `index`'s process `pid` is
/// silent past --heartbeat-timeout (or worker `index`'s was declared lost).
void say_silent(bool shard, std::uint32_t index, std::uint32_t pid);

/// The coordinator's side: reads the supervisor's lines from standard input
/// into `supervision` until `stop` or the supervisor is gone.
void read_supervision(std::stop_token stop, const std::shared_ptr<Supervision>& supervision);

}  // namespace asgd
