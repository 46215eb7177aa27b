#pragma once
// worker: trains a replica of the model on the batches its data feeder
// serves. Each step it computes a gradient, pushes it to the shards that own
// each key range and refreshes its parameters from their replies, when and as
// often as the consistency policy's plan says. Event-based: it never blocks a
// scheduler thread waiting for a reply.
//
// Accepts:
//   (start_atom)   from the coordinator: pull the parameters, then train
//   (step_atom)    self-message between steps, so other messages interleave
//   (tick_atom)    self-message: the watchdog that enforces rpc_timeout
// Hot-path requests carry no CAF timeout (each one would wake CAF's timer
// thread twice per step); one periodic watchdog tick checks them instead.
// Sends to the coordinator: EpochReport after each epoch, and
//   (failed_atom, int32 StatusCode, std::string) when a reply does not come in
//   time (timeout), training diverged (diverged) or a shard answered nonsense
//   (internal).

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "actors/key_range.hpp"
#include "actors/messages.hpp"
#include "compute/model.hpp"
#include "policies/policy.hpp"

namespace asgd {

struct WorkerSetup {
  WorkerId id = 0;
  std::string model;
  Shape sample_shape;                 ///< (C, H, W)
  std::size_t classes = 10;
  std::vector<caf::actor> shards;     ///< shards[i] owns ranges[i]
  std::vector<KeyRange> ranges;
  caf::actor feeder;
  caf::actor coordinator;
  PolicyConfig policy;
  caf::timespan rpc_timeout = std::chrono::seconds(60);
};

/// Consecutive NaN/Inf losses after which a worker declares the job diverged.
inline constexpr std::uint32_t kMaxNonFiniteSteps = 10;

struct WorkerState {
  WorkerSetup setup;
  std::optional<Model> model;
  std::unique_ptr<ConsistencyPolicy> policy;
  std::uint64_t step = 0;                       // steps completed
  std::vector<std::uint64_t> base_version;      // per shard: version of our copy
  std::vector<std::vector<float>> buffers;      // per shard: recycled message buffers
  std::vector<float> accumulated;               // (num_params,) when push_every > 1
  std::size_t accumulated_steps = 0;

  // The step in flight.
  std::size_t outstanding = 0;                  // shard replies still expected
  std::vector<bool> awaiting;                   // per shard: reply still expected
  std::size_t applied_in_step = 0;
  bool step_ends_epoch = false;
  std::uint64_t step_epoch = 0;
  std::chrono::steady_clock::time_point comm_start;

  // The batch the next step trains on.
  std::optional<data::Batch> next_batch;
  bool batch_requested = false;
  std::chrono::steady_clock::time_point batch_requested_at;
  std::optional<std::chrono::steady_clock::time_point> idle_since;  // ready, but no batch yet

  EpochReport report;                           // the epoch being trained
  std::uint32_t nonfinite_streak = 0;           // consecutive steps with a NaN/Inf loss
  bool finished = false;
  static inline const char* name = "worker";
};

caf::behavior worker(caf::stateful_actor<WorkerState>* self, WorkerSetup setup);

}  // namespace asgd
