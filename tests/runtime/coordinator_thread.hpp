#pragma once
// A coordinator process's run on a thread of the test, for the tests whose
// roles each run as they do in a process of their own: where it listens,
// once it does, and its outcome, once it has ended.

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>

#include "runtime/cluster.hpp"

namespace asgd {

/// The coordinator process's options for a job of `config`'s shards and
/// workers, waiting at most `join_timeout_s` for them.
inline ProcessOptions coordinator_options(const JobConfig& config, double join_timeout_s) {
  ProcessOptions o;
  o.shards = config.shards;
  o.workers = config.workers;
  o.join_timeout_s = join_timeout_s;
  return o;
}

class CoordinatorThread {
 public:
  /// Runs run_coordinator_process(config, options, callbacks); `then`, if
  /// given, runs on its thread once it has returned.
  CoordinatorThread(JobConfig config, ProcessOptions options, JobCallbacks callbacks = {},
                    std::function<void()> then = {})
      : thread_([this, config = std::move(config), options = std::move(options), callbacks = std::move(callbacks),
                 then = std::move(then)] {
          outcome = run_coordinator_process(config, options, callbacks, {},
                                            [this](const std::string& e) { listening_.set_value(e); });
          if (then) then();
        }) {}
  CoordinatorThread(const CoordinatorThread&) = delete;
  CoordinatorThread& operator=(const CoordinatorThread&) = delete;
  ~CoordinatorThread() {
    if (thread_.joinable()) thread_.join();
  }

  /// Its endpoint; empty when it did not listen within `timeout`. Once.
  std::string endpoint(std::chrono::seconds timeout = std::chrono::seconds(10)) {
    return endpoint_.wait_for(timeout) == std::future_status::ready ? endpoint_.get() : std::string();
  }
  /// Waits for the run to end; `outcome` holds what it returned.
  void join() { thread_.join(); }

  std::optional<Result<JobSummary>> outcome;

 private:
  std::promise<std::string> listening_;
  std::future<std::string> endpoint_ = listening_.get_future();
  std::thread thread_;  // last: it uses the members above
};

}  // namespace asgd
