#include "actors/live_status.hpp"

#include <cmath>
#include <cstdio>

namespace asgd {

namespace {

nlohmann::json optional_number(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return *v;
}

// Label values: backslash, double quote and newline escaped (the
// exposition format's rule).
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Exposition {
 public:
  // One metric family: its HELP and TYPE lines once, then its samples.
  void family(const char* name, const char* type, const char* help) {
    out_.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name).append(" ");
    out_.append(type).append("\n");
  }
  void sample(const char* name, double value, const std::string& labels = {}) {
    out_ += name;
    if (!labels.empty()) out_.append("{").append(labels).append("}");
    out_.append(" ").append(number(value)).append("\n");
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string label(const char* key, const std::string& value) {
  std::string out(key);
  out.append("=\"").append(label_value(value)).append("\"");
  return out;
}
std::string label(const char* key, std::uint32_t value) { return label(key, std::to_string(value)); }

}  // namespace

void LiveStatus::remember() {
  const bool running = snap_.state == "training" || snap_.state == "finishing" || snap_.state == "done";
  if (!running || (!history_.empty() && snap_.wall_s <= history_.back().wall_s)) return;
  history_.push_back({snap_.wall_s, snap_.samples_per_s, snap_.train_loss, snap_.val_accuracy, snap_.epoch});
  if (history_.size() <= kMaxHistory) return;
  std::vector<LivePoint> thinned;
  thinned.reserve(history_.size() / 2 + 1);
  for (std::size_t i = 0; i + 1 < history_.size(); i += 2) thinned.push_back(history_[i]);
  thinned.push_back(history_.back());
  history_ = std::move(thinned);
}

nlohmann::json to_json(const std::vector<LivePoint>& history) {
  auto optional = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json points = nlohmann::json::array();
  for (const LivePoint& p : history)
    points.push_back({{"t", p.wall_s},
                      {"rate", p.samples_per_s},
                      {"loss", optional(p.train_loss)},
                      {"acc", optional(p.val_accuracy)},
                      {"epoch", p.epoch}});
  return {{"points", std::move(points)}};
}

nlohmann::json to_json(const LiveSnapshot& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : s.worker) {
    workers.push_back({{"worker", w.worker},
                       {"clock", w.clock},
                       {"epoch", w.epoch},
                       {"samples", w.samples},
                       {"updates", w.updates},
                       {"staleness", w.staleness},
                       {"wait_s", w.wait_s},
                       {"batches_ready", w.batches_ready},
                       {"alive", w.alive},
                       {"finished", w.finished},
                       {"last_seen_s", w.last_seen_s}});
  }
  nlohmann::json shards = nlohmann::json::array();
  std::uint64_t rejected = 0;
  for (const auto& sh : s.shard) {
    rejected += sh.rejected + sh.malformed_frames + sh.nonfinite;
    shards.push_back({{"shard", sh.shard},
                      {"keys", sh.keys},
                      {"updates_applied", sh.updates_applied},
                      {"rejected", sh.rejected},
                      {"refused_departed", sh.refused_departed},
                      {"malformed_frames", sh.malformed_frames},
                      {"checkpoint_failures", sh.checkpoint_failures},
                      {"checkpoint_age_s", optional_number(sh.checkpoint_age_s)},
                      {"nonfinite", sh.nonfinite},
                      {"held", sh.held},
                      {"queue", sh.queued}});
  }
  nlohmann::json j = {{"state", s.state},
                      {"policy", s.policy},
                      {"model", s.model},
                      {"dataset", s.dataset},
                      {"workers", s.workers},
                      {"shards", s.shards},
                      {"epochs", s.epochs},
                      {"wall_s", s.wall_s},
                      {"epoch", s.epoch},
                      {"progress", s.progress},
                      {"eta_s", optional_number(s.eta_s)},
                      {"samples", s.samples},
                      {"total_samples", s.total_samples},
                      {"samples_per_s", s.samples_per_s},
                      {"updates", s.updates},
                      {"train_loss", optional_number(s.train_loss)},
                      {"val_accuracy", optional_number(s.val_accuracy)},
                      {"evaluations", s.evaluations},
                      {"rejected", rejected},
                      {"worker", std::move(workers)},
                      {"shard", std::move(shards)}};
  if (!s.message.empty()) j["message"] = s.message;
  return j;
}

std::string to_prometheus(const LiveSnapshot& s) {
  Exposition e;
  e.family("asgd_job_info", "gauge", "The job's settings, as labels; always 1.");
  e.sample("asgd_job_info", 1,
           label("policy", s.policy) + "," + label("model", s.model) + "," + label("dataset", s.dataset) + "," +
               label("workers", s.workers) + "," + label("shards", s.shards) + "," + label("epochs", s.epochs));
  e.family("asgd_job_state", "gauge", "1 for the job's current state.");
  for (const char* state : {"starting", "training", "finishing", "done", "failed"})
    e.sample("asgd_job_state", s.state == state ? 1 : 0, label("state", state));

  std::uint64_t rejected = 0;
  for (const auto& sh : s.shard) rejected += sh.rejected + sh.malformed_frames + sh.nonfinite;
  e.family("asgd_samples_total", "counter", "Training samples the workers have trained on.");
  e.sample("asgd_samples_total", static_cast<double>(s.samples));
  e.family("asgd_updates_total", "counter", "Updates the workers reported (pushes; allreduce, gossip: steps).");
  e.sample("asgd_updates_total", static_cast<double>(s.updates));
  e.family("asgd_rejected_messages_total", "counter", "Pushes the shards rejected (malformed, NaN or infinite) and frames their processes dropped.");
  e.sample("asgd_rejected_messages_total", static_cast<double>(rejected));
  e.family("asgd_evaluations_total", "counter", "Validation evaluations so far.");
  e.sample("asgd_evaluations_total", static_cast<double>(s.evaluations));

  e.family("asgd_training_seconds", "gauge", "Seconds since training started.");
  e.sample("asgd_training_seconds", s.wall_s);
  e.family("asgd_epoch", "gauge", "The epoch the slowest worker is in, 1-based.");
  e.sample("asgd_epoch", s.epoch);
  e.family("asgd_progress_ratio", "gauge", "Samples trained over the job's total, 0 to 1.");
  e.sample("asgd_progress_ratio", s.progress);
  e.family("asgd_samples_per_second", "gauge", "Training throughput over the last interval.");
  e.sample("asgd_samples_per_second", s.samples_per_s);
  if (s.eta_s) {
    e.family("asgd_eta_seconds", "gauge", "Estimated training seconds left.");
    e.sample("asgd_eta_seconds", *s.eta_s);
  }
  if (s.train_loss && std::isfinite(*s.train_loss)) {
    e.family("asgd_train_loss", "gauge", "Mean training loss over the last interval.");
    e.sample("asgd_train_loss", *s.train_loss);
  }
  if (s.val_accuracy) {
    e.family("asgd_val_accuracy", "gauge", "The latest validation accuracy.");
    e.sample("asgd_val_accuracy", *s.val_accuracy);
  }

  auto per_worker = [&](const char* name, const char* type, const char* help, auto value) {
    e.family(name, type, help);
    for (const auto& w : s.worker) e.sample(name, value(w), label("worker", w.worker));
  };
  per_worker("asgd_worker_up", "gauge", "1 while the worker is alive.", [](const LiveWorker& w) { return w.alive ? 1.0 : 0.0; });
  per_worker("asgd_worker_clock", "gauge", "Steps the worker has completed.",
             [](const LiveWorker& w) { return static_cast<double>(w.clock); });
  per_worker("asgd_worker_staleness", "gauge", "The worker's clock minus the complete clock of its parameters.",
             [](const LiveWorker& w) { return w.staleness; });
  per_worker("asgd_worker_samples_total", "counter", "Samples the worker has trained on.",
             [](const LiveWorker& w) { return static_cast<double>(w.samples); });
  per_worker("asgd_worker_wait_seconds_total", "counter", "Seconds the policy held the worker's reads back.",
             [](const LiveWorker& w) { return w.wait_s; });
  per_worker("asgd_worker_batches_ready", "gauge", "Batches waiting for the worker (its prefetch queue).",
             [](const LiveWorker& w) { return static_cast<double>(w.batches_ready); });
  per_worker("asgd_worker_last_seen_seconds", "gauge", "Seconds since the worker last reported.",
             [](const LiveWorker& w) { return w.last_seen_s; });

  auto per_shard = [&](const char* name, const char* type, const char* help, auto value) {
    e.family(name, type, help);
    for (const auto& sh : s.shard) e.sample(name, value(sh), label("shard", sh.shard));
  };
  per_shard("asgd_shard_keys", "gauge", "Parameters in the shard's key range.",
            [](const LiveShard& sh) { return static_cast<double>(sh.keys); });
  per_shard("asgd_shard_updates_applied_total", "counter", "Updates the shard has applied (its load).",
            [](const LiveShard& sh) { return static_cast<double>(sh.updates_applied); });
  per_shard("asgd_shard_rejected_total", "counter", "Malformed and non-finite pushes and dropped frames at the shard.",
            [](const LiveShard& sh) { return static_cast<double>(sh.rejected + sh.malformed_frames + sh.nonfinite); });
  per_shard("asgd_shard_checkpoint_failures_total", "counter",
            "Checkpoint writes of the shard that failed; while they fail, a restart loses more.",
            [](const LiveShard& sh) { return static_cast<double>(sh.checkpoint_failures); });
  per_shard("asgd_shard_held_reads", "gauge", "Reads the policy holds back at the shard now.",
            [](const LiveShard& sh) { return static_cast<double>(sh.held); });
  per_shard("asgd_shard_queue_depth", "gauge", "Messages waiting in the shard's mailbox now.",
            [](const LiveShard& sh) { return static_cast<double>(sh.queued); });
  return e.take();
}

}  // namespace asgd
