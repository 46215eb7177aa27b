#pragma once
// Where asgd's log lines go. By default they go to stderr (never stdout) at
// level info and above, one line each with a time stamp and the level;
// a host sends them to its own logger with set_log_sink.

#include <functional>
#include <string_view>

namespace asgd {

/// The levels, least severe first: a sink gets the lines at or above the
/// level given to set_log_sink; off silences asgd.
enum class LogLevel { trace, debug, info, warn, error, off };

/// One log line: its level and its text (no time stamp, no newline).
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

/// Sends asgd's log lines at `level` and above to `sink`; a null `sink`
/// sends them to stderr again, and LogLevel::off silences them.
///
/// Process-wide, like stderr itself: every Runtime and run_job in the
/// process logs through it, from the threads of its jobs. Thread-safe:
/// it may be called while jobs run (lines already under way go to the old
/// sink). `sink` is called one line at a time, never concurrently, so it
/// needs no lock of its own; it must not call set_log_sink, and it should
/// be quick (the job's thread waits for it). An exception it throws is
/// dropped, never passed to the job.
void set_log_sink(LogSink sink, LogLevel level = LogLevel::info);

}  // namespace asgd
