#pragma once
// Every message that crosses a process boundary, each with its one cereal
// serialize function beside it. The actor messages (messaging/protocol.hpp)
// travel as they are; their tensors (a push's payload, a reply's
// parameters, a shard's initial parameters) are not in the body but in the
// frame's tensor part (messaging/wire.hpp), optionally as float16.
//
// Bounds: every variable-length field is read through bounded(), which
// checks the length against its bound before allocating, so a hostile frame
// can make the decoder allocate at most kMaxBody bytes of fields plus the
// checked tensor.

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/common.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include <cstdint>
#include <string>
#include <vector>

#include "messaging/protocol.hpp"
#include "messaging/wire.hpp"

namespace asgd::messaging {

enum class MsgType : std::uint16_t {
  registration = 1,  ///< a process to the coordinator: here I am, reach me there
  assignment = 2,    ///< coordinator to a process: your role, key range or data share, peers
  push = 3,          ///< worker to shard: PushRequest (tensor: the payload)
  pull = 4,          ///< worker to shard: PullRequest
  parameters = 5,    ///< shard to worker or coordinator: ShardReply (tensor: the parameters)
  clock = 6,         ///< worker to shard: it leaves; coordinator to shard: a worker leaves, or rejoins at a clock
  heartbeat = 7,     ///< any process to the coordinator, and back
  evaluation = 8,    ///< coordinator to shard: a snapshot for evaluation (answered with parameters)
  checkpoint = 9,    ///< coordinator to shard: write a checkpoint
  shutdown = 10,     ///< coordinator to every process: stop
  epoch_report = 11, ///< worker to coordinator: EpochReport
  failure = 12,      ///< any process to the coordinator: it cannot go on
  stats = 13,        ///< coordinator to shard: send your statistics
  start = 14,        ///< coordinator to worker: start training
  stats_reply = 15,  ///< shard to coordinator: ShardStats
  progress = 16,     ///< worker to coordinator: WorkerProgress
  restarted = 17,    ///< coordinator to worker: a shard's process was restarted, listening here
};
const char* to_string(MsgType t);
bool is_known(std::uint16_t type);

enum class Role : std::uint8_t { coordinator = 0, shard = 1, worker = 2 };

/// Bounds of variable-length fields.
inline constexpr std::size_t kMaxText = 4096;          ///< strings: names, endpoints, reasons, configs
inline constexpr std::size_t kMaxConfig = 64 * 1024;   ///< the job configuration text
inline constexpr std::size_t kMaxList = 1u << 16;      ///< lists: histograms, endpoints, ranges

/// A length-checked view of a string or vector field for cereal.
template <class T>
struct Bounded {
  T& ref;
  std::size_t max;
  template <class Archive>
  void save(Archive& ar) const {
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(ref.size())));
    for (auto& x : const_cast<T&>(ref)) item(ar, x);
  }
  template <class Archive>
  void load(Archive& ar) {
    cereal::size_type n = 0;
    ar(cereal::make_size_tag(n));
    if (n > max) throw cereal::Exception("a field of " + std::to_string(n) + " items exceeds its bound of " +
                                         std::to_string(max));
    ref.resize(static_cast<std::size_t>(n));
    for (auto& x : ref) item(ar, x);
  }

 private:
  // Strings inside a list are bounded too.
  template <class Archive, class V>
  static void item(Archive& ar, V& x) {
    if constexpr (std::is_same_v<V, std::string>) {
      ar(Bounded<std::string>{x, kMaxText});
    } else {
      ar(x);
    }
  }
};
template <class T>
Bounded<T> bounded(T& ref, std::size_t max) {
  return {ref, max};
}

struct Registration {
  static constexpr MsgType kType = MsgType::registration;
  Role role = Role::worker;
  std::uint32_t index = 0;
  std::string endpoint;   ///< where this process listens (shards), or empty
  std::string host;
  std::uint32_t pid = 0;
  template <class A>
  void serialize(A& ar) {
    ar(role, index, bounded(endpoint, kMaxText), bounded(host, kMaxText), pid);
  }
};

/// Everything a process needs to play its part. Shards get their initial
/// parameters as the frame's tensor.
struct Assignment {
  static constexpr MsgType kType = MsgType::assignment;
  Role role = Role::worker;
  std::uint32_t index = 0;
  std::string config;                          ///< the job's settings, TOML
  std::uint32_t workers = 0;
  std::uint64_t range_begin = 0;               ///< shard: its key range
  std::uint64_t range_end = 0;
  std::uint64_t partition_begin = 0;           ///< worker: its training samples
  std::uint64_t partition_end = 0;
  std::uint32_t batch = 0;                     ///< worker: its batch size
  double straggler = 1.0;                      ///< worker: slow-down factor
  std::uint64_t schedule_steps = 0;            ///< the learning-rate schedule's length
  std::vector<std::string> shard_endpoints;    ///< worker: shard i listens at [i]
  std::vector<std::uint64_t> range_bounds;     ///< worker: shard i owns [bounds[i], bounds[i+1])
  /// shard: the process takes the place of one that died mid-job, so it
  /// reloads the shard's checkpoint (--checkpoint-dir) over the tensor
  /// (the initial parameters, kept when no checkpoint was written yet).
  bool restore = false;
  /// worker: the epoch (0-based) it starts at; > 0 for a worker process
  /// that rejoins a running job in place of a lost one.
  std::uint32_t first_epoch = 0;
  template <class A>
  void serialize(A& ar) {
    ar(role, index, bounded(config, kMaxConfig), workers, range_begin, range_end, partition_begin, partition_end,
       batch, straggler, schedule_steps, bounded(shard_endpoints, 1024), bounded(range_bounds, 1025), restore,
       first_epoch);
  }
};

/// Shard `index`'s process was restarted and listens at `endpoint` now:
/// connect there and send again what it had not answered.
struct Restarted {
  static constexpr MsgType kType = MsgType::restarted;
  Role role = Role::shard;
  std::uint32_t index = 0;
  std::string endpoint;
  template <class A>
  void serialize(A& ar) {
    ar(role, index, bounded(endpoint, kMaxText));
  }
};

struct ClockNotice {
  static constexpr MsgType kType = MsgType::clock;
  WorkerId worker = 0;
  Clock clock = 0;
  bool leaving = false;
  template <class A>
  void serialize(A& ar) {
    ar(worker, clock, leaving);
  }
};

struct Heartbeat {
  static constexpr MsgType kType = MsgType::heartbeat;
  Role role = Role::worker;
  std::uint32_t index = 0;
  std::uint64_t sequence = 0;
  template <class A>
  void serialize(A& ar) {
    ar(role, index, sequence);
  }
};

struct EvaluationRequest {
  static constexpr MsgType kType = MsgType::evaluation;
  template <class A>
  void serialize(A&) {}
};

struct CheckpointRequest {
  static constexpr MsgType kType = MsgType::checkpoint;
  std::string directory;
  template <class A>
  void serialize(A& ar) {
    ar(bounded(directory, kMaxText));
  }
};

struct Shutdown {
  static constexpr MsgType kType = MsgType::shutdown;
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(bounded(reason, kMaxText));
  }
};

struct Failure {
  static constexpr MsgType kType = MsgType::failure;
  std::int32_t code = 0;  ///< a StatusCode
  std::string what;
  template <class A>
  void serialize(A& ar) {
    ar(code, bounded(what, kMaxText));
  }
};

struct StartTraining {
  static constexpr MsgType kType = MsgType::start;
  template <class A>
  void serialize(A&) {}
};

/// The shard statistics request; the reply is a ShardStats (stats_reply).
struct StatsRequest {
  static constexpr MsgType kType = MsgType::stats;
  template <class A>
  void serialize(A&) {}
};

/// Wire types of the actor messages (their tensors ride in the tensor part).
template <class T>
struct WireType;
template <>
struct WireType<PushRequest> {
  static constexpr MsgType kType = MsgType::push;
};
template <>
struct WireType<PullRequest> {
  static constexpr MsgType kType = MsgType::pull;
};
template <>
struct WireType<ShardReply> {
  static constexpr MsgType kType = MsgType::parameters;
};
template <>
struct WireType<EpochReport> {
  static constexpr MsgType kType = MsgType::epoch_report;
};
template <>
struct WireType<ShardStats> {
  static constexpr MsgType kType = MsgType::stats_reply;
};
template <>
struct WireType<WorkerProgress> {
  static constexpr MsgType kType = MsgType::progress;
};

template <class T>
constexpr MsgType type_of() {
  if constexpr (requires { T::kType; }) {
    return T::kType;
  } else {
    return WireType<T>::kType;
  }
}

}  // namespace asgd::messaging


namespace asgd::messaging {

// The fields of the actor messages on the wire, without their tensors.
// (Named serialize_fields, not serialize: CAF 0.17 would take a free
// serialize() for its own serialization.)
template <class A>
void serialize_fields(A& ar, PushRequest& x) {
  ar(x.worker, x.clock, x.base_clock, x.samples, x.want_params, x.base_version);
}
template <class A>
void serialize_fields(A& ar, PullRequest& x) {
  ar(x.worker, x.clock);
}
template <class A>
void serialize_fields(A& ar, ShardReply& x) {
  ar(x.shard, x.outcome, x.clock, x.version, x.held_s);
}
template <class A>
void serialize_fields(A& ar, EpochReport& x) {
  ar(x.worker, x.epoch, x.samples, x.batches, x.loss_sum, x.updates, x.compute_s, x.comm_s, x.data_wait_s,
     x.policy_wait_s, x.local_updates, bounded(x.staleness_histogram, kMaxList), x.dropped_batches,
     x.dropped_samples);
}
template <class A>
void serialize_fields(A& ar, ShardStats& x) {
  ar(x.shard, x.updates_applied, x.commits, x.updates_discarded, x.rejected, x.refused_departed, x.malformed_frames,
     x.duplicate_requests, bounded(x.staleness_histogram, kMaxList), x.nonfinite, x.keys, x.held, x.queued,
     bounded(x.worker_clock, kMaxList), x.checkpoint_failures, x.checkpoint_unix_s, x.restored_unix_s,
     x.restored_updates);
}
template <class A>
void serialize_fields(A& ar, WorkerProgress& x) {
  ar(x.worker, x.clock, x.epoch, x.samples, x.updates, x.loss_sum, x.loss_samples, x.policy_wait_s, x.staleness,
     x.batches_ready);
}

/// Lets cereal serialize an actor message through serialize_fields.
template <class T>
struct FieldsOf {
  T& x;
  template <class A>
  void serialize(A& ar) {
    serialize_fields(ar, x);
  }
};

/// What cereal archives for message `m`: itself, or its FieldsOf.
template <class A, class M>
void archive_message(A& ar, M& m) {
  if constexpr (requires { M::kType; }) {
    ar(m);
  } else {
    ar(FieldsOf<M>{m});
  }
}

/// How a tensor travels.
enum class TensorCoding { float32, float16 };

/// Recycles large tensor buffers: a vector sent in one frame comes back
/// (once ZeroMQ is done with it) to receive the next. Without it every
/// frame of a big tensor costs a fresh allocation, which for tens of MB
/// means mapping and zeroing new pages. Thread-safe.
class TensorPool {
 public:
  /// A vector of n floats, recycled when one of that size is free
  /// (contents unspecified), else new.
  std::vector<float> take(std::size_t n);
  void give(std::vector<float>&& v);

 private:
  static constexpr std::size_t kMinFloats = 16 * 1024;  ///< smaller ones are cheap to allocate
  static constexpr std::size_t kMaxFree = 8;
  std::mutex mu_;
  std::vector<std::vector<float>> free_;
};

/// Serializes `msg` into a frame. `tensor` (moved in) becomes the tensor
/// part: as it is for float32 (no copy), converted for float16.
/// `tensor_crc`, when given, is the CRC-32C of `tensor`'s bytes, already
/// computed (ShardReply::params_crc); it is used for float32 only.
template <class M>
Message encode(const M& msg, std::uint64_t request_id, std::vector<float> tensor = {},
               TensorCoding coding = TensorCoding::float32, std::shared_ptr<TensorPool> pool = nullptr,
               std::optional<std::uint32_t> tensor_crc = std::nullopt);

/// Decodes a checked frame's body into `out`. bad_body when the fields do
/// not decode exactly (truncated, a bound exceeded, bytes left over).
template <class M>
FrameError decode(const Frame& frame, M& out);

/// Decodes the frame's tensor into `out` (an empty `out` is taken from
/// `pool` when given), checking its CRC in the same pass; bad_body when its
/// length is not a whole number of values or not `expected` values (when
/// given), bad_checksum when it was damaged.
FrameError decode_tensor(const Frame& frame, std::vector<float>& out, std::optional<std::size_t> expected = {},
                         TensorPool* pool = nullptr);

/// Whether a push's tensor may stay in its frame (ReceivedFloats) instead
/// of being copied out: float32, large enough for the copy to matter
/// (kBorrowFromBytes), and aligned for float.
inline constexpr std::size_t kBorrowFromBytes = 64 * 1024;
bool can_borrow_tensor(const Frame& frame);

/// Checks the frame's float32 tensor where it lies (its length a whole
/// number of values, its CRC) and only then sets `out` to view it, kept
/// alive by the owner of `part` (the frame's tensor part): writable when the
/// part is exclusive, else with a spare buffer of the same size from `pool`
/// (when given; else a new one). Requires can_borrow_tensor(frame) and
/// part.owner. bad_body / bad_checksum as decode_tensor, leaving `out` as it was.
FrameError borrow_tensor(const Frame& frame, const Part& part, ReceivedFloats& out, TensorPool* pool = nullptr);

/// As encode() for a reply whose float32 parameters already lie in a frame
/// buffer (ShardReply::params_in_frame) with a known CRC-32C: sent from
/// there, without a copy.
Message encode_in_frame(const ShardReply& reply, std::uint64_t request_id, const ReceivedFloats& params,
                        std::uint32_t crc);

// Implementation details of the templates.
std::vector<std::byte> serialize_body(const std::function<void(cereal::PortableBinaryOutputArchive&)>& write);
FrameError deserialize_body(std::span<const std::byte> body,
                            const std::function<void(cereal::PortableBinaryInputArchive&)>& read);
Part tensor_part(std::vector<float>&& tensor, TensorCoding coding, std::shared_ptr<TensorPool> pool);

template <class M>
Message encode(const M& msg, std::uint64_t request_id, std::vector<float> tensor, TensorCoding coding,
               std::shared_ptr<TensorPool> pool, std::optional<std::uint32_t> tensor_crc) {
  auto body = serialize_body([&](cereal::PortableBinaryOutputArchive& ar) { archive_message(ar, const_cast<M&>(msg)); });
  const std::uint16_t flags = coding == TensorCoding::float16 && !tensor.empty() ? kFlagFp16 : 0;
  if (coding != TensorCoding::float32) tensor_crc.reset();  // it was the float32 bytes'
  return build_frame(static_cast<std::uint16_t>(type_of<M>()), flags, request_id, body,
                     tensor_part(std::move(tensor), coding, std::move(pool)), tensor_crc);
}

template <class M>
FrameError decode(const Frame& frame, M& out) {
  if (frame.header.type != static_cast<std::uint16_t>(type_of<M>())) return FrameError::unknown_type;
  return deserialize_body(frame.body, [&](cereal::PortableBinaryInputArchive& ar) { archive_message(ar, out); });
}

}  // namespace asgd::messaging
