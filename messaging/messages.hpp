#pragma once
// Every message that crosses a process boundary: the actor messages of
// messaging/protocol.hpp and the ones only processes exchange (below), each
// with its one description (fields()), and the list that gives each its wire
// type. A message's body is its fields in order but its tensor (a push's
// payload, a reply's parameters, a shard's initial parameters), which is
// the frame's tensor part (messaging/wire.hpp), optionally as float16.
//
// Bounds: every string and list is read through its bound, which is checked
// against the length before allocating, so a hostile frame can make the
// decoder allocate at most kMaxBody bytes of fields plus the checked tensor.

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/common.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cstdint>
#include <string>
#include <string_view>
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
  calibration = 18,  ///< worker to coordinator: its samples/s, asked for by an assignment (--worker-weights auto)
  worker_ready = 19,  ///< worker to coordinator: its data is loaded and it can start at once
  stop_training = 20, ///< coordinator to worker: serve no more batches (--stop-at-target)
};
const char* to_string(MsgType t);
bool is_known(std::uint16_t type);

enum class Role : std::uint8_t { coordinator = 0, shard = 1, worker = 2 };

/// Registration::index when the process asks for no particular one.
inline constexpr std::uint32_t kAnyIndex = UINT32_MAX;
struct Registration {
  Role role = Role::worker;
  std::uint32_t index = 0;  ///< the index it asks for (--index), or kAnyIndex
  std::string endpoint;   ///< where this process listens (a shard), or its collective does (a worker), or empty
  std::string host;
  std::uint32_t pid = 0;
  /// The CPUs it computes on (cpu_set_key() in base/cpus.hpp): processes
  /// with the same key share them.
  std::string cpu_key;
  /// Where the index came from, as a refusal names it: empty for --index;
  /// under a launcher, its rank ("rank 2 (OMPI_COMM_WORLD_RANK, ...)").
  std::string index_from;
  /// The launcher's run id (Launch::run_id: Slurm's job and step, ...), or
  /// empty: a coordinator of another run refuses the process.
  std::string run;
};
template <class F>
decltype(auto) fields(F&& f, Registration& x) {
  return f(x.role, x.index, x.endpoint, x.host, x.pid, x.cpu_key, x.index_from, x.run);
}

/// Everything a process needs to play its part. Shards get their initial
/// parameters as the frame's tensor.
struct Assignment {
  Role role = Role::worker;
  std::uint32_t index = 0;
  std::string config;                          ///< the job's settings, TOML
  std::uint32_t workers = 0;
  std::uint64_t range_begin = 0;               ///< shard: its key range
  std::uint64_t range_end = 0;
  std::uint64_t partition_begin = 0;           ///< worker: its training samples
  std::uint64_t partition_end = 0;
  std::uint32_t batch = 0;                     ///< worker: its batch size
  std::uint64_t schedule_steps = 0;            ///< the learning-rate schedule's length
  std::vector<std::string> shard_endpoints;    ///< worker: shard i listens at [i]
  std::vector<std::uint64_t> range_bounds;     ///< worker: shard i owns [bounds[i], bounds[i+1])
  /// shard: the process takes the place of one that died mid-job, so it
  /// reloads the shard's checkpoint (--checkpoint-dir) over the tensor
  /// (the initial parameters, kept when no checkpoint was written yet).
  bool restore = false;
  /// shard, with `restore`, of a resumed job (--resume): each worker's
  /// clock where it starts again (ShardCore::restore), the checkpoint being
  /// the resumed job's. Empty for a process that takes a lost one's place.
  std::vector<std::uint64_t> restart;
  /// worker: the epoch (0-based) it starts at; > 0 for a worker process
  /// that rejoins a running job in place of a lost one.
  std::uint32_t first_epoch = 0;
  /// worker (--worker-weights auto): measure your samples/s on a batch of
  /// your data and answer with a Calibration; the assignment to train by
  /// (its share sized from every worker's rate) follows.
  bool calibrate = false;
  /// worker: where every worker's collective listens (worker w's at [w];
  /// empty for one that announced none), for the decentralized policies.
  std::vector<std::string> peer_endpoints;
  /// worker: how many of the job's worker processes, itself included, share
  /// the CPUs it computes on (the same Registration::cpu_key); without
  /// --threads it computes on its CPUs divided by them.
  std::uint32_t cpu_sharers = 1;
  /// worker: the coordinator's training split's fingerprint
  /// (LabeledImages::fingerprint); a worker whose own differs refuses to
  /// train (another dataset, other files). 0: not checked.
  std::uint32_t train_fingerprint = 0;
};
template <class F>
decltype(auto) fields(F&& f, Assignment& x) {
  return f(x.role, x.index, bounded(x.config, kMaxConfig), x.workers, x.range_begin, x.range_end, x.partition_begin,
           x.partition_end, x.batch, x.schedule_steps, bounded(x.shard_endpoints, 1024),
           bounded(x.range_bounds, 1025), x.restore, x.first_epoch, x.calibrate, bounded(x.peer_endpoints, 4096),
           x.cpu_sharers, bounded(x.restart, 4096), x.train_fingerprint);
}

/// Shard `index`'s process was restarted and listens at `endpoint` now:
/// connect there and send again what it had not answered.
struct Restarted {
  Role role = Role::shard;
  std::uint32_t index = 0;
  std::string endpoint;
};
template <class F>
decltype(auto) fields(F&& f, Restarted& x) {
  return f(x.role, x.index, x.endpoint);
}

struct ClockNotice {
  WorkerId worker = 0;
  Clock clock = 0;
  bool leaving = false;
};
template <class F>
decltype(auto) fields(F&& f, ClockNotice& x) {
  return f(x.worker, x.clock, x.leaving);
}

struct Heartbeat {
  Role role = Role::worker;
  std::uint32_t index = 0;
  std::uint64_t sequence = 0;
};
template <class F>
decltype(auto) fields(F&& f, Heartbeat& x) {
  return f(x.role, x.index, x.sequence);
}

struct EvaluationRequest {};
template <class F>
decltype(auto) fields(F&& f, EvaluationRequest&) {
  return f();
}

struct CheckpointRequest {
  std::string directory;
};
template <class F>
decltype(auto) fields(F&& f, CheckpointRequest& x) {
  return f(x.directory);
}

struct Shutdown {
  std::string reason;
  /// A usage error, exit 2: the process itself was refused (an index out of
  /// range or taken, a slot the job does not have), or the job was, for
  /// something the user must fix (a refused --resume).
  bool refused = false;
};
/// Shutdown's reason when the job has finished; any other reason (a
/// failure, a cancellation, a refusal) makes the process exit with a failure.
inline constexpr std::string_view kJobDone = "the job is done";
template <class F>
decltype(auto) fields(F&& f, Shutdown& x) {
  return f(x.reason, x.refused);
}

struct Failure {
  std::int32_t code = 0;  ///< a StatusCode
  std::string what;
};
template <class F>
decltype(auto) fields(F&& f, Failure& x) {
  return f(x.code, x.what);
}

/// A worker's answer to an assignment that asked it to calibrate.
/// A step of B samples takes fixed_s + B x per_sample_s seconds there.
struct Calibration {
  std::uint32_t index = 0;
  double fixed_s = 0.0;
  double per_sample_s = 0.0;
};
template <class F>
decltype(auto) fields(F&& f, Calibration& x) {
  return f(x.index, x.fixed_s, x.per_sample_s);
}

/// A worker process to the coordinator: it took its assignment, loaded its
/// data and made its actors; a StartTraining starts it at once. The
/// coordinator's training clock starts when every worker is ready.
struct WorkerReady {
  std::uint32_t index = 0;
};
template <class F>
decltype(auto) fields(F&& f, WorkerReady& x) {
  return f(x.index);
}

struct StartTraining {};
template <class F>
decltype(auto) fields(F&& f, StartTraining&) {
  return f();
}

/// The coordinator to a worker process (--stop-at-target): its data feeder
/// serves no more, so the worker stops after the step it is in, reports
/// what it did of its epoch and finishes as after its last epoch.
struct StopTraining {};
template <class F>
decltype(auto) fields(F&& f, StopTraining&) {
  return f();
}

/// The shard statistics request; the reply is a ShardStats (stats_reply).
struct StatsRequest {};
template <class F>
decltype(auto) fields(F&& f, StatsRequest&) {
  return f();
}

/// Every message that crosses a process boundary with its wire type: the
/// one list the type of a message, the check of a frame's type and the
/// dispatch of a decoded frame (visit_wire_type) come from.
template <MsgType Type, class M>
struct On {
  static constexpr MsgType type = Type;
  using message = M;
};
using WireMessages =
    std::tuple<On<MsgType::registration, Registration>, On<MsgType::assignment, Assignment>,
               On<MsgType::push, PushRequest>, On<MsgType::pull, PullRequest>, On<MsgType::parameters, ShardReply>,
               On<MsgType::clock, ClockNotice>, On<MsgType::heartbeat, Heartbeat>,
               On<MsgType::evaluation, EvaluationRequest>, On<MsgType::checkpoint, CheckpointRequest>,
               On<MsgType::shutdown, Shutdown>, On<MsgType::epoch_report, EpochReport>, On<MsgType::failure, Failure>,
               On<MsgType::stats, StatsRequest>, On<MsgType::start, StartTraining>,
               On<MsgType::stats_reply, ShardStats>, On<MsgType::progress, WorkerProgress>,
               On<MsgType::restarted, Restarted>, On<MsgType::calibration, Calibration>,
               On<MsgType::worker_ready, WorkerReady>, On<MsgType::stop_training, StopTraining>>;

/// The wire type of message M.
template <class M>
constexpr MsgType type_of() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    MsgType type{};
    ((std::is_same_v<typename std::tuple_element_t<I, WireMessages>::message, M>
          ? (type = std::tuple_element_t<I, WireMessages>::type, true)
          : false) ||
     ...);
    return type;
  }(std::make_index_sequence<std::tuple_size_v<WireMessages>>{});
}

/// Calls `f.template operator()<M>()` for the message M of wire type `type`;
/// false (and no call) for a type no message has.
template <class F>
bool visit_wire_type(std::uint16_t type, F&& f) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((type == static_cast<std::uint16_t>(std::tuple_element_t<I, WireMessages>::type)
                 ? (f.template operator()<typename std::tuple_element_t<I, WireMessages>::message>(), true)
                 : false) ||
            ...);
  }(std::make_index_sequence<std::tuple_size_v<WireMessages>>{});
}

/// cereal's reading and writing of one string or list through its bound.
template <class T>
struct BoundedIO {
  T& ref;
  std::size_t max;
  template <class Archive>
  void save(Archive& ar) const {
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(ref.size())));
    for (auto& x : ref) item(ar, x);
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
      ar(BoundedIO<std::string>{x, kMaxText});
    } else {
      ar(x);
    }
  }
};

template <class T>
inline constexpr bool kIsVector = false;
template <class T, class A>
inline constexpr bool kIsVector<std::vector<T, A>> = true;

/// One field of a body: a tensor is not in it; strings and lists go through
/// their bounds.
template <class Archive, class T>
void wire_field(Archive& ar, T& x) {
  if constexpr (std::is_same_v<T, std::string>) {
    ar(BoundedIO<std::string>{x, kMaxText});
  } else {
    static_assert(!kIsVector<T>, "a list field needs its bound: bounded(field, max)");
    ar(x);
  }
}
template <class Archive, class T>
void wire_field(Archive&, TensorField<T>) {}
template <class Archive, class T>
void wire_field(Archive& ar, BoundedField<T> x) {
  ar(BoundedIO<T>{x.ref, x.max});
}

/// Writes or reads message `m`'s body: its fields as its description lists
/// them.
template <class Archive, class M>
void archive_message(Archive& ar, M& m) {
  fields([&](auto&&... field) { (wire_field(ar, field), ...); }, m);
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
  if (coding == TensorCoding::float16 && !fits_half(tensor)) coding = TensorCoding::float32;  // this one as it is
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
