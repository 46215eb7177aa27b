#pragma once
// worker: trains a replica of the model on the batches its data feeder
// serves. Each step it computes a gradient and then does what the
// consistency policy's plan says: update its own parameters, push the
// payload (gradients or parameters) to the shards that own each key range,
// and refresh its parameters from their replies. Event-based: it never
// blocks a scheduler thread waiting for a reply, and a simulated straggler
// waits on a timer, not on a thread.
//
// Accepts:
//   (start_atom)   from the coordinator: pull the parameters, then train
//   (step_atom)    self-message between steps, so other messages interleave
//   (resume_atom)  self-message: a straggler's delayed step goes on
//   (tick_atom)    self-message: the watchdog that enforces rpc_timeout
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
#include "messaging/protocol.hpp"
#include "actors/shared_parameters.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
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
  double straggler_factor = 1.0;      ///< > 1: each step takes this many times its compute time
  std::shared_ptr<SharedParameters> shared;  ///< hogwild: the buffer every worker updates
  Clock first_clock = 0;              ///< the clock of its first step (> 0 when a job resumes)
  std::shared_ptr<ComputeContext> compute;  ///< the job's compute threads; null: the model's default
};

/// How often a worker tells the coordinator how far it got (WorkerProgress).
inline constexpr std::chrono::milliseconds kProgressEvery{250};

/// Consecutive NaN/Inf losses after which a worker declares the job diverged.
inline constexpr std::uint32_t kMaxNonFiniteSteps = 10;

struct WorkerState {
  WorkerSetup setup;
  std::optional<Model> model;
  std::unique_ptr<ConsistencyPolicy> policy;
  std::unique_ptr<Optimizer> local_optimizer;   // when the plan updates locally
  std::uint64_t step = 0;                       // steps completed: the worker's clock
  std::vector<Clock> base_clock;                // per shard: complete clock of our copy
  std::vector<std::uint64_t> base_version;      // per shard: its version of our copy
  std::vector<std::vector<float>> buffers;      // per shard: recycled message buffers
  std::vector<float> accumulated;               // (num_params,) gradients summed between pushes
  std::size_t unpushed_steps = 0;               // steps whose work no push has carried yet
  std::uint32_t unpushed_samples = 0;
  bool sum_in_model = false;                    // the unpushed gradients are exactly the model's grads()

  // The step in flight.
  std::size_t outstanding = 0;                  // shard replies still expected
  std::vector<bool> awaiting;                   // per shard: reply still expected
  std::size_t applied_in_step = 0;
  double held_in_step = 0.0;                    // longest a shard held this step's read
  bool step_ends_epoch = false;
  std::uint64_t step_epoch = 0;
  bool step_dropped = false;                    // the step's loss was NaN/Inf
  std::uint32_t step_samples = 0;
  std::chrono::steady_clock::time_point comm_start;

  // The batch the next step trains on.
  std::optional<data::Batch> next_batch;
  bool batch_requested = false;
  std::chrono::steady_clock::time_point batch_requested_at;
  std::optional<std::chrono::steady_clock::time_point> idle_since;  // ready, but no batch yet

  EpochReport report;                           // the epoch being trained
  WorkerProgress finished_epochs;               // cumulative counts of the epochs already reported
  std::chrono::steady_clock::time_point last_progress;  // when the coordinator last heard how far we got
  std::uint32_t nonfinite_streak = 0;           // consecutive steps with a NaN/Inf loss
  bool straggling = false;                      // a delayed step is waiting for resume_atom
  bool finishing = false;                       // out of data: the last push is in flight
  bool finished = false;
  static inline const char* name = "worker";
};

caf::behavior worker(caf::stateful_actor<WorkerState>* self, WorkerSetup setup);

}  // namespace asgd
