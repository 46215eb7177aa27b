#pragma once
// A trained model on disk: what `asgd train --checkpoint-dir DIR` writes at
// the end of a job (DIR/model.ckpt) and `asgd export` reads. One file:
//
//   "ASGDCKPT" | u32 version | u32 header length H | H bytes of JSON
//   | parameters (P float32) | buffers (Q float32) | u32 CRC-32C of all before
//
// little-endian. The JSON holds the model name (and, for a model built from
// a ModelSpec, the spec as "model_spec"), sample shape, classes, the
// dataset's normalisation, the parameter layout and the buffer names and
// sizes, so a reader needs no model code to interpret the numbers. Written
// atomically: a temporary file, fsync, rename, fsync of the folder; a crash
// leaves the old checkpoint or the new one, never half of one.

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "asgd/status.hpp"
#include "compute/tensor.hpp"

namespace asgd {

/// How long a shard actor told to stop may take to write its last
/// checkpoint (after the one being written, if any) before it gives up on
/// it and says so; what a supervisor gives a shard process before SIGKILL.
inline constexpr std::chrono::seconds kShardStopWait{30};

class Model;

struct CheckpointTensor {
  std::string name;      ///< torch.nn state_dict name: "0.weight", "1.running_mean"
  Shape shape;
  std::vector<float> values;
};

struct Checkpoint {
  std::string model;                 ///< "lenet", or a ModelSpec's name
  std::string model_spec;            ///< ModelSpec::to_json() for a model built from code; empty: by name
  Shape sample_shape;                ///< (C, H, W)
  std::size_t classes = 0;
  std::string dataset;               ///< what it was trained on, for the record
  /// Inputs were (pixel / 255 - mean[c]) / stddev[c]: a value per channel,
  /// or one for every channel.
  std::vector<float> input_mean = {0.0f};
  std::vector<float> input_stddev = {1.0f};
  std::uint64_t updates = 0;         ///< parameter updates applied in training
  double test_accuracy = -1.0;       ///< final test accuracy when known, else < 0
  std::vector<CheckpointTensor> params;   ///< in the model's flat layout order
  std::vector<CheckpointTensor> buffers;  ///< BatchNorm running statistics

  /// Copies `model`'s parameters and buffers (layout order).
  static Checkpoint of(Model& model);
};

/// The wall clock that checkpoints are stamped with and their ages measured
/// by: seconds since the Unix epoch.
double unix_seconds_now();

inline constexpr std::uint32_t kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFile = "model.ckpt";

/// The framing asgd's state files share (model and shard checkpoints):
///   MAGIC (8 bytes) | u32 version | u32 H | H bytes of JSON | float32 values | u32 CRC-32C of all before
/// written atomically (temporary file, fsync, rename, fsync of the folder).
struct FramedFile {
  nlohmann::json header;
  std::vector<float> values;  ///< every float after the header, in order
};
/// Errors: io_error naming the path.
Status write_framed(const std::string& path, const char (&magic)[8], std::uint32_t version,
                    const nlohmann::json& header, const std::vector<std::span<const float>>& blocks);
/// What write_framed writes, in memory: for a caller that takes the
/// snapshot on one thread and writes it on another (write_atomically).
std::string framed_bytes(const char (&magic)[8], std::uint32_t version, const nlohmann::json& header,
                         const std::vector<std::span<const float>>& blocks);
/// Writes `bytes` to `path` atomically: PATH.tmp, fsync, rename, fsync of
/// the folder (created if missing). Errors: io_error naming the path.
Status write_atomically(const std::string& path, const std::string& bytes);
/// write_atomically's steps, for a writer that must decide between them
/// (checkpoint_claim.hpp): the folder of `file` made if missing; `bytes`
/// written to `file` and flushed (the file removed on failure); `from`
/// renamed to `to` and the folder flushed. Errors: io_error naming the path.
Status create_parent(const std::string& file);
Status write_synced(const std::string& file, const std::string& bytes);
Status rename_synced(const std::string& from, const std::string& to);
/// Errors: not_found; corruption naming the file for a wrong magic, version,
/// length, header or checksum.
Result<FramedFile> read_framed(const std::string& path, const char (&magic)[8], std::uint32_t version);

/// Writes `ckpt` to `dir`/model.ckpt atomically, creating `dir`.
/// Errors: io_error naming the path.
Status write_checkpoint(const std::string& dir, const Checkpoint& ckpt);

/// Reads `dir`/model.ckpt (or `dir` itself when it is a file). Errors:
/// not_found; corruption for a wrong magic, version, length or checksum,
/// naming the file.
Result<Checkpoint> read_checkpoint(const std::string& dir);

/// The safetensors layout (an 8-byte little-endian header length, a JSON
/// header mapping each name to dtype, shape and byte offsets, the raw
/// tensors): parameters and buffers under their torch state_dict names,
/// plus a "num_batches_tracked" (I64, 0-d) beside each BatchNorm's
/// statistics so torch.nn.Module.load_state_dict accepts it strictly.
/// Metadata carries the model, dataset and input normalisation. Written
/// atomically like checkpoints. What it wrote, or io_error naming the path.
struct SafetensorsFile {
  std::size_t tensors = 0;  ///< num_batches_tracked included
  std::size_t bytes = 0;
};
Result<SafetensorsFile> write_safetensors(const std::string& path, const Checkpoint& ckpt);

}  // namespace asgd
