#pragma once
// Messages between in-process actors, each with its one inspect function
// (CAF uses it to copy, print and, across processes, serialize). Vectors move
// into messages, so in-process sends copy no tensor data.

#include <caf/all.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dataset/dataset.hpp"
#include "policies/policy.hpp"

namespace asgd {

/// worker -> shard: gradients for the shard's key range.
struct PushRequest {
  WorkerId worker = 0;
  Clock clock = 0;
  std::uint64_t base_version = 0;   ///< shard version the gradient was computed on
  bool want_params = true;          ///< answer with the parameters after applying
  std::vector<float> grad;          ///< (range size,)
};

/// shard -> worker: the push's fate and, if asked, fresh parameters. The
/// shard reuses the request's gradient buffer for them (no allocation).
struct PushReply {
  std::uint32_t shard = 0;
  bool applied = false;
  std::uint64_t version = 0;        ///< shard version after this push
  std::vector<float> params;        ///< (range size,) or empty
};

/// worker -> shard: "send me your parameters".
struct PullRequest {
  WorkerId worker = 0;
  Clock clock = 0;
};

/// shard -> worker or coordinator: parameters of one key range.
struct ParamsReply {
  std::uint32_t shard = 0;
  std::uint64_t version = 0;
  std::vector<float> params;        ///< (range size,)
};

/// worker -> coordinator, once per finished epoch.
struct EpochReport {
  WorkerId worker = 0;
  std::uint64_t epoch = 0;          ///< 0-based
  std::uint64_t samples = 0;
  std::uint64_t batches = 0;
  double loss_sum = 0.0;            ///< sum over batches of (mean batch loss * batch size)
  std::uint64_t updates = 0;        ///< pushes every shard applied, this epoch
  double compute_s = 0.0;           ///< forward + backward
  double comm_s = 0.0;              ///< waiting for shard replies
  double data_wait_s = 0.0;         ///< waiting for the data feeder
  std::uint64_t dropped_batches = 0;  ///< gradients not pushed: the loss was NaN or infinite
  std::uint64_t dropped_samples = 0;  ///< their samples (left out of loss_sum)
};

/// shard -> coordinator at the end: what the shard applied.
struct ShardStats {
  std::uint32_t shard = 0;
  std::uint64_t updates_applied = 0;
  std::uint64_t updates_discarded = 0;
  std::uint64_t rejected = 0;                 ///< malformed pushes
  std::vector<std::uint64_t> staleness_histogram;  ///< [s] = applications with staleness s
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PushRequest& x) {
  return f(caf::meta::type_name("PushRequest"), x.worker, x.clock, x.base_version, x.want_params, x.grad);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PushReply& x) {
  return f(caf::meta::type_name("PushReply"), x.shard, x.applied, x.version, x.params);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PullRequest& x) {
  return f(caf::meta::type_name("PullRequest"), x.worker, x.clock);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ParamsReply& x) {
  return f(caf::meta::type_name("ParamsReply"), x.shard, x.version, x.params);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EpochReport& x) {
  return f(caf::meta::type_name("EpochReport"), x.worker, x.epoch, x.samples, x.batches, x.loss_sum,
           x.updates, x.compute_s, x.comm_s, x.data_wait_s, x.dropped_batches, x.dropped_samples);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardStats& x) {
  return f(caf::meta::type_name("ShardStats"), x.shard, x.updates_applied, x.updates_discarded, x.rejected,
           x.staleness_histogram);
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

}  // namespace asgd

CAF_BEGIN_TYPE_ID_BLOCK(asgd, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(asgd, (asgd::PushRequest))
  CAF_ADD_TYPE_ID(asgd, (asgd::PushReply))
  CAF_ADD_TYPE_ID(asgd, (asgd::PullRequest))
  CAF_ADD_TYPE_ID(asgd, (asgd::ParamsReply))
  CAF_ADD_TYPE_ID(asgd, (asgd::EpochReport))
  CAF_ADD_TYPE_ID(asgd, (asgd::ShardStats))
  CAF_ADD_TYPE_ID(asgd, (asgd::data::Batch))
CAF_END_TYPE_ID_BLOCK(asgd)
