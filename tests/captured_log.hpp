#pragma once
// Warnings logged while it lives (the default logger's), for tests about
// what is logged. Declare it before anything whose threads log (a
// transport, a job): they log through the logger this replaces, so they must
// be gone before it is put back.

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <cstddef>
#include <memory>
#include <string>

namespace asgd_test {

class CapturedLog {
 public:
  CapturedLog()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)), previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("captured", sink_);
    logger->set_level(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
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
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace asgd_test
