#pragma once
// A runtime that runs jobs in the background of an embedding program. No
// globals: several runtimes can live in one process, each with its own
// jobs, and each job has an actor system of its own.

#include <chrono>
#include <cstddef>
#include <memory>

#include "asgd/job.hpp"
#include "asgd/status.hpp"

namespace asgd {

/// A job a Runtime runs. Copyable (copies share the job; a move copies
/// too, so a handle moved from still refers to its job); every method is
/// thread-safe. Outliving its Runtime is fine: the runtime's stop() or
/// destruction cancels and finishes the job first.
class JobHandle {
 public:
  JobHandle(const JobHandle&) = default;
  JobHandle& operator=(const JobHandle&) = default;

  /// Blocks until the job has ended; every call returns the same result
  /// (a copy: it lives as long as the caller keeps it). From the job's own
  /// callback (where the job waits for the callback) it returns at once
  /// with invalid_argument, and wait_for() says whether the job has ended
  /// without waiting.
  Result<JobSummary> wait() const;
  /// Waits at most `timeout`; true when the job has ended.
  bool wait_for(std::chrono::milliseconds timeout) const;
  /// True once the job has ended (wait() would not block).
  bool done() const;
  /// Asks the job to stop; it ends soon after with StatusCode::cancelled:
  /// within about 100 ms of the end of the step each worker is computing
  /// (a step of a large model or batch, resnet18 or a batch of thousands,
  /// may take a second or more). Does nothing once it has ended.
  void cancel() const;

 private:
  friend class Runtime;
  struct State;
  explicit JobHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

/// Starts jobs on threads of their own and stops them all cleanly.
/// Thread-safe: submit, run and stop may be called from any thread.
class Runtime {
 public:
  /// A runtime with no jobs yet.
  Runtime();
  /// stop(). exit() stops every Runtime still alive too (cancelling its
  /// jobs and waiting until they have ended), before the libraries that
  /// jobs use are torn down, also while a callback makes or destroys a
  /// Runtime; a Runtime made during exit() refuses jobs. But not from
  /// inside a job's own callback, where exit() cannot wait for that job
  /// (call stop() and return instead).
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Checks `config` (validate) and starts the job in the background.
  /// Callbacks run on the job's threads, one at a time per job, and the
  /// job waits for each: a slow on_progress or on_epoch holds training up.
  /// Errors: invalid_argument for a bad configuration (nothing starts),
  /// cancelled after stop(), unavailable when the job's thread cannot
  /// start (a limit on threads or memory). What depends on a named dataset's size (a
  /// batch larger than a worker's share of the training set, more workers
  /// than samples) is checked once the job has loaded it: the job then
  /// ends with invalid_argument. (On the user's data, below, submit checks
  /// it.)
  Result<JobHandle> submit(const JobConfig& config, JobCallbacks callbacks = {});

  /// As above, training on `data` instead of config.dataset (see
  /// run_job(config, data, ...)); `data` is checked and copied before
  /// submit returns (invalid_argument: nothing starts, also for a null
  /// `data`): the caller may change or free it then.
  Result<JobHandle> submit(const JobConfig& config, std::shared_ptr<const UserDataset> data,
                           JobCallbacks callbacks = {});

  /// submit(...).wait() on the calling thread's behalf.
  Result<JobSummary> run(const JobConfig& config, JobCallbacks callbacks = {});

  /// Jobs submitted and not yet ended.
  std::size_t running() const;

  /// Cancels every running job, waits until all have ended and refuses
  /// new ones. Idempotent; a call made while another is under way returns
  /// when that one does, once every job has ended. Called from a callback
  /// of one of this Runtime's jobs it waits for the other jobs only: that
  /// job (which waits for its callback) ends once the callback returns,
  /// cancelled; a later stop() from elsewhere waits for it, and running()
  /// counts it until it has. The same holds for destroying the Runtime
  /// there. (From a callback of another Runtime's job it waits as from any
  /// thread.)
  void stop();

 private:
  struct Impl;
  Result<JobHandle> start(const JobConfig& config, std::shared_ptr<const UserDataset> data, JobCallbacks callbacks);
  std::shared_ptr<Impl> impl_;  // (a stop() under way holds it too)
};

}  // namespace asgd
