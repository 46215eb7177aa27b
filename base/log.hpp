#pragma once
// The library's logger: every log line asgd writes goes through logger(),
// never through spdlog's default logger, which belongs to the host
// (include/asgd/log.hpp redirects it).

#include <spdlog/spdlog.h>

#include <vector>

namespace asgd {

/// The library's logger: to stderr at info until told otherwise.
/// Thread-safe, like any spdlog logger.
spdlog::logger& logger();

/// Makes logger() return `host` (nullptr: its own again): how a plugin
/// loaded into a process (the CUDA backend, compute/cuda_backend.hpp), which
/// has its own copy of this file, writes where the process's lines go.
void use_host_logger(spdlog::logger* host);

/// Sends the logger's lines to `sinks` (the command line's terminal and
/// --log-file; a test's buffer) and returns those it had.
std::vector<spdlog::sink_ptr> replace_log_sinks(std::vector<spdlog::sink_ptr> sinks);

}  // namespace asgd
