#pragma once
// Warnings asgd logs while it lives (base/log.hpp's logger), for tests about
// what is logged. Declare it before anything whose threads log (a
// transport, a job): they log through the sinks this replaces, so they must
// be gone before those are put back.

#include <spdlog/sinks/ringbuffer_sink.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "base/log.hpp"

namespace asgd_test {

class CapturedLog {
 public:
  CapturedLog()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)),
        previous_(asgd::replace_log_sinks({sink_})),
        previous_level_(asgd::logger().level()) {
    asgd::logger().set_level(spdlog::level::warn);
  }
  ~CapturedLog() {
    asgd::replace_log_sinks(std::move(previous_));
    asgd::logger().set_level(previous_level_);
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  /// Lines that contain `needle`.
  std::size_t count(const std::string& needle) const {
    std::size_t n = 0;
    for (const auto& line : sink_->last_formatted())
      if (line.find(needle) != std::string::npos) ++n;
    return n;
  }
  std::string all() const {
    std::string out;
    for (const auto& line : sink_->last_formatted()) out += line;
    return out;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::vector<spdlog::sink_ptr> previous_;
  spdlog::level::level_enum previous_level_;
};

}  // namespace asgd_test
