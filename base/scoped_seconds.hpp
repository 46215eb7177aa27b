#pragma once
// ScopedSeconds: adds the seconds its scope took to a counter, however the
// scope is left (a return from a switch, an exception).

#include <chrono>

namespace asgd {

class ScopedSeconds {
 public:
  explicit ScopedSeconds(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~ScopedSeconds() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace asgd
