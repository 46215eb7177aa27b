#pragma once
// data_feeder: shuffles and batches one worker's partition of the training
// split, on a thread of its own (spawned detached), ahead of time, into a
// bounded buffer, so the worker never waits for data in steady state.
//
// Accepts:
//   (next_atom)     -> data::Batch   the next batch; size 0 once every epoch is done
//   (stop_atom)     serve no more: every next_atom from now on (and one
//                   waiting) gets size 0, as after the last epoch
//                   (--stop-at-target)
//   (produce_atom)  self-message: make one more batch if the buffer has room

#include <caf/all.hpp>

#include <deque>
#include <memory>

#include "messaging/protocol.hpp"
#include "dataset/augment.hpp"
#include "dataset/dataset.hpp"

namespace asgd {

struct FeederSetup {
  std::shared_ptr<const data::DatasetSplits> data;
  data::Partition partition;        ///< which training samples this feeder serves
  std::uint32_t epochs = 1;
  std::uint32_t batch = 64;
  std::uint32_t capacity = 4;       ///< batches kept ready, >= 1
  std::uint64_t seed = 1;
  std::uint64_t stream = 0;         ///< per-worker shuffling stream
  std::uint32_t first_epoch = 0;    ///< where a resumed job starts (earlier epochs are skipped, not served)
  data::Augment augment;            ///< applied to each batch, drawn from (seed, stream, epoch, batch index)
};

/// Batching logic without the actor: yields the batches of every epoch in
/// order, reshuffling the partition at each epoch start. Not thread-safe.
class BatchSource {
 public:
  explicit BatchSource(FeederSetup setup);
  bool exhausted() const { return epoch_ >= setup_.epochs; }
  /// The next batch; size 0 when exhausted.
  data::Batch next();

 private:
  FeederSetup setup_;
  std::uint64_t epoch_ = 0;
  std::size_t pos_ = 0;
  std::uint64_t index_ = 0;
  std::vector<std::size_t> order_;  // this epoch's sample indices into the training split
  void start_epoch();
};

struct FeederState {
  std::unique_ptr<BatchSource> source;
  std::deque<data::Batch> ready;
  std::uint32_t capacity = 4;
  std::deque<caf::response_promise> waiting;
  bool producing = false;           // a produce_atom is in the mailbox
  bool stopped = false;             // stop_atom came: nothing more is served
  static inline const char* name = "data_feeder";
};

caf::behavior data_feeder(caf::stateful_actor<FeederState>* self, FeederSetup setup);

}  // namespace asgd
