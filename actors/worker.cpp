#include "actors/worker.hpp"

#include <type_traits>

#include "actors/thrown.hpp"

namespace asgd {

namespace {

using Self = caf::stateful_actor<WorkerState>*;

void perform(Self self, WorkerActions& actions);

// Hands one decision of the core to the world: a message, a timer or the
// actor's end.
void perform_one(Self self, WorkerAction& action) {
  auto& st = self->state;
  std::visit(
      [self, &st](auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, worker_action::Pull> || std::is_same_v<A, worker_action::Push>) {
          constexpr bool is_pull = std::is_same_v<A, worker_action::Pull>;
          const std::size_t shard = a.shard;
          auto on_reply = [self, shard](ShardReply& reply) {
            WorkerActions out;
            self->state.core->reply(shard, reply, out);
            perform(self, out);
          };
          auto on_error = [self, shard](caf::error& err) {
            WorkerActions out;
            // A runtime_error is the bridge's word that the shard refused
            // this process's key (remote_shard): the keys' folders to fix.
            const StatusCode code =
                err == caf::sec::runtime_error ? StatusCode::invalid_argument : StatusCode::timeout;
            self->state.core->request_failed(is_pull ? "pull" : "push", shard, reason_text(self->system(), err), out,
                                             code);
            perform(self, out);
          };
          // No CAF timeout on the hot path (each would wake CAF's timer
          // thread twice per step): the core's watchdog (Watch) checks them.
          if constexpr (is_pull) {
            self->request(st.setup.shards[shard], caf::infinite, pull_atom::value, a.request).then(on_reply, on_error);
          } else {
            self->request(st.setup.shards[shard], caf::infinite, push_atom::value, std::move(a.request))
                .then(on_reply, on_error);
          }
        } else if constexpr (std::is_same_v<A, worker_action::RequestBatch>) {
          self->request(st.setup.feeder, caf::infinite, next_atom::value)
              .then(
                  [self](data::Batch& batch) {
                    WorkerActions out;
                    self->state.core->batch(std::move(batch), out);
                    perform(self, out);
                  },
                  [self](caf::error& err) {
                    WorkerActions out;
                    self->state.core->feeder_failed(self->system().render(err), out);
                    perform(self, out);
                  });
        } else if constexpr (std::is_same_v<A, worker_action::Report>) {
          self->send(st.setup.coordinator, std::move(a.report));
        } else if constexpr (std::is_same_v<A, worker_action::Progress>) {
          self->send(st.setup.coordinator, a.progress);
        } else if constexpr (std::is_same_v<A, worker_action::NextStep>) {
          self->send(self, step_atom::value);
        } else if constexpr (std::is_same_v<A, worker_action::Delay>) {
          self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(a.after), resume_atom::value);
        } else if constexpr (std::is_same_v<A, worker_action::Watch>) {
          self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(a.after), tick_atom::value);
        } else if constexpr (std::is_same_v<A, worker_action::Leave>) {
          for (auto& shard : st.setup.shards) self->send(shard, leave_atom::value, st.setup.id);
          self->quit();
        } else if constexpr (std::is_same_v<A, worker_action::Fail>) {
          self->send(st.setup.coordinator, failed_atom::value, static_cast<std::int32_t>(a.code), a.message);
          // Not a normal exit: whoever watches this actor (a worker
          // process's watcher reports a normal one as "finished") must not
          // read a failure as the end of the data.
          self->quit(caf::make_error(caf::sec::runtime_error, std::move(a.message)));
        }
      },
      action);
}

void perform(Self self, WorkerActions& actions) {
  for (auto& a : actions) perform_one(self, a);
}

// The core's call, performed; nothing once construction failed.
template <class F>
void with_core(Self self, F&& call) {
  if (!self->state.core) return;
  WorkerActions out;
  call(*self->state.core, out);
  perform(self, out);
}

}  // namespace

caf::behavior worker(caf::stateful_actor<WorkerState>* self, WorkerSetup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  // The collective calls this from whichever thread completed the exchange.
  st.setup.exchanged = [addr = self->address()] {
    if (auto me = caf::actor_cast<caf::actor>(addr)) caf::anon_send(me, exchanged_atom::value);
  };
  // Out of memory in a step fails the job with that said, rather than
  // leaving it to run on without this worker.
  self->set_exception_handler([self](caf::scheduled_actor*, std::exception_ptr& thrown) -> caf::error {
    const std::string who = "worker " + std::to_string(self->state.setup.id);
    const Status failed = thrown_status(thrown, who);
    self->send(self->state.setup.coordinator, failed_atom::value, static_cast<std::int32_t>(failed.code()),
               failed.message());
    return thrown_error(thrown, who);
  });
  auto core = st.setup.shards.size() == st.setup.ranges.size()
                  ? WorkerCore::make(st.setup)
                  : Result<WorkerCore>(Status::InvalidArgument("one key range per shard is needed"));
  if (!core) {
    std::string message = "worker " + std::to_string(st.setup.id) + ": " + core.status().message();
    self->send(st.setup.coordinator, failed_atom::value, static_cast<std::int32_t>(core.status().code()), message);
    self->quit(caf::make_error(caf::sec::runtime_error, std::move(message)));
    return {};
  }
  st.core.emplace(std::move(core).value());
  return {
      [self](start_atom) { with_core(self, [](WorkerCore& c, WorkerActions& out) { c.start(out); }); },
      [self](start_atom, caf::actor feeder) {
        self->state.setup.feeder = std::move(feeder);
        with_core(self, [](WorkerCore& c, WorkerActions& out) { c.start(out); });
      },
      [self](calibrate_atom, const data::Batch& probe) {
        const StepCost c = self->state.core->calibrate(probe);
        return std::vector<double>{c.fixed_s, c.per_sample_s};
      },
      [self](step_atom) { with_core(self, [](WorkerCore& c, WorkerActions& out) { c.step(out); }); },
      [self](resume_atom) { with_core(self, [](WorkerCore& c, WorkerActions& out) { c.resume(out); }); },
      [self](tick_atom) { with_core(self, [](WorkerCore& c, WorkerActions& out) { c.check_overdue(out); }); },
      [self](exchanged_atom) { with_core(self, [](WorkerCore& c, WorkerActions& out) { c.exchanged(out); }); },
  };
}

}  // namespace asgd
