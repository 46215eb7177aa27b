#include "asgd/status.hpp"

namespace asgd {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid argument";
    case StatusCode::not_found: return "not found";
    case StatusCode::corruption: return "corruption";
    case StatusCode::io_error: return "I/O error";
    case StatusCode::timeout: return "timeout";
    case StatusCode::cancelled: return "cancelled";
    case StatusCode::diverged: return "training diverged";
    case StatusCode::internal: return "internal error";
    case StatusCode::unavailable: return "unavailable";
  }
  return "unknown";
}

const char* code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_found: return "not_found";
    case StatusCode::corruption: return "corruption";
    case StatusCode::io_error: return "io_error";
    case StatusCode::timeout: return "timeout";
    case StatusCode::cancelled: return "cancelled";
    case StatusCode::diverged: return "diverged";
    case StatusCode::internal: return "internal";
    case StatusCode::unavailable: return "unavailable";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(asgd::to_string(code_)) + ": " + message_;
}

}  // namespace asgd
