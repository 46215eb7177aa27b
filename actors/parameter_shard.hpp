#pragma once
// parameter_shard: owns one key range of the model's parameters, keeps the
// clock table of the workers that push to it, applies or aggregates pushes,
// and answers reads, each exactly when the consistency policy says. It
// counts how stale every applied update was (see policies/policy.hpp).
//
// Accepts:
//   (push_atom, PushRequest)     -> ShardReply   (held while the policy holds the read it asks for)
//   (pull_atom, PullRequest)     -> ShardReply   (held while the policy says no)
//   (leave_atom, WorkerId)       a worker has finished: stop waiting for it
//   (join_atom, WorkerId, Clock) a worker that had left is back, at that clock
//   (snapshot_atom)              -> ShardReply   for evaluation, never held
//   (stats_atom)                 -> ShardStats

#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/key_range.hpp"
#include "messaging/protocol.hpp"
#include "actors/shared_parameters.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "policies/policy.hpp"

namespace asgd {

struct ShardSetup {
  std::uint32_t index = 0;
  KeyRange range;
  std::vector<float> initial;       ///< (range.size(),) starting parameters; ignored with `shared`
  OptimizerConfig optimizer;
  PolicyConfig policy;
  LrSchedule schedule;              ///< by the model's progress: an aggregate's clock, else the workers' mean clock
  std::uint32_t workers = 1;        ///< workers 0..workers-1 push to this shard
  bool staleness_aware_lr = false;  ///< divide an applied update's step by its staleness (when > 1)
  /// hogwild: the shard serves snapshots of this buffer's range instead of
  /// owning parameters (the workers update it themselves).
  std::shared_ptr<SharedParameters> shared;
  /// Where the actor writes this shard's checkpoint (ShardCore::save) every
  /// `checkpoint_every_s` seconds; empty or 0: never.
  std::string checkpoint_path;
  double checkpoint_every_s = 0.0;
  /// The job's training split's fingerprint, written into each checkpoint
  /// (a resume on other data is refused by it); 0: not known.
  std::uint32_t train_fingerprint = 0;
  /// A read held this many seconds is logged once, naming the workers it
  /// waits for (describe_overdue_reads); 0: never. Jobs set half of
  /// --rpc-timeout, so the log names the laggard before a worker gives up.
  double hold_warning_s = 0.0;
};

/// DIR/shard-K.ckpt: where shard K of a job checkpointing into DIR writes.
std::string shard_checkpoint_path(const std::string& dir, std::uint32_t index);

/// The shard's logic without any actor around it, so tests drive it message
/// by message. Not thread-safe; the actor serialises calls. Move-only.
class ShardCore {
 public:
  using Ticket = std::uint64_t;  ///< the caller's handle for a reply it owes
  using Instant = std::chrono::steady_clock::time_point;
  struct Answer {
    Ticket ticket;
    ShardReply reply;
  };

  /// Errors: invalid_argument for a bad optimizer or policy, no workers, or
  /// an initial vector whose size is not the range's.
  static Result<ShardCore> make(ShardSetup setup);

  ShardCore(ShardCore&&) = default;
  ShardCore& operator=(ShardCore&&) = default;

  std::uint32_t index() const { return setup_.index; }
  const ShardSetup& setup() const { return setup_; }
  const KeyRange& range() const { return setup_.range; }
  std::span<const float> params() const { return params_; }
  const ConsistencyPolicy& policy() const { return *policy_; }
  ClockView view() const;
  /// Complete clock of the current parameters: every update of clocks below it is in.
  Clock complete_clock() const;
  std::size_t held_reads() const { return held_.size(); }
  /// For the log: held reads that have waited `after` or longer at `now`
  /// and were not described before, in one line naming the oldest of them
  /// and the slowest live workers, whose clocks hold them back; nullopt
  /// when there are none. Marks them described.
  std::optional<std::string> describe_overdue_reads(Instant now, std::chrono::duration<double> after);

  /// A push. Appends to `out` the replies that are due now: the push's own
  /// (unless the policy holds the read it asks for) and every held read the
  /// push released. A malformed push (wrong size, unknown or departed
  /// worker, a second push for an aggregate's slot) is counted and answered
  /// `rejected`, without parameters. A push with no samples and an empty
  /// payload is a clock tick: it advances the worker's clock (and counts
  /// towards an aggregate) without changing any parameter.
  void push(PushRequest&& request, Ticket ticket, Instant now, std::vector<Answer>& out);

  /// A read at pull.clock: answered into `out` now or held until allowed.
  void pull(const PullRequest& pull, Ticket ticket, Instant now, std::vector<Answer>& out);

  /// Worker `worker` is done: it no longer counts for min_clock or for
  /// aggregates, which may release held reads into `out`.
  void leave(WorkerId worker, Instant now, std::vector<Answer>& out);

  /// Worker `worker`, which had left (lost), is back: its pushes count
  /// again, from clock `clock` on (its first step's). Releases nothing: a
  /// worker at or past every other worker's clock holds no barrier back.
  void rejoin(WorkerId worker, Clock clock);

  /// The current parameters, regardless of policy (for evaluation).
  ShardReply snapshot() const;
  /// Writes what a restarted shard needs to go on (parameters, optimizer
  /// state, each worker's clock and liveness, counters) to `path`,
  /// atomically with a checksum (actors/checkpoint.hpp's framing). Reads
  /// that are held and aggregates not yet committed are not in it: their
  /// work is what a restore loses, at most one checkpoint interval.
  /// Errors: io_error naming the path.
  Status save(const std::string& path) const;
  /// What save() writes, in memory: a snapshot taken in one pass over the
  /// values, for the actor to write on another thread while it serves on,
  /// stamped `taken_unix_s` (the time the actor keeps as its newest
  /// checkpoint's, so that the file and the actor's account agree).
  std::string checkpoint_bytes(double taken_unix_s) const;
  /// Loads what save() wrote into this shard, after checking that it is
  /// this shard's (index, range, workers, optimizer); worker w's clock then
  /// starts again at restart[w] (where the workers resume), every worker
  /// counted live again. With `restart` empty (a shard process restarted
  /// while its workers go on), the clocks and the workers that had left
  /// are the checkpoint's. Errors:
  /// not_found, corruption (naming the file), invalid_argument for another
  /// shard's or job's file.
  Status restore(const std::string& path, std::span<const Clock> restart);
  /// What a checkpoint holds beyond its values: the counters and per-worker
  /// clocks (to decide where a resumed job starts) and when it was written.
  struct Saved {
    ShardStats stats;
    std::string optimizer;  ///< the optimizer whose state it holds
    double written_unix_s = 0.0;
    std::uint32_t train_fingerprint = 0;  ///< the training split it was trained on; 0: not recorded
  };
  /// Errors as restore.
  static Result<Saved> saved(const std::string& path);

  /// Its counters, and how it stands now (keys, held reads, worker clocks;
  /// `queued` is the actor's to fill).
  ShardStats stats() const;

 private:
  /// Per worker, the steps applied: the clocks of the pushes, or under
  /// hogwild (no pushes) those of the shared buffer.
  std::vector<Clock> worker_clocks() const;
  /// Updates applied: under hogwild, the workers' steps on the shared buffer.
  std::uint64_t updates_applied() const;

  struct Aggregate {
    std::vector<std::vector<float>> slots;  // per worker: (range size,) or empty
    std::vector<std::uint32_t> samples;     // per worker: 0 for a clock tick (no payload)
    std::vector<bool> present;              // per worker: pushed for this clock
    std::vector<Clock> base;                // per worker: base_clock of its push
    std::uint32_t count = 0;
  };
  struct Held {
    Ticket ticket;
    PullInfo read;
    PushOutcome outcome;
    std::vector<float> buffer;  // reused for the reply
    Instant since;
    bool described = false;     // logged by describe_overdue_reads
  };

  ShardCore() = default;
  ShardReply reply(PushOutcome outcome, std::vector<float> buffer, bool with_params) const;
  void answer_or_hold(Ticket ticket, PullInfo read, PushOutcome outcome, std::vector<float> buffer, Instant now,
                      std::vector<Answer>& out);
  // A push the policy applies at once, summing `summed` steps (its weight
  // decay is taken that many times); true when it answered the push's read
  // in the same pass (the reply is in `out`).
  bool apply(PushRequest& req, std::span<const float> payload, bool remote, Clock summed, Ticket ticket,
             std::vector<Answer>& out);
  bool publish(const PushRequest& req, std::span<const float> payload);
  // A push into its clock's aggregate, committed once complete.
  void aggregate(PushRequest& req, std::span<const float> payload, bool remote);
  void commit_ready_aggregates();
  void release_held(Instant now, std::vector<Answer>& out);
  void record_staleness(Clock clock, Clock base);
  // Also sets the optimizer's momentum for the step it scales.
  float lr_scale(Clock clock, std::uint64_t staleness);
  using Written = std::function<void(std::size_t, std::size_t)>;
  // Folds what is applied (a push, or a commit's mean) into the parameters
  // by the policy's Combine rule; with a `reply` (may be `pushed` itself),
  // writes there what the reply carries, calling `written` as it is final.
  void fold(std::span<const float> pushed, float scale, std::span<float> reply, const Written& written);

  ShardSetup setup_;
  std::vector<float> owned_;            // (range.size(),) unless shared
  std::span<float> params_;             // owned_ or the shared buffer's range
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<ConsistencyPolicy> policy_;
  std::uint64_t version_ = 0;           // optimizer steps or averages taken
  std::vector<Clock> clock_;            // per worker: highest pushed clock + 1
  std::vector<bool> live_;              // per worker
  Clock committed_ = 0;
  Clock newest_copy_ = 0;              // allreduce, gossip: 1 + the clock of the copy held (0: none yet)
  Clock push_every_ = 1;               // async's --push-every; 1 under every other policy
  std::map<Clock, Aggregate> pending_;  // by clock, committed in order
  std::vector<float> mean_;             // (range.size(),) scratch for commits
  std::vector<Held> held_;
  ShardStats stats_;
};

struct ShardState {
  std::unique_ptr<ShardCore> core;
  std::map<ShardCore::Ticket, caf::response_promise> promises;  // replies owed for held reads
  std::string checkpoint_path;             // from ShardSetup; empty: no periodic checkpoints
  std::uint64_t claim = 0;                 // this actor's claim on checkpoint_path (checkpoint_claim.hpp); 0: none yet
  bool superseded = false;                 // a newer claim was taken: another process took this shard's place
  caf::timespan checkpoint_every{};
  std::uint64_t checkpoint_failures = 0;   // writes that failed, in all
  std::uint64_t failures_in_a_row = 0;     // since the last that succeeded
  double checkpoint_unix_s = 0.0;          // when the newest good checkpoint was taken (or the one reloaded); 0: none
  struct Writing {                         // the checkpoint being written on a thread of its own
    std::future<Status> done;              // not valid(): none is
    const char* what = "";                 // "periodic", "final", "stopping"
    double taken_unix_s = 0.0;             // when its snapshot was taken
    std::chrono::steady_clock::time_point since{};
    double snapshot_s = 0.0;               // how long the snapshot took
    std::uint64_t changes = 0;             // `changes` when the snapshot was taken
  } writing;
  const char* queued_what = nullptr;       // a final checkpoint asked for while one was being written
  std::uint64_t changes = 0;               // messages handled that change what a checkpoint holds
  std::optional<std::uint64_t> saved_changes;  // `changes` when the newest good checkpoint took its snapshot
  std::uint64_t skipped_in_a_row = 0;      // periodic ones skipped because the one before was still being written
  caf::timespan hold_warning{};            // from ShardSetup; zero: held reads are not watched
  bool watching = false;                   // a watch_atom is on its way
  ShardCore::Ticket next_ticket = 0;
  std::vector<ShardCore::Answer> answers;  // reused between messages
  static inline const char* name = "parameter_shard";
};

/// The actor. `core` must be built with ShardCore::make.
caf::behavior parameter_shard(caf::stateful_actor<ShardState>* self, std::shared_ptr<ShardCore> core);

}  // namespace asgd
