#pragma once
// An exception that escaped an actor's handler, as the job's error: a job
// ends with a Status that says what happened, never with an actor that
// died quietly or a host that aborted.

#include <caf/all.hpp>

#include <exception>
#include <string>

#include "asgd/status.hpp"

namespace asgd {

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
