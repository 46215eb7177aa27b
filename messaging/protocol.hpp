#pragma once
// The messages actors exchange, each described once: `fields(f, m)` hands `f`
// every field of `m` in order. CAF's inspect (below, for copying and
// printing) takes that list as it is; the wire format (messaging/messages.hpp)
// takes every field but the tensor, which travels in the frame's tensor part,
// and reads each string and list through its bound. Vectors move into
// messages, so in-process sends copy no tensor data.

#include <caf/all.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dataset/dataset.hpp"
#include "policies/policy.hpp"

namespace asgd {

/// Bounds of variable-length fields on the wire.
inline constexpr std::size_t kMaxText = 4096;          ///< strings: names, endpoints, reasons, configs
inline constexpr std::size_t kMaxConfig = 64 * 1024;   ///< the job configuration text
inline constexpr std::size_t kMaxList = 1u << 16;      ///< lists: histograms, endpoints, ranges

/// A field in a message's description that is its tensor: not in the
/// frame's body but in its tensor part.
template <class T>
struct TensorField {
  T& ref;
};
/// A string or list field with the most items the wire accepts (strings
/// not marked take kMaxText; a list must be marked).
template <class T>
struct BoundedField {
  T& ref;
  std::size_t max;
};
template <class T>
TensorField<T> tensor(T& ref) {
  return {ref};
}
template <class T>
BoundedField<T> bounded(T& ref, std::size_t max) {
  return {ref, max};
}

/// The field itself, whatever marks it.
template <class T>
T& field_ref(T& x) {
  return x;
}
template <class T>
T& field_ref(TensorField<T> x) {
  return x.ref;
}
template <class T>
T& field_ref(BoundedField<T> x) {
  return x.ref;
}

/// A remote push's payload left in the frame it arrived in instead of
/// copied into a vector: a view, valid while `owner` lives, whose checksum
/// the bridge verified before handing it on. The shard answers into the same
/// bytes when `writable` (nobody else reads them), else into `spare`, a
/// recycled buffer of the same size (contents unspecified). In-process
/// only: not inspected, never serialized.
struct ReceivedFloats {
  std::shared_ptr<const void> owner;
  std::span<const float> values;  ///< (n,)
  std::span<float> writable;      ///< (n,) the same bytes, or empty
  std::vector<float> spare;       ///< (n,) when not writable
  /// Whether every value is finite, when the bridge found out in its
  /// checksum pass (which has each block in cache); unset: not checked.
  std::optional<bool> finite;
};

/// worker -> shard: a payload for the shard's key range.
struct PushRequest {
  WorkerId worker = 0;
  Clock clock = 0;                  ///< the step that produced it (its last, when steps were summed)
  Clock base_clock = 0;             ///< complete clock of the read it was computed on
  std::uint32_t samples = 0;        ///< samples behind it: its weight in an aggregate
  bool want_params = true;          ///< answer with the parameters for the read at clock + 1
  std::vector<float> payload;       ///< (range size,) gradients or parameters, as the policy says
  ReceivedFloats received = {};     ///< instead of `payload` (then empty) for a push from another process
  /// The shard's version (ShardReply::version) of the parameters it was
  /// computed on: the shard's updates since then are its staleness in
  /// updates, which --staleness-aware-lr divides the step by.
  std::uint64_t base_version = 0;

  /// The payload, wherever it is.
  std::span<const float> values() const {
    return received.owner ? received.values : std::span<const float>(payload);
  }
};

/// worker -> shard: "send me your parameters for step `clock`".
struct PullRequest {
  WorkerId worker = 0;
  Clock clock = 0;
};

/// What happened to a push.
enum class PushOutcome : std::uint8_t {
  none = 0,        ///< the reply answers a pull or a snapshot
  applied = 1,     ///< applied at once
  aggregated = 2,  ///< added to its clock's aggregate (applied when that commits)
  discarded = 3,   ///< dropped by the policy (a late backup gradient)
  rejected = 4,    ///< malformed: wrong size, unknown or departed worker
  nonfinite = 5,   ///< held a NaN or infinity: not applied (counted as a clock tick)
};

/// shard -> worker or coordinator: a push's fate and, when a read was asked
/// for, the parameters of the shard's key range. A push's reply reuses the
/// push's buffer for them (no allocation).
struct ShardReply {
  std::uint32_t shard = 0;
  std::uint8_t outcome = 0;         ///< a PushOutcome
  Clock clock = 0;                  ///< complete clock of `params`: every update of clocks below is in
  std::uint64_t version = 0;        ///< updates (or aggregates) the shard has applied
  double held_s = 0.0;              ///< how long the policy held the read back
  /// Worker pushes the shard had applied when it answered (alone or in a
  /// committed aggregate): what `params` hold.
  std::uint64_t applied = 0;
  std::vector<float> params;        ///< (range size,) or empty
  /// A reply to a push from another process may carry its parameters here
  /// instead of in `params`: written over the push's gradient in the
  /// frame's buffer (owner and values; the rest unused). In-process only:
  /// not inspected.
  ReceivedFloats params_in_frame = {};
  /// CRC-32C of the parameters' bytes when the shard computed it while
  /// writing them (a reply to a push from another process): spares the
  /// sender a pass. In-process only: not inspected.
  std::optional<std::uint32_t> params_crc = std::nullopt;
};

/// worker -> coordinator, once per finished epoch.
struct EpochReport {
  WorkerId worker = 0;
  std::uint64_t epoch = 0;          ///< 0-based
  std::uint64_t samples = 0;
  std::uint64_t batches = 0;
  double loss_sum = 0.0;            ///< sum over batches of (mean batch loss * batch size)
  std::uint64_t updates = 0;        ///< pushes every shard applied, this epoch
  double compute_s = 0.0;           ///< forward + backward (forward_s + backward_s + copy_s + device_s)
  double comm_s = 0.0;              ///< waiting for shard replies
  double data_wait_s = 0.0;         ///< waiting for the data feeder
  double policy_wait_s = 0.0;       ///< of comm_s: replies the policy held back (the slowest shard's, per step)
  // The rest of the epoch's time, phase by phase (asgd::WorkerPhases).
  double forward_s = 0.0;
  double backward_s = 0.0;
  double copy_s = 0.0;
  double device_s = 0.0;
  double delay_s = 0.0;
  double other_s = 0.0;
  double wall_s = 0.0;              ///< the epoch's: every phase above and comm_s, data_wait_s together
  std::uint64_t local_updates = 0;  ///< updates the worker applied itself (hogwild, averaging)
  std::vector<std::uint64_t> staleness_histogram;  ///< of updates applied to shared parameters (hogwild)
  std::uint64_t dropped_batches = 0;  ///< gradients not pushed: the loss was NaN or infinite
  std::uint64_t dropped_samples = 0;  ///< their samples (left out of loss_sum)
};

/// worker -> coordinator about twice a second, and with each EpochReport:
/// how far it got. Every count is cumulative over the job, so a lost or
/// late one costs nothing but freshness.
struct WorkerProgress {
  WorkerId worker = 0;
  Clock clock = 0;                  ///< steps completed
  std::uint64_t epoch = 0;          ///< 0-based, the epoch it is training
  std::uint64_t samples = 0;        ///< trained on, including dropped batches
  std::uint64_t updates = 0;        ///< pushes every shard applied (or local updates that count as such)
  double loss_sum = 0.0;            ///< sum of (batch loss x batch size) over batches not dropped
  std::uint64_t loss_samples = 0;   ///< the samples behind loss_sum
  double policy_wait_s = 0.0;       ///< seconds the policy held its reads back
  double staleness = 0.0;           ///< its clock minus the complete clock of its parameters, last step
  std::uint32_t batches_ready = 0;  ///< batches waiting for it (0 or 1: the feeder's buffer is behind it)
};

/// shard -> coordinator: what the shard applied (at the end), and how it
/// stands (while training, for the live status).
struct ShardStats {
  std::uint32_t shard = 0;
  std::uint64_t updates_applied = 0;         ///< pushes applied, alone or inside a committed aggregate
  std::uint64_t commits = 0;                 ///< optimizer steps or averages the shard took
  std::uint64_t updates_discarded = 0;
  std::uint64_t rejected = 0;                 ///< malformed pushes and pulls (bad size, unknown worker, a duplicate)
  std::uint64_t refused_departed = 0;         ///< pushes and pulls of a worker it was told had left (finished or lost)
  std::uint64_t nonfinite = 0;                ///< pushes refused for a NaN or infinity (parameters untouched)
  std::uint64_t malformed_frames = 0;         ///< frames its process dropped unread (bad length, checksum, ...)
  std::uint64_t duplicate_requests = 0;       ///< requests delivered twice, served once
  std::vector<std::uint64_t> staleness_histogram;  ///< [s] = applications with staleness s
  std::uint64_t keys = 0;                     ///< the size of its key range
  std::uint64_t held = 0;                     ///< reads the policy holds back now
  std::uint64_t queued = 0;                   ///< messages waiting in its mailbox now
  std::vector<Clock> worker_clock;            ///< per worker: highest clock pushed + 1
  // Checkpoints (--checkpoint-dir with --checkpoint-every); zero without.
  std::uint64_t checkpoint_failures = 0;      ///< writes that failed (a full disk, a folder gone)
  double checkpoint_unix_s = 0.0;             ///< when the newest checkpoint it wrote or reloaded was written; 0: none (filled by the shard actor)
  double restored_unix_s = 0.0;               ///< a restarted shard: when the checkpoint it reloaded was written; 0: none
  std::uint64_t restored_updates = 0;         ///< the updates that checkpoint held
  double optimizer_s = 0.0;                   ///< seconds spent folding updates into its parameters
};

// The descriptions. In-process views (PushRequest::received,
// ShardReply::params_in_frame and params_crc) are not fields.
template <class F>
decltype(auto) fields(F&& f, PushRequest& x) {
  return f(x.worker, x.clock, x.base_clock, x.samples, x.want_params, x.base_version, tensor(x.payload));
}
template <class F>
decltype(auto) fields(F&& f, PullRequest& x) {
  return f(x.worker, x.clock);
}
template <class F>
decltype(auto) fields(F&& f, ShardReply& x) {
  return f(x.shard, x.outcome, x.clock, x.version, x.held_s, x.applied, tensor(x.params));
}
template <class F>
decltype(auto) fields(F&& f, EpochReport& x) {
  return f(x.worker, x.epoch, x.samples, x.batches, x.loss_sum, x.updates, x.compute_s, x.comm_s, x.data_wait_s,
           x.policy_wait_s, x.local_updates, bounded(x.staleness_histogram, kMaxList), x.dropped_batches,
           x.dropped_samples, x.forward_s, x.backward_s, x.device_s, x.delay_s, x.other_s, x.wall_s, x.copy_s);
}
template <class F>
decltype(auto) fields(F&& f, ShardStats& x) {
  return f(x.shard, x.updates_applied, x.commits, x.updates_discarded, x.rejected, x.refused_departed,
           x.malformed_frames, x.duplicate_requests, bounded(x.staleness_histogram, kMaxList), x.nonfinite, x.keys,
           x.held, x.queued, bounded(x.worker_clock, kMaxList), x.checkpoint_failures, x.checkpoint_unix_s,
           x.restored_unix_s, x.restored_updates, x.optimizer_s);
}
template <class F>
decltype(auto) fields(F&& f, WorkerProgress& x) {
  return f(x.worker, x.clock, x.epoch, x.samples, x.updates, x.loss_sum, x.loss_samples, x.policy_wait_s,
           x.staleness, x.batches_ready);
}

/// A message with a description.
template <class M>
concept Described = requires(M& m) { fields([](auto&&...) {}, m); };

/// CAF's inspect of every described message (with a type ID, below): its
/// fields, in the order of the description.
template <class Inspector, Described M>
typename Inspector::result_type inspect(Inspector& f, M& x) {
  return fields([&](auto&&... field) { return f(caf::meta::type_name(caf::type_name<M>::value), field_ref(field)...); },
                x);
}

namespace data {
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Batch& x) {
  return f(caf::meta::type_name("Batch"), x.epoch, x.index, x.last_in_epoch, x.size, x.x, x.y);
}
}  // namespace data

// Atoms (at most 10 characters each).
using push_atom = caf::atom_constant<caf::atom("push")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using next_atom = caf::atom_constant<caf::atom("next")>;
using produce_atom = caf::atom_constant<caf::atom("produce")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using resume_atom = caf::atom_constant<caf::atom("resume")>;
using calibrate_atom = caf::atom_constant<caf::atom("calibrate")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using live_atom = caf::atom_constant<caf::atom("live")>;
using restarted_atom = caf::atom_constant<caf::atom("restarted")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using prepared_atom = caf::atom_constant<caf::atom("prepared")>;
using prepare_due_atom = caf::atom_constant<caf::atom("prep_due")>;  ///< the registry's --join-timeout for the start
using exchanged_atom = caf::atom_constant<caf::atom("exchanged")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;  ///< a data feeder serves no more (--stop-at-target)
using written_atom = caf::atom_constant<caf::atom("written")>;  ///< a shard looks whether its checkpoint is written

}  // namespace asgd

CAF_BEGIN_TYPE_ID_BLOCK(asgd, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(asgd, (asgd::PushRequest))
  CAF_ADD_TYPE_ID(asgd, (asgd::PullRequest))
  CAF_ADD_TYPE_ID(asgd, (asgd::ShardReply))
  CAF_ADD_TYPE_ID(asgd, (asgd::EpochReport))
  CAF_ADD_TYPE_ID(asgd, (asgd::ShardStats))
  CAF_ADD_TYPE_ID(asgd, (asgd::data::Batch))
  CAF_ADD_TYPE_ID(asgd, (asgd::WorkerProgress))
CAF_END_TYPE_ID_BLOCK(asgd)
