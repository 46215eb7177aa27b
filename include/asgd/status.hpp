#pragma once
// Error values used across asgd. Recoverable failures return a Status (or a
// Result<T>, which holds either a value or a non-ok Status); exceptions never
// cross a module boundary.

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace asgd {

/// What went wrong, coarse enough that callers can branch on it.
enum class StatusCode {
  ok = 0,
  invalid_argument,  ///< A configuration or flag value is wrong (exit code 2).
  not_found,         ///< A file, directory or named thing does not exist.
  corruption,        ///< Data failed validation (bad magic, truncated, CRC).
  io_error,          ///< The operating system refused a read or write.
  timeout,           ///< A wait ran past its limit.
  cancelled,         ///< The user or the runtime stopped the work.
  diverged,          ///< Training produced NaN or infinite losses and was stopped.
  internal,          ///< A bug or an unexpected failure inside asgd.
  unavailable,       ///< A resource this build or machine lacks (a GPU, the CUDA backend).
};

const char* to_string(StatusCode code);
/// The code's own name ("invalid_argument", "io_error"), for a program to
/// match on (the metrics file's "stopped" line); to_string is for people.
const char* code_name(StatusCode code);

/// An error code with a one-line, human-readable message. Cheap to copy when
/// ok; thread-compatible (no shared state).
class Status {
 public:
  Status() = default;  // ok

  /// One factory per code: `return Status::NotFound("file " + path);`.
  static Status InvalidArgument(std::string msg) { return {StatusCode::invalid_argument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::not_found, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::corruption, std::move(msg)}; }
  static Status IOError(std::string msg) { return {StatusCode::io_error, std::move(msg)}; }
  static Status Timeout(std::string msg) { return {StatusCode::timeout, std::move(msg)}; }
  static Status Cancelled(std::string msg) { return {StatusCode::cancelled, std::move(msg)}; }
  static Status Diverged(std::string msg) { return {StatusCode::diverged, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::internal, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::unavailable, std::move(msg)}; }
  /// A status of any code, such as one that crossed a message or a process
  /// as a number; `ok` (which carries no message) is taken as internal.
  static Status WithCode(StatusCode code, std::string msg) {
    return {code == StatusCode::ok ? StatusCode::internal : code, std::move(msg)};
  }

  /// The code, and the message (empty when ok).
  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "corruption: file X: ..." or "ok".
  std::string to_string() const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

/// A failure the user must fix (a bad setting or input, something named
/// that is not there): asgd exits 2 for it, and writes no "stopped" line
/// to a metrics file (the job never began). Any other failure exits 1.
inline bool is_usage_error(const Status& s) {
  return s.code() == StatusCode::invalid_argument || s.code() == StatusCode::not_found;
}

/// Either a value or a non-ok Status. Accessing value() on an error is a bug
/// (asserted in debug builds).
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}             // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {       // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status");
  }

  /// Whether it holds a value; `if (result)` asks the same.
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  /// The error, or an ok Status when it holds a value.
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  /// The value (ok() only); `->` and `*` reach it too.
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace asgd
