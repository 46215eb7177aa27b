#pragma once
// Runs chosen actors on the thread that delivers their messages, instead of
// waking one of CAF's threads for them.
//
// A shard process's bridge thread reads a push, hands it to shard_server,
// which asks the shard actor, whose reply shard_server gives back to the
// bridge: three cheap hops, and before this the first of them woke a CAF
// thread (30 us on the 2-core VM at the median, 100 us on average in the
// default job, where the workers keep both cores busy). With the two actors
// run here, a push is checked, applied and answered on the bridge thread
// without a thread waking up.
//
// CAF schedules an actor that a message unblocks on the execution unit of
// whoever sent it (scheduled_actor::enqueue calls its exec_later); this unit
// keeps the actors it was told to run and resumes them before post()
// returns, and passes every other actor to CAF's scheduler as an
// anonymous send from this thread would. An actor is still resumed by one
// thread at a time (CAF's mailbox decides who schedules it); one that has
// more messages than kThroughput goes back to CAF's scheduler.
//
// Not thread-safe: one thread owns a unit and is the only one to call
// post(). The actors it runs must not wait for that thread (a bridge's
// connect or set_bound_limits would then wait for ever): shard_server and
// parameter_shard only send through it.

#include <caf/all.hpp>

#include <cstddef>
#include <vector>

namespace asgd::messaging {

class InlineUnit final : public caf::execution_unit {
 public:
  /// Runs `actors` (of `system`) on the posting thread; keeps them alive.
  InlineUnit(caf::actor_system& system, std::vector<caf::actor> actors);
  ~InlineUnit() override;
  InlineUnit(const InlineUnit&) = delete;
  InlineUnit& operator=(const InlineUnit&) = delete;

  /// Delivers `message` to `to` as an anonymous send and, if that wakes one
  /// of this unit's actors, runs it (and whatever it wakes of them in turn)
  /// before returning.
  void post(const caf::actor& to, caf::mailbox_element_ptr message);

  /// From CAF, for a resumable that a message sent on this unit unblocked.
  void exec_later(caf::resumable* job) override;

  /// Messages an actor handles here in a row before it goes to CAF's
  /// scheduler with the rest.
  static constexpr std::size_t kThroughput = 16;

 private:
  void run_queued();

  std::vector<caf::actor> actors_;
  std::vector<caf::resumable*> queued_;  // unblocked, each holding a reference
  bool running_ = false;
};

}  // namespace asgd::messaging
