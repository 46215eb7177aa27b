// The shard actor: a thin shell around ShardCore (parameter_shard.cpp) that
// serialises its calls, delivers the replies it held, and writes its
// checkpoints.
#include "base/log.hpp"

#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <utility>

#include "actors/checkpoint.hpp"
#include "actors/checkpoint_claim.hpp"
#include "actors/parameter_shard.hpp"
#include "actors/thrown.hpp"

namespace asgd {

namespace {

using Seconds = std::chrono::duration<double>;

// How often the actor looks whether the write in progress has ended.
constexpr auto kWrittenPoll = std::chrono::milliseconds(50);

// Keeps count of a checkpoint write that ended. A failure is the
// operator's to see at once: a restart now loses everything since the last
// checkpoint that was written, which grows with every failed interval. So
// the first failure of a run of them is a warning that says so, later ones
// every tenth, and the first success after them says how many failed.
void account(ShardState& st, const Status& s, const char* when, double taken_unix_s) {
  const std::uint32_t index = st.core->index();
  if (s.code() == StatusCode::cancelled) {  // write_claimed: another process took this shard's place
    st.superseded = true;
    logger().error("shard {}: {} checkpoint not written, nor any after it: {}", index, when, s.message());
    return;
  }
  if (!s.ok()) {
    ++st.checkpoint_failures;
    ++st.failures_in_a_row;
    if (st.failures_in_a_row % 10 == 1) {
      const std::string since =
          st.checkpoint_unix_s > 0 ? fmt::format("its last checkpoint, {:.0f} s ago", unix_seconds_now() - st.checkpoint_unix_s)
                                   : std::string("the start of training (none was written yet)");
      logger().warn("shard {}: {} checkpoint failed ({} in a row): {}; until one is written, a restart of this shard "
                   "loses every update since {}",
                   index, when, st.failures_in_a_row, s.message(), since);
    }
    return;
  }
  if (st.failures_in_a_row > 0)
    logger().info("shard {}: checkpoint written again after {} failed", index, st.failures_in_a_row);
  st.failures_in_a_row = 0;
  st.checkpoint_unix_s = taken_unix_s;
}

// Accounts for the write in progress if it has ended by `until`. Returns
// whether none is in progress now.
bool collect(ShardState& st, std::chrono::steady_clock::time_point until = {}) {
  if (!st.writing.done.valid()) return true;
  if (st.writing.done.wait_until(until) != std::future_status::ready) return false;
  const Status s = st.writing.done.get();
  const double seconds = Seconds(std::chrono::steady_clock::now() - st.writing.since).count();
  account(st, s, st.writing.what, st.writing.taken_unix_s);
  if (s.ok()) st.saved_changes = st.writing.changes;
  logger().debug("shard {}: {} checkpoint: snapshot in {:.1f} ms, written in {:.1f} ms", st.core->index(),
                 st.writing.what, st.writing.snapshot_s * 1e3, seconds * 1e3);
  return true;
}

// Takes the snapshot (one pass over the values, in memory) and writes it
// on a thread of its own, so the shard serves on while the disk takes its
// time: seconds for a big shard on a slow or network file system. (A shard
// process may run this actor on its bridge's thread, which would otherwise
// neither read nor send for as long, heartbeats included.) The thread is
// detached: a write stuck in the kernel (a dead network mount) holds no
// one who gives up waiting for it. One write at a time.
void start_write(ShardState& st, const char* when) {
  st.writing.what = when;
  st.writing.changes = st.changes;
  st.writing.since = std::chrono::steady_clock::now();
  st.writing.taken_unix_s = unix_seconds_now();
  std::string bytes = st.core->checkpoint_bytes(st.writing.taken_unix_s);
  st.writing.snapshot_s = Seconds(std::chrono::steady_clock::now() - st.writing.since).count();
  std::promise<Status> written;
  st.writing.done = written.get_future();
  if (st.claim == 0) {  // start_timers could not take it
    auto claim = claim_checkpoint(st.checkpoint_path);
    if (!claim) {
      written.set_value(claim.status());
      return;
    }
    st.claim = *claim;
  }
  std::thread([path = st.checkpoint_path, claim = st.claim, bytes = std::move(bytes), written = std::move(written)]() mutable {
    written.set_value(write_claimed(path, claim, bytes));
  }).detach();
}

// A checkpoint now, or (for a final one) once the write in progress ends;
// the actor looks for the end of each write every kWrittenPoll.
void begin_checkpoint(caf::stateful_actor<ShardState>* self, const char* when) {
  auto& st = self->state;
  const bool idle = collect(st);
  if (st.superseded) return;
  if (!idle) {
    st.queued_what = when;  // the write in progress's look starts it
    return;
  }
  start_write(st, when);
  self->delayed_send(self, kWrittenPoll, written_atom::value);
}

// Whether the newest good checkpoint holds the state as it is. Under
// hogwild the workers write the parameters without telling the shard: never.
bool saved_as_is(const ShardState& st) { return st.saved_changes == st.changes && !st.core->setup().shared; }

// The timer's tick: a checkpoint, unless the one before is still being
// written or holds this state already (an idle shard, a job between
// phases: the same bytes again, seconds of disk for a big shard), and the
// next tick.
void periodic_checkpoint(caf::stateful_actor<ShardState>* self) {
  auto& st = self->state;
  const bool idle = collect(st);
  if (st.superseded) return;  // no more ticks: its checkpoints are another process's now
  if (idle) {
    st.skipped_in_a_row = 0;
    if (!saved_as_is(st)) begin_checkpoint(self, "periodic");
  } else if (st.skipped_in_a_row++ % 10 == 0) {
    logger().warn("shard {}: periodic checkpoint skipped: the one taken {:.1f} s ago is still being written "
                  "(writing takes longer than --checkpoint-every {:g} s)",
                  st.core->index(), Seconds(std::chrono::steady_clock::now() - st.writing.since).count(),
                  Seconds(st.checkpoint_every).count());
  }
  self->delayed_send(self, st.checkpoint_every, tick_atom::value);
}

// Accounts for the write once it ends, then starts the one queued.
void look_whether_written(caf::stateful_actor<ShardState>* self) {
  auto& st = self->state;
  if (!collect(st)) {
    self->delayed_send(self, kWrittenPoll, written_atom::value);
  } else if (st.queued_what != nullptr) {
    begin_checkpoint(self, std::exchange(st.queued_what, nullptr));
  }
}

// For a shard told to stop, whose state must be on disk before it goes:
// the checkpoint of its last state, after the write in progress, waiting
// for both at most kShardStopWait; none when the newest good one holds it
// already (the final checkpoint of a job that then ends: a big shard on a
// slow disk wrote the same bytes twice).
void checkpoint_before_stopping(ShardState& st) {
  const auto deadline = std::chrono::steady_clock::now() + kShardStopWait;
  st.queued_what = nullptr;
  bool written = collect(st, deadline);
  if (st.superseded) return;  // said when it was learnt
  if (written && saved_as_is(st)) {
    logger().debug("shard {}: stopping; its last checkpoint holds this state already", st.core->index());
    return;
  }
  if (written) {
    start_write(st, "stopping");
    written = collect(st, deadline);
  }
  if (!written)
    logger().error("shard {}: stopping without the checkpoint of its last state: the {} checkpoint's write, begun "
                   "{:.0f} s ago, has not ended (is the disk of {} answering?); a resume loses every update since {}",
                   st.core->index(), st.writing.what, Seconds(std::chrono::steady_clock::now() - st.writing.since).count(),
                   st.checkpoint_path,
                   st.checkpoint_unix_s > 0 ? fmt::format("the checkpoint of {:.0f} s ago", unix_seconds_now() - st.checkpoint_unix_s)
                                            : std::string("the start"));
}

// Periodic checkpoints and the watch over held reads, as the setup asks.
void start_timers(caf::stateful_actor<ShardState>* self) {
  self->state.checkpoint_unix_s = self->state.core->stats().restored_unix_s;  // the one reloaded, if any
  // Periodic checkpoints: the snapshot is taken on the shard's own thread
  // between requests (the parameters cannot change while it is taken) and
  // written on another.
  const ShardSetup& setup = self->state.core->setup();
  if (!setup.checkpoint_path.empty() && setup.checkpoint_every_s > 0) {
    self->state.checkpoint_path = setup.checkpoint_path;
    // Claimed before the first request: from now on a process of this
    // shard that was given up for dead no longer writes over this one's.
    if (auto claim = claim_checkpoint(setup.checkpoint_path)) {
      self->state.claim = *claim;
    } else {
      logger().warn("shard {}: {}; its first checkpoint tries again", self->state.core->index(),
                    claim.status().message());
    }
    self->state.checkpoint_every =
        std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(setup.checkpoint_every_s));
    self->delayed_send(self, self->state.checkpoint_every, tick_atom::value);
    // Told to stop (a job that ends, is cancelled or fails; a shard process
    // shut down): keep the state reached, so --resume loses nothing of a
    // job stopped on purpose. Only a killed process loses up to an interval.
    self->set_exit_handler([self](caf::exit_msg& msg) {
      checkpoint_before_stopping(self->state);
      self->quit(msg.reason);
    });
  }
  // While reads are held, looks at them every quarter of the warning time
  // and logs those held past it, once each, naming whom they wait for.
  if (setup.hold_warning_s > 0)
    self->state.hold_warning =
        std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(setup.hold_warning_s));
}

// The exit reason says what was thrown; the coordinator, which watches the
// shard, fails the job with it.
void report_what_is_thrown(caf::stateful_actor<ShardState>* self) {
  self->set_exception_handler([self](caf::scheduled_actor*, std::exception_ptr& thrown) {
    return thrown_error(thrown, "shard " + std::to_string(self->state.core ? self->state.core->index() : 0));
  });
}

}  // namespace

caf::behavior parameter_shard(caf::stateful_actor<ShardState>* self, std::shared_ptr<ShardCore> core) {
  report_what_is_thrown(self);
  self->state.core = std::make_unique<ShardCore>(std::move(*core));
  start_timers(self);
  auto watch = [self] {
    auto& st = self->state;
    if (st.watching || st.hold_warning == caf::timespan{} || st.core->held_reads() == 0) return;
    st.watching = true;
    self->delayed_send(self, st.hold_warning / 4, watch_atom::value);
  };
  // Delivers the answers the core produced for held reads (through their
  // promises) and hands back the current request's own, if it is due.
  auto flush = [self](std::optional<ShardCore::Ticket> current) {
    auto& st = self->state;
    std::optional<ShardReply> own;
    for (auto& a : st.answers) {
      if (a.ticket == current) {
        own = std::move(a.reply);
      } else if (auto it = st.promises.find(a.ticket); it != st.promises.end()) {
        it->second.deliver(std::move(a.reply));
        st.promises.erase(it);
      }
    }
    st.answers.clear();
    return own;
  };
  auto deliver = [self, flush](ShardCore::Ticket current) -> caf::result<ShardReply> {
    if (auto own = flush(current)) return std::move(*own);
    self->state.promises.emplace(current, self->make_response_promise());
    return caf::delegated<ShardReply>();
  };
  return {
      [self, deliver, watch](push_atom, PushRequest& request) {
        auto& st = self->state;
        const auto ticket = st.next_ticket++;
        ++st.changes;
        st.core->push(std::move(request), ticket, std::chrono::steady_clock::now(), st.answers);
        watch();
        return deliver(ticket);
      },
      [self, deliver, watch](pull_atom, const PullRequest& request) {
        auto& st = self->state;
        const auto ticket = st.next_ticket++;
        st.core->pull(request, ticket, std::chrono::steady_clock::now(), st.answers);
        watch();
        return deliver(ticket);
      },
      [self, watch](watch_atom) {
        auto& st = self->state;
        st.watching = false;
        if (auto line = st.core->describe_overdue_reads(std::chrono::steady_clock::now(), st.hold_warning))
          logger().warn("{}", *line);
        watch();
      },
      [self, flush](leave_atom, WorkerId worker) {
        auto& st = self->state;
        ++st.changes;
        st.core->leave(worker, std::chrono::steady_clock::now(), st.answers);
        flush(std::nullopt);
        // The last worker is done: this state is final, keep it.
        if (!st.checkpoint_path.empty() && st.core->view().live_workers == 0) begin_checkpoint(self, "final");
      },
      [self](join_atom, WorkerId worker, Clock clock) {
        ++self->state.changes;
        self->state.core->rejoin(worker, clock);
      },
      [self](snapshot_atom) { return self->state.core->snapshot(); },
      [self](tick_atom) { periodic_checkpoint(self); },
      [self](written_atom) { look_whether_written(self); },
      [self](stats_atom) {
        collect(self->state);
        const auto& st = self->state;
        ShardStats s = st.core->stats();
        s.queued = self->mailbox().size();
        s.checkpoint_failures = st.checkpoint_failures;
        s.checkpoint_unix_s = st.checkpoint_unix_s;
        return s;
      },
  };
}

}  // namespace asgd
