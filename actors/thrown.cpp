#include "actors/thrown.hpp"

#include <new>
#include <system_error>

namespace asgd {

namespace {

std::string what_of(const std::exception_ptr& thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace

CallbackThrew::CallbackThrew(const std::string& callback, const std::exception_ptr& thrown)
    : std::runtime_error("the job's " + callback + " callback threw (" + what_of(thrown) + "); the job stopped") {}

Status thrown_status(const std::exception_ptr& thrown, const std::string& who) {
  try {
    std::rethrow_exception(thrown);
  } catch (const CallbackThrew& e) {
    return Status::Cancelled(e.what());
  } catch (const std::bad_alloc&) {
    return Status::Unavailable(who + " failed: out of memory (a job of fewer workers or a smaller model may fit)");
  } catch (const std::system_error& e) {
    if (e.code() == std::errc::resource_unavailable_try_again)
      return Status::Unavailable(who + " failed: a thread could not start (" + std::string(e.what()) +
                                 "); use fewer workers, or raise the process's limits on threads and address space");
    return Status::Internal(who + " failed: " + std::string(e.what()));
  } catch (const std::exception& e) {
    return Status::Internal(who + " failed: " + std::string(e.what()));
  } catch (...) {
    return Status::Internal(who + " failed: an exception of unknown type");
  }
}

caf::error thrown_error(const std::exception_ptr& thrown, const std::string& who) {
  return caf::make_error(caf::sec::runtime_error, thrown_status(thrown, who).message());
}

std::string reason_text(const caf::actor_system& system, const caf::error& reason) {
  const caf::message& context = reason.context();
  if (context.size() == 1 && context.match_element<std::string>(0)) return context.get_as<std::string>(0);
  return system.render(reason);
}

}  // namespace asgd
