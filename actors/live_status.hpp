#pragma once
// A running job's state as seen from outside: the coordinator writes it
// about twice a second, the status server (runtime/status_server.hpp) reads
// it for /status (JSON) and /metrics (Prometheus text). Everything here is
// a copy: readers never touch the coordinator's own state.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace asgd {

struct LiveWorker {
  std::uint32_t worker = 0;
  std::uint64_t clock = 0;          ///< steps completed
  std::uint64_t epoch = 1;          ///< 1-based, the epoch it is training
  std::uint64_t samples = 0;        ///< trained on so far
  std::uint64_t updates = 0;        ///< its pushes the shards applied
  double staleness = 0.0;           ///< its clock minus its parameters' complete clock, last report
  double wait_s = 0.0;              ///< seconds the policy held its reads back, so far
  std::uint32_t batches_ready = 0;  ///< batches waiting for it
  bool alive = true;                ///< false once it stopped abnormally or went silent
  bool finished = false;            ///< it trained its share to the end
  double last_seen_s = 0.0;         ///< seconds since its last report
};

struct LiveShard {
  std::uint32_t shard = 0;
  std::uint64_t keys = 0;           ///< parameters in its key range
  std::uint64_t updates_applied = 0;
  std::uint64_t rejected = 0;       ///< malformed pushes
  std::uint64_t malformed_frames = 0;  ///< frames its process dropped unread
  std::uint64_t nonfinite = 0;      ///< pushes refused for a NaN or infinity
  std::uint64_t held = 0;           ///< reads the policy holds back now
  std::uint64_t queued = 0;         ///< messages in its mailbox now
  std::uint64_t refused_departed = 0;  ///< pushes of workers it was told had left
  std::uint64_t checkpoint_failures = 0;  ///< checkpoint writes that failed
  std::optional<double> checkpoint_age_s = std::nullopt;  ///< since its newest checkpoint was written; none: none yet (or none asked for)
};

struct LiveSnapshot {
  std::string state = "starting";   ///< starting | training | finishing | done | failed
  std::string policy;
  std::string model;
  std::string dataset;
  std::uint32_t workers = 0;
  std::uint32_t shards = 0;
  std::uint32_t epochs = 0;
  double wall_s = 0.0;              ///< seconds since training started
  std::uint32_t epoch = 1;          ///< the slowest worker's, 1-based
  double progress = 0.0;            ///< samples / total_samples, 0..1
  std::optional<double> eta_s;
  std::uint64_t samples = 0;
  std::uint64_t total_samples = 0;
  double samples_per_s = 0.0;       ///< over the last interval
  std::uint64_t updates = 0;
  std::optional<double> train_loss; ///< over the last interval
  std::optional<double> val_accuracy;  ///< the latest evaluation
  std::uint64_t evaluations = 0;
  std::vector<LiveWorker> worker;
  std::vector<LiveShard> shard;
  std::string message;              ///< why it failed, when it did
};

/// One moment of the run, as the live page's charts draw it.
struct LivePoint {
  double wall_s = 0.0;
  double samples_per_s = 0.0;
  std::optional<double> train_loss;
  std::optional<double> val_accuracy;
  std::uint32_t epoch = 1;
};

/// The /status document (docs/user-guide.md, "Watching a job").
nlohmann::json to_json(const LiveSnapshot& s);
/// The /history document: {"points": [{"t", "rate", "loss", "acc", "epoch"}, ...]}.
nlohmann::json to_json(const std::vector<LivePoint>& history);
/// The /metrics document: Prometheus text exposition format 0.0.4.
std::string to_prometheus(const LiveSnapshot& s);

/// One snapshot behind a mutex, and the run's history: a point each time
/// an update moves the training clock on, so that a page opened mid-run
/// draws the whole run. Thread-safe.
class LiveStatus {
 public:
  /// Points kept at most: when full, every other one is dropped (the
  /// newest stays), so a long run keeps its whole span at half the detail.
  static constexpr std::size_t kMaxHistory = 4096;

  LiveSnapshot get() const {
    std::lock_guard lock(mu_);
    return snap_;
  }
  std::vector<LivePoint> history() const {
    std::lock_guard lock(mu_);
    return history_;
  }
  template <class F>
  void update(F&& f) {
    std::lock_guard lock(mu_);
    f(snap_);
    remember();
  }

 private:
  void remember();  // under mu_

  mutable std::mutex mu_;
  LiveSnapshot snap_;
  std::vector<LivePoint> history_;
};

}  // namespace asgd
