#pragma once
// Internal to the cluster roles: runtime/cluster.cpp (the shard and worker
// processes) and runtime/cluster_coordinator.cpp (the coordinator process).

#include <caf/all.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "actors/job_plan.hpp"
#include "actors/step_cost.hpp"
#include "asgd/job.hpp"
#include "dataset/dataset.hpp"
#include "messaging/bridge.hpp"
#include "messaging/collective.hpp"

namespace asgd::cluster_detail {

using SteadyClock = std::chrono::steady_clock;
using alive_atom = caf::atom_constant<caf::atom("alive")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

inline constexpr auto kHeartbeatEvery = std::chrono::seconds(1);
using messaging::kJobDone;
// A process that registers for a shard's slot during the job takes it only
// once the process there has missed this many seconds of heartbeats.
inline constexpr auto kPresumedDead = std::chrono::milliseconds(2500);

// Connections the coordinator's or a shard's endpoint accepts at once
// (docs/cluster.md, "Queues and their bounds"): each of the job's `peers`
// twice (a restarted process may connect before its old connection is seen
// gone), and a few more.
std::size_t max_connections(std::size_t peers);

// Logs, when a process ends, what its endpoint refused (each refusal was
// logged when it happened, a few lines a minute at most).
void log_refused(const std::string& name, const messaging::BridgeStats& st);

std::chrono::milliseconds millis(double seconds);

// This host's name, as a process registers with it ("?" when it has none).
std::string host_name();

// A worker process's start (runtime/cluster_worker_parts.cpp): its device
// (its item of --device, checked on this host), where its collective
// listens, joining the collective, whether its assignment fits its data,
// and the line that says its share.
Result<std::string> device_of_worker(const JobConfig& cfg, std::uint32_t index);
std::string collective_listen(const std::string& listen);
Status connect_collective(messaging::NetworkCollective& collective, const messaging::Assignment& a,
                          const std::string& name, const JobConfig& cfg, Exchange exchange);
Status assignment_fits(const messaging::Assignment& a, std::size_t train_count, std::uint32_t epochs);
void log_share(const std::string& name, const messaging::Assignment& a, std::size_t shards);
// As a worker process ends: what its collective dropped, if anything.
void log_collective_drops(const std::string& name, const messaging::NetworkCollective& collective);

// Why the coordinator of run `ours` refuses `reg`, a process of another
// run (both named by their launcher: two runs that were given one port,
// the other's coordinator unable to listen); nothing when it may join.
inline std::optional<std::string> another_run(const std::string& ours, const messaging::Registration& reg) {
  if (ours.empty() || reg.run.empty() || ours == reg.run) return std::nullopt;
  return "this coordinator serves the run " + ours + ", not " + reg.run +
         ": two runs were given one port (give each its own --port)";
}

// A shard process's memory (runtime/shard_allocator.cpp): one heap, its
// push buffers kept for reuse, not trimmed. Process-wide; called before
// ZeroMQ's threads start.
void configure_shard_allocator();
// Makes room at once for `buffers` pushes of `push_bytes` each (up to a
// bound), so that resident memory does not climb in steps under load.
void reserve_push_buffers(std::size_t push_bytes, std::size_t buffers);

messaging::TensorCoding coding_of(const JobConfig& c);
/// --worker-weights auto: this worker's step on `device`, measured (a
/// failed or out-of-memory device is an error, not an abort).
Result<StepCost> measure_step_cost(const JobPlan& plan, const data::DatasetSplits& data, const std::string& device,
                                   std::uint32_t index);
/// Why --compress fp16 sends nothing as half floats under the job's policy
/// (gossip; averaging, whose pushes the shards keep); none where it does.
std::optional<std::string> compress_changes_nothing(const JobConfig& c);

/// A thread-safe queue the bridge's handler fills and a main thread drains.
template <class T>
class Inbox {
 public:
  void push(T x) {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(x));
    }
    cv_.notify_one();
  }
  std::optional<T> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
    T x = std::move(items_.front());
    items_.pop_front();
    return x;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;
};

}  // namespace asgd::cluster_detail
