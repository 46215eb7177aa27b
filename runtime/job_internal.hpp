#pragma once
// run_job's machinery for a coordinator whose shards and workers are other
// processes (runtime/cluster.cpp). Not part of the public API.

#include <caf/all.hpp>
#include <chrono>

#include <functional>
#include <memory>
#include <optional>

#include "actors/coordinator.hpp"
#include "base/folder_lock.hpp"
#include "asgd/job.hpp"
#include "compute/context.hpp"

namespace asgd {

struct ClusterHooks {
  /// Called once the job's actor system exists, before the coordinator
  /// starts: where its shards and workers are. The plan's, of the data
  /// the coordinator loaded: its training split's fingerprint (JobPlan::
  /// train_fingerprint), which its workers check theirs against.
  std::function<Result<std::shared_ptr<RemotePlacement>>(caf::actor_system&, std::uint32_t train_fingerprint)>
      make_placement;
  /// Called with the coordinator once it is spawned (to route reports to it).
  std::function<void(caf::actor)> on_coordinator;
  /// Called once the outcome is known, while the actor system still runs:
  /// the last moment to stop sending to its actors.
  std::function<void(const Status& outcome)> before_shutdown;
  /// The coordinator's compute threads (its evaluations); 0: the plan's,
  /// the usable CPUs divided among all the job's workers.
  unsigned compute_threads = 0;
  /// Called with the job's compute context once it is made (tests read
  /// what the job's models used of it).
  std::function<void(std::shared_ptr<const ComputeContext>)> on_compute_context;
};

/// For the actor systems of a job's processes (coordinator, shard, worker),
/// whose threads mostly wait for a frame: an idle scheduler thread sleeps
/// until work comes instead of CAF's default of 500 polls 50 us apart
/// after every job, which woke each idle thread 20,000 times a second. On
/// the 2-core VM (default job as processes, 4 alternating runs each,
/// 2026-11-26) it cut context switches from 122k-189k to 48k-80k and CPU
/// time from 7.4-9.4 s to 6.3-7.3 s, and samples/s went from a median of
/// 44.2k to 46.8k. In one process the threads are busy computing and the
/// polls make hand-offs fast (without them 124k -> 100k samples/s there),
/// so run_job alone keeps CAF's default.
/// With `busy_poll` > 0 an idle thread first tries its queue busy_poll x
/// kPollsPerBusyMicrosecond times without sleeping (CAF's aggressive
/// polls; ProcessOptions::busy_poll).
void sleep_when_idle(caf::actor_system_config& cfg, std::chrono::microseconds busy_poll = {});

/// How many times an idle CAF thread tries its queue before it sleeps, per
/// microsecond of ProcessOptions::busy_poll.
inline constexpr std::size_t kPollsPerBusyMicrosecond = 100;

/// Waits for every actor of `system` to stop, as its destructor would but
/// not without a word: every `every` it logs a warning with how many are
/// still running, so a job whose outcome is known and whose wait() has not
/// returned says why (a worker inside a long step, a call that has not come
/// back). run_coordinator calls it before its system goes out of scope.
void await_actors(caf::actor_system& system, std::chrono::milliseconds every);

/// The most batches a data feeder keeps ready (--prefetch).
inline constexpr std::uint32_t kMaxPrefetch = 256;

/// Creates config.checkpoint_dir; invalid_argument naming it when it cannot
/// be written (or its model.ckpt is not a regular file), so that a job
/// learns it before it trains, not at its first checkpoint.
Status prepare_checkpoint_dir(const JobConfig& config);

/// The job's checkpoint folder (none without one), ready
/// (prepare_checkpoint_dir) and held: one job at a time writes it.
/// Errors: invalid_argument naming the folder when another job holds it.
Result<std::optional<FolderLock>> hold_checkpoint_dir(const JobConfig& config);

/// validate(config), checking the device on this machine only when
/// `devices_here` (a coordinator whose workers run on other hosts does not).
Status validate_settings(const JobConfig& config, bool devices_here);

/// Whether `device` ("cpu", "cuda", "cuda:1") can compute on this machine.
/// Errors: invalid_argument naming --device and why (no GPU, no such GPU).
Status device_usable_here(const std::string& device);

/// run_job, with shards and workers placed by `hooks` when set, on
/// `user_data` when set (else config.dataset from disk).
Result<JobSummary> run_job_with(const JobConfig& config, const JobCallbacks& callbacks, std::stop_token stop,
                                const ClusterHooks& hooks, std::shared_ptr<const UserDataset> user_data = nullptr);

}  // namespace asgd
