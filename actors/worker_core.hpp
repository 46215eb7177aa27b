#pragma once
// The worker's decisions without any actor around it, in the style of
// ShardCore and CoordinatorCore: the shell (actors/worker.cpp) hands it what
// arrived (a batch, a shard's reply, a timer) and performs the Actions it
// appends (requests to the shards and the feeder, reports to the
// coordinator, timers, stopping). Time comes from the TimeSource it is given,
// so tests drive it message by message with a manual clock, no actor system
// and no sleeps (tests/actors/worker_core_test.cpp).
//
// A step: take the next batch (and ask the feeder for the one after),
// compute the gradient, then do what the policy's plan says: update locally
// (hogwild, averaging), push the payload (gradients or parameters) to every
// shard, pull their parameters, and, once every shard has answered, report
// and go on to the next step. A NaN/Inf loss drops the step; ten in a row fail
// the job as diverged. A simulated straggler's step waits on a timer
// (Delay) between computing and pushing, so the core stays free.
//
// Not thread-safe: the actor serialises calls.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/key_range.hpp"
#include "actors/shared_parameters.hpp"
#include "actors/step_cost.hpp"
#include "actors/straggler.hpp"
#include "asgd/status.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "dataset/dataset.hpp"
#include "messaging/collective.hpp"
#include "messaging/protocol.hpp"
#include "policies/policy.hpp"

namespace asgd {

struct WorkerSetup;

/// How often a worker tells the coordinator how far it got (WorkerProgress).
inline constexpr std::chrono::milliseconds kProgressEvery{250};

/// Consecutive NaN/Inf losses after which a worker declares the job
/// diverged (or every step of two epochs, when they are shorter).
inline constexpr std::uint32_t kMaxNonFiniteSteps = 10;

/// What the shell does for the core, in the order appended.
namespace worker_action {
struct Pull { std::size_t shard; PullRequest request; };  ///< request; the reply goes to reply(shard, ...)
struct Push { std::size_t shard; PushRequest request; };  ///< request; the reply goes to reply(shard, ...)
struct RequestBatch {};                                   ///< ask the feeder; the answer goes to batch(...)
struct Report { EpochReport report; };                    ///< to the coordinator
struct Progress { WorkerProgress progress; };             ///< to the coordinator
struct NextStep {};                                       ///< call step() after other messages had their turn
struct Delay { std::chrono::steady_clock::duration after; };  ///< call resume() after this long (a straggler)
struct Watch { std::chrono::steady_clock::duration after; };  ///< call check_overdue() after this long
struct Leave {};                                          ///< out of data: tell every shard we left; stop normally
struct Fail { StatusCode code; std::string message; };    ///< tell the coordinator; stop with this error
}  // namespace worker_action

using WorkerAction =
    std::variant<worker_action::Pull, worker_action::Push, worker_action::RequestBatch, worker_action::Report,
                 worker_action::Progress, worker_action::NextStep, worker_action::Delay, worker_action::Watch,
                 worker_action::Leave, worker_action::Fail>;
using WorkerActions = std::vector<WorkerAction>;

class WorkerCore {
 public:
  using Instant = std::chrono::steady_clock::time_point;
  using TimeSource = std::function<Instant()>;
  using Actions = WorkerActions;

  /// Builds the model on its device, the policy and the local optimizer.
  /// The setup's actor handles are not used: the shell keeps them. Errors:
  /// invalid_argument (a bad model, policy, optimizer or device name, a
  /// policy that needs a shared buffer it was not given), internal (a device
  /// that exists but failed), each message naming the worker.
  static Result<WorkerCore> make(const WorkerSetup& setup, TimeSource now = &std::chrono::steady_clock::now);

  WorkerCore(WorkerCore&&) = default;
  WorkerCore& operator=(WorkerCore&&) = default;

  WorkerId id() const { return id_; }
  Clock step() const { return step_; }
  bool finished() const { return finished_; }
  const Model& model() const { return *model_; }
  const ConsistencyPolicy& policy() const { return *policy_; }
  /// The epoch being trained, so far.
  const EpochReport& report() const { return report_; }
  /// Job-long counts: the reported epochs' plus the current one's.
  WorkerProgress progress() const;

  // What arrives.
  /// Training starts: pull the shards' parameters (unless they are shared),
  /// ask for the first batch, and arm the watchdog.
  void start(Actions& out);
  /// The feeder's answer to RequestBatch (size 0: every epoch is done).
  void batch(data::Batch&& batch, Actions& out);
  /// Shard `shard` answered the Pull or Push sent to it.
  void reply(std::size_t shard, ShardReply& reply, Actions& out);
  /// The Pull or Push to shard `shard` failed (`what`: "pull" or "push");
  /// `error` is the transport's description; the worker fails with `code`.
  void request_failed(const char* what, std::size_t shard, const std::string& error, Actions& out,
                      StatusCode code = StatusCode::timeout);
  /// The feeder did not answer RequestBatch.
  void feeder_failed(const std::string& error, Actions& out);
  /// NextStep's turn.
  void step(Actions& out) { try_step(out); }
  /// A straggler's Delay is over.
  void resume(Actions& out);
  /// allreduce, gossip: the exchange begun after computing is done (the
  /// setup's `exchanged` was called): apply its result and go on.
  void exchanged(Actions& out);
  /// Watch's turn: fails the job, naming who did not answer, once a reply or
  /// a batch is overdue (setup's rpc_timeout); otherwise Watch again.
  void check_overdue(Actions& out);
  /// What a step costs on this worker's device, straggling included: steps
  /// on the first quarter of `probe` and on all of it (after a warm-up step
  /// of each, which also lets a GPU choose its algorithms for the size).
  StepCost calibrate(const data::Batch& probe);
  /// Stops the job with `code`, once: later calls append nothing.
  void fail(StatusCode code, const std::string& what, Actions& out);

 private:
  WorkerCore() = default;
  double seconds_since(Instant t) const;
  void try_step(Actions& out);
  bool count_loss(float loss, const data::Batch& batch, Actions& out);
  void continue_step(Actions& out);
  void finish_step(Actions& out);
  void out_of_data(Actions& out);
  void leave(Actions& out);
  void accept_params(std::size_t shard, ShardReply& reply, Actions& out);
  void begin_round_trip();
  void send_pulls(Actions& out);
  void send_pushes(Clock clock, bool want_params, Actions& out);
  void request_batch(Actions& out);
  void accumulate(bool push_now);
  void hogwild_step();
  void drop_nonfinite_gradient();
  void end_step(const StepPlan& plan, Actions& out);
  void begin_exchange(Actions& out);
  void take_mean();
  void take_peer_copies();
  void after_exchange(Actions& out);
  void record_staleness(Clock staleness);
  void report_epoch(Instant now, Actions& out);
  void send_progress(Actions& out);

  TimeSource now_;
  WorkerId id_ = 0;
  std::vector<KeyRange> ranges_;                 // ranges_[i]: what shard i owns
  std::chrono::steady_clock::duration rpc_timeout_{};
  Straggler straggler_;
  LrSchedule schedule_;
  std::shared_ptr<SharedParameters> shared_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ConsistencyPolicy> policy_;
  std::unique_ptr<Optimizer> local_optimizer_;  // when the plan updates locally
  std::shared_ptr<messaging::Collective> collective_;  // allreduce, gossip
  std::function<void()> exchanged_;             // what the collective calls when our exchange is done

  Clock step_ = 0;                               // steps completed: the worker's clock
  std::vector<Clock> base_clock_;                // per shard: complete clock of our copy
  std::vector<std::uint64_t> base_version_;      // per shard: its version of our copy
  std::vector<std::vector<float>> buffers_;      // per shard: recycled message buffers
  std::vector<float> accumulated_;               // (num_params,) gradients summed between pushes
  std::size_t unpushed_steps_ = 0;               // steps whose work no push has carried yet
  std::uint32_t unpushed_samples_ = 0;
  bool sum_in_model_ = false;                    // the unpushed gradients are exactly the model's grads()

  // The step in flight.
  const char* in_flight_ = "pull";              // what the round trip asked for: "pull" or "push"
  std::size_t outstanding_ = 0;                  // shard replies still expected
  std::vector<bool> awaiting_;                   // per shard: reply still expected
  std::size_t applied_in_step_ = 0;
  double held_in_step_ = 0.0;                    // longest a shard held this step's read
  bool step_ends_epoch_ = false;
  std::uint64_t step_epoch_ = 0;
  bool step_dropped_ = false;                    // the step's loss was NaN/Inf
  std::uint32_t step_samples_ = 0;
  Instant comm_start_{};

  // The batch the next step trains on.
  std::optional<data::Batch> next_batch_;
  bool batch_requested_ = false;
  Instant batch_requested_at_{};
  std::optional<Instant> idle_since_;            // ready, but no batch yet
  // Every moment of a worker's time goes to one phase of report_: lap_ is
  // where the last phase ended, epoch_start_ where this epoch began.
  Instant lap_{};
  Instant epoch_start_{};
  // Adds the time from lap_ to `t` to `phase` and moves lap_ there.
  void lap(Instant t, double& phase);

  EpochReport report_;                           // the epoch being trained
  WorkerProgress finished_epochs_;               // cumulative counts of the epochs already reported
  Instant last_progress_{};                      // when the coordinator last heard how far we got
  std::uint32_t nonfinite_streak_ = 0;           // consecutive steps with a NaN/Inf loss
  std::uint32_t epoch_steps_ = 0;                // steps of this epoch so far
  bool straggling_ = false;                      // a delayed step is waiting for resume()
  bool exchanging_ = false;                      // waiting for exchanged()
  Instant exchange_start_{};
  bool finishing_ = false;                       // out of data: the last push is in flight
  bool finished_ = false;
};

}  // namespace asgd
