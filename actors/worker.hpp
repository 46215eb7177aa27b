#pragma once
// worker: trains a replica of the model on the batches its data feeder
// serves. The decisions are WorkerCore's (actors/worker_core.hpp); this
// actor only carries messages to and from it. Each step it computes a
// gradient and then does what the consistency policy's plan says: update its own parameters, push the
// payload (gradients or parameters) to the shards that own each key range,
// and refresh its parameters from their replies. Event-based: it never
// blocks a scheduler thread waiting for a reply, and a simulated straggler
// waits on a timer, not on a thread.
//
// Accepts:
//   (start_atom)   from the coordinator: pull the parameters, then train
//   (start_atom, feeder)  the same, with the feeder to ask for batches
//   (calibrate_atom, Batch)  -> double: samples/s on this worker's device
//   (step_atom)    self-message between steps, so other messages interleave
//   (resume_atom)  self-message: a straggler's delayed step goes on
//   (tick_atom)    self-message: the watchdog that enforces rpc_timeout
//   (exchanged_atom)  from the collective: allreduce's mean or gossip's
//                  copies are ready
// Hot-path requests carry no CAF timeout (each one would wake CAF's timer
// thread twice per step); one periodic watchdog tick checks them instead.
// Sends to the coordinator: EpochReport after each epoch, WorkerProgress
//   after each epoch and every kProgressEvery in between (a quarter second), and
//   (failed_atom, int32 StatusCode, std::string) when a reply does not come in
//   time (timeout), training diverged (diverged) or a shard answered nonsense
//   (internal), and then stops with that error as its exit reason (a normal
//   exit means it ran out of data). Sends (leave_atom, id) to every shard
//   once out of data.

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "actors/key_range.hpp"
#include "actors/shared_parameters.hpp"
#include "actors/straggler.hpp"
#include "actors/worker_core.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "messaging/collective.hpp"
#include "messaging/protocol.hpp"
#include "policies/policy.hpp"

namespace asgd {

struct WorkerSetup {
  WorkerId id = 0;
  std::string model;
  std::shared_ptr<const ModelSpec> model_spec;  ///< when set, built instead of `model`
  std::string device = "cpu";         ///< "cpu", "cuda" or "cuda:K": where this worker computes
  Shape sample_shape;                 ///< (C, H, W)
  std::size_t classes = 10;
  std::vector<caf::actor> shards;     ///< shards[i] owns ranges[i]
  std::vector<KeyRange> ranges;
  caf::actor feeder;
  caf::actor coordinator;
  PolicyConfig policy;
  caf::timespan rpc_timeout = std::chrono::seconds(60);
  OptimizerConfig optimizer;          ///< for local updates (hogwild, averaging)
  LrSchedule schedule;                ///< for local updates, by the worker's own clock
  Straggler straggler;                ///< how its steps are slowed (--straggler); none by default
  std::shared_ptr<SharedParameters> shared;  ///< hogwild: the buffer every worker updates
  /// allreduce, gossip: what the workers exchange through (one rank each)
  std::shared_ptr<messaging::Collective> collective;
  /// Called (on any thread) when the worker's exchange through `collective`
  /// is done: the actor sets it to send itself (exchanged_atom).
  std::function<void()> exchanged;
  Clock first_clock = 0;              ///< the clock of its first step (> 0 when a job resumes)
  std::shared_ptr<ComputeContext> compute;  ///< the job's compute threads; null: the model's default
};

/// The actor's state: the handles it sends to, and the core that decides.
struct WorkerState {
  WorkerSetup setup;
  std::optional<WorkerCore> core;  // empty once construction failed
  static inline const char* name = "worker";
};

caf::behavior worker(caf::stateful_actor<WorkerState>* self, WorkerSetup setup);

}  // namespace asgd
