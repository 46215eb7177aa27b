#pragma once
// An exception that escaped an actor's handler, as the job's error: a job
// ends with a Status that says what happened, never with an actor that
// died quietly or a host that aborted.

#include <caf/all.hpp>

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "asgd/status.hpp"

namespace asgd {

/// Thrown in place of what a host's callback (JobCallbacks) threw: the job
/// stops, said as the host's doing (thrown_status: cancelled), not as a
/// fault of asgd's.
class CallbackThrew : public std::runtime_error {
 public:
  /// `callback`: "on_epoch", ...; `thrown`: what it threw.
  CallbackThrew(const std::string& callback, const std::exception_ptr& thrown);
};

/// `callback` (a JobCallbacks member, maybe empty) wrapped so that what it
/// throws comes out as CallbackThrew naming it `name`.
template <class... Args>
std::function<void(Args...)> guard_callback(const char* name, std::function<void(Args...)> callback) {
  if (!callback) return callback;
  return [name, callback = std::move(callback)](Args... args) {
    try {
      callback(std::forward<Args>(args)...);
    } catch (...) {
      throw CallbackThrew(name, std::current_exception());
    }
  };
}

/// `who` ("the coordinator", "worker 3") failed with `thrown`: unavailable
/// for memory or a thread the host would not give, internal otherwise.
Status thrown_status(const std::exception_ptr& thrown, const std::string& who);

/// An actor's exit reason for `thrown`, with thrown_status's message in it
/// (CAF's default handler keeps only "runtime_error").
caf::error thrown_error(const std::exception_ptr& thrown, const std::string& who);

/// An actor's exit reason as a sentence: the text it was made with
/// (caf::make_error(code, "...")), else CAF's rendering of it.
std::string reason_text(const caf::actor_system& system, const caf::error& reason);

}  // namespace asgd
