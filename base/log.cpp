#include "base/log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string_view>

#include "asgd/log.hpp"

namespace asgd {

namespace {

constexpr const char* kStderrPattern = "[%Y-%m-%d %H:%M:%S.%e] [%l] %v";

// The logger writes to one dist_sink, whose sinks can be swapped while
// other threads log.
struct LibraryLogger {
  std::shared_ptr<spdlog::sinks::dist_sink_mt> sinks = std::make_shared<spdlog::sinks::dist_sink_mt>();
  spdlog::logger logger{"asgd", sinks};

  LibraryLogger() {
    sinks->add_sink(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger.set_pattern(kStderrPattern);
    logger.set_level(spdlog::level::info);
  }
};

// The process's, like stderr, and never destroyed: a job still running
// while the host's statics are destroyed (a global asgd::Runtime, exit()
// with a job in flight) logs as it stops, after any static would be gone.
LibraryLogger& library_logger() {
  static LibraryLogger* const instance = new LibraryLogger;
  return *instance;
}

LogLevel to_log_level(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace: return LogLevel::trace;
    case spdlog::level::debug: return LogLevel::debug;
    case spdlog::level::info: return LogLevel::info;
    case spdlog::level::warn: return LogLevel::warn;
    case spdlog::level::err:
    case spdlog::level::critical: return LogLevel::error;
    default: return LogLevel::off;
  }
}

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: break;
  }
  return spdlog::level::off;
}

// Hands each line to the host's function; the base sink's mutex makes the
// calls one at a time.
class CallbackSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CallbackSink(LogSink host) : sink_(std::move(host)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    try {
      sink_(to_log_level(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
    } catch (...) {
      // The host's sink failed: the line is lost, the job goes on.
    }
  }
  void flush_() override {}

 private:
  LogSink sink_;
};

}  // namespace

namespace {
std::atomic<spdlog::logger*> host_logger{nullptr};  // use_host_logger's
}  // namespace

spdlog::logger& logger() {
  if (spdlog::logger* host = host_logger.load(std::memory_order_acquire)) return *host;
  return library_logger().logger;
}

void use_host_logger(spdlog::logger* host) { host_logger.store(host, std::memory_order_release); }

std::vector<spdlog::sink_ptr> replace_log_sinks(std::vector<spdlog::sink_ptr> sinks) {
  auto& dist = *library_logger().sinks;
  std::vector<spdlog::sink_ptr> previous = dist.sinks();
  dist.set_sinks(std::move(sinks));
  return previous;
}

void set_log_sink(LogSink sink, LogLevel level) {
  const bool to_stderr = !sink;
  spdlog::sink_ptr target = sink ? spdlog::sink_ptr(std::make_shared<CallbackSink>(std::move(sink)))
                                  : std::make_shared<spdlog::sinks::stderr_sink_mt>();
  replace_log_sinks({target});
  if (to_stderr) logger().set_pattern(kStderrPattern);
  logger().set_level(to_spdlog(level));
}

}  // namespace asgd
