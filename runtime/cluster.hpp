#pragma once
// One job as separate processes: a coordinator, M shard processes and N
// worker processes, on one host or several, talking through the bridge
// (messaging/bridge.hpp) over ZeroMQ.
//
//   coordinator  binds --listen, waits for M shards and N workers to
//                register (up to --join-timeout), hands each its part
//                (Assignment), runs the job as run_job does, writes the
//                metrics file, and tells every process to stop.
//   shard        binds its own endpoint, registers, serves its key range.
//   worker       registers, loads its data partition itself (the data must
//                be at --data-dir on its host), connects to every shard and
//                trains when told to.
// Every process sends a heartbeat each second; the coordinator fails the
// job naming a worker whose process is silent for --rpc-timeout, and a
// shard or worker process gives up when the coordinator is silent as long.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "asgd/job.hpp"
#include "messaging/collective.hpp"
#include "messaging/transport.hpp"

namespace asgd {

/// A shard or worker process that a supervisor (asgd cluster) saw end.
struct ProcessExit {
  bool shard = false;          ///< a shard process; else a worker process
  std::uint32_t index = 0;
  std::uint32_t pid = 0;
  bool restarting = false;     ///< the supervisor is starting it again; else it will not
  std::string what;            ///< for messages: "shard 1 (pid 4242) was killed by signal 9 (SIGKILL)"
};

/// What a supervisor that started the job's processes (asgd cluster) and
/// the coordinator process tell each other, so that the coordinator acts on
/// a death at once instead of after --heartbeat-timeout of silence, and a
/// process that is silent without exiting (stopped, hung) is ended and
/// restarted or given up on. Thread-safe.
class Supervision {
 public:
  /// Supervisor side: a process ended.
  void exited(ProcessExit e) {
    std::unique_lock lock(mu_);
    if (!listener_) {
      exits_.push_back(std::move(e));
      return;
    }
    auto listener = listener_;
    lock.unlock();
    listener(std::move(e));
  }
  /// Coordinator side: the job is over; exits are no longer heard, and the
  /// supervisor is told (on_stopping).
  void job_over() {
    listen(nullptr);
    if (on_stopping) on_stopping();
  }
  /// Coordinator side: `listener` hears every exit from now on (and at
  /// once those that came before); null stops it. It is called on the
  /// supervisor's thread and must not block.
  void listen(std::function<void(ProcessExit)> listener) {
    std::deque<ProcessExit> earlier;
    {
      std::lock_guard lock(mu_);
      listener_ = listener;
      if (listener) earlier.swap(exits_);
    }
    for (auto& e : earlier) listener(std::move(e));
  }
  /// Set by the supervisor's side before the job starts; the coordinator
  /// calls it (from one of its threads) when a process that has not exited
  /// should be ended: shard `index`'s process `pid` sent no heartbeat for
  /// --heartbeat-timeout, or worker `index`'s was declared lost under
  /// allreduce or gossip (the others' collective no longer waits for it, so
  /// it must not write to their shared all-reduce after all).
  std::function<void(bool shard, std::uint32_t index, std::uint32_t pid)> on_silent;
  /// Set by the supervisor's side; the coordinator calls it once, before it
  /// tells the processes that the job has ended (done, failed or
  /// cancelled): from then on a process that exits is not started again.
  std::function<void()> on_stopping;
  /// Set by the supervisor's side; called (from read_supervision's thread)
  /// when the supervisor is gone: nobody restarts or ends the processes
  /// any more, so the coordinator should stop the job.
  std::function<void()> on_supervisor_gone;

 private:
  std::mutex mu_;
  std::deque<ProcessExit> exits_;
  std::function<void(ProcessExit)> listener_;
};

struct ProcessOptions {
  std::string coordinator;             ///< shard, worker: the coordinator's endpoint
  std::string listen = "tcp://127.0.0.1:0";  ///< coordinator, shard: where to listen
  double join_timeout_s = 60.0;        ///< coordinator: wait for registrations; others: for their assignment
  /// Others under a launcher: how much longer than join_timeout_s they wait,
  /// so that when a rank never comes they hear rank 0's verdict (naming it).
  double join_grace_s = 0.0;
  std::uint32_t shards = 0;            ///< coordinator: shard processes to wait for
  std::uint32_t workers = 0;           ///< coordinator: worker processes to wait for
  std::string data_dir;                ///< worker: the dataset's folder here, if not the coordinator's
  std::string device;                  ///< worker: where it computes here, if not the job's --device
  /// Coordinator under a launcher: the host each rank was put on (rank 0
  /// first), for naming the hosts of ranks that never registered; may be empty.
  std::vector<std::string> rank_hosts;
  std::uint32_t index = UINT32_MAX;    ///< shard, worker: the index to ask for (default, messaging::kAnyIndex: any free one)
  std::string index_from;              ///< where `index` came from, for refusals (empty: --index; a launcher's rank)
  /// Every process under a launcher that names the run (Launch::run_id): the
  /// coordinator refuses a process of another run, which two runs given
  /// one port would otherwise mix into one job.
  std::string run;
  /// Every process: authentication and encryption (docs/security.md); unset:
  /// plain tcp. With it a shard's endpoint carries its public key, and
  /// `coordinator` either carries the coordinator's or curve->server_key is it.
  std::optional<messaging::CurveOptions> curve;
  /// Every process: large tensors to peers on the same host through shared
  /// memory (BridgeOptions::shared_memory), and the workers' all-reduce when
  /// every worker runs on one host (NetworkCollective::set_shared_memory);
  /// never with `curve`.
  bool shared_memory = true;
  /// Shard, worker: after a message, their bridge's I/O thread polls for
  /// this long before it sleeps (BridgeOptions::busy_poll), and their actor
  /// threads poll their queues too (sleep_when_idle): a round trip with
  /// fewer threads waking, for cores spent polling. 0: off (the default).
  std::chrono::microseconds busy_poll{0};
  /// Worker: the collective its process trains with under allreduce and
  /// gossip, made by the caller (asgd cluster --collective mpi); unset: its
  /// own over ZeroMQ (and shared memory).
  std::shared_ptr<messaging::NetworkCollective> collective;
  /// Coordinator: the supervisor that started the job's processes, if any.
  std::shared_ptr<Supervision> supervision;
};

/// The coordinator process. `on_listening` gets the bound endpoint before
/// it waits for registrations (asgd cluster reads it from stdout).
/// Errors as run_job, plus timeout when processes do not register in time
/// (naming how many of which arrived) and invalid_argument for a job that
/// cannot run across processes (hogwild, --worker-weights auto).
Result<JobSummary> run_coordinator_process(const JobConfig& config, const ProcessOptions& options,
                                           const JobCallbacks& callbacks, std::stop_token stop,
                                           const std::function<void(const std::string&)>& on_listening);

/// A shard process: runs until the coordinator says stop, or `stop` is
/// requested (both a clean end). Errors: timeout (no assignment, or the
/// coordinator went silent), io_error, internal.
Status run_shard_process(const ProcessOptions& options, std::stop_token stop);

/// A worker process: trains its share, then waits for the coordinator's
/// stop (or `stop`). Errors as run_shard_process.
Status run_worker_process(const ProcessOptions& options, std::stop_token stop);

/// Where a job's workers compute: on this machine (asgd cluster), or on
/// hosts of their own (asgd coordinator, a launched job's coordinator
/// rank), where each worker checks its device as it starts.
enum class WorkersOn { this_host, their_hosts };

/// Checks a job for running across processes; the device only on this
/// host when the workers run here.
Status validate_for_cluster(const JobConfig& config, WorkersOn workers);

}  // namespace asgd
