// Running chosen actors on the posting thread (messaging/inline_unit.hpp).
#include "messaging/inline_unit.hpp"

#include <algorithm>
#include <cassert>

namespace asgd::messaging {

InlineUnit::InlineUnit(caf::actor_system& system, std::vector<caf::actor> actors)
    : caf::execution_unit(&system), actors_(std::move(actors)) {}

InlineUnit::~InlineUnit() { assert(queued_.empty()); }

void InlineUnit::post(const caf::actor& to, caf::mailbox_element_ptr message) {
  if (!to) return;
  to->enqueue(std::move(message), this);
  run_queued();
}

void InlineUnit::exec_later(caf::resumable* job) {
  // The job comes with a reference (CAF added it for the scheduler).
  const auto* actor = dynamic_cast<caf::abstract_actor*>(job);
  const bool ours = actor != nullptr && std::any_of(actors_.begin(), actors_.end(), [&](const caf::actor& a) {
                      return caf::actor_cast<caf::abstract_actor*>(a) == actor;
                    });
  if (ours) {
    queued_.push_back(job);
  } else {
    system().scheduler().enqueue(job);
  }
}

void InlineUnit::run_queued() {
  if (running_) return;  // an actor run below woke another: the loop takes it
  running_ = true;
  while (!queued_.empty()) {
    caf::resumable* job = queued_.front();
    queued_.erase(queued_.begin());
    switch (job->resume(this, kThroughput)) {
      case caf::resumable::resume_later:
        system().scheduler().enqueue(job);  // with its reference
        break;
      case caf::resumable::awaiting_message:
      case caf::resumable::done:
      case caf::resumable::shutdown_execution_unit:
        caf::intrusive_ptr_release(job);
        break;
    }
  }
  running_ = false;
}

}  // namespace asgd::messaging
