#include "runtime/metrics.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "base/json_text.hpp"

namespace asgd {

nlohmann::json to_json(const WorkerPhases& p) {
  return {{"wall_s", p.wall_s},         {"data_wait_s", p.data_wait_s}, {"forward_s", p.forward_s},
          {"backward_s", p.backward_s}, {"device_s", p.device_s},       {"delay_s", p.delay_s},
          {"push_pull_s", p.push_pull_s}, {"policy_wait_s", p.policy_wait_s}, {"other_s", p.other_s}};
}

nlohmann::json to_json(const EnergyUse& e) {
  nlohmann::json j = {{"measured", e.measured}, {"reason", nullptr}, {"joules", nullptr}, {"seconds", e.seconds},
                      {"mean_power_w", nullptr}, {"edp_js", nullptr}, {"devices", nlohmann::json::object()}};
  if (!e.reason.empty()) j["reason"] = e.reason;
  if (e.measured) {
    j["joules"] = e.joules;
    j["mean_power_w"] = e.mean_power_w();
    j["edp_js"] = e.edp_js();
    for (const DeviceEnergy& d : e.devices) j["devices"][d.device] = d.joules;
  }
  return j;
}

namespace {

nlohmann::json phases_json(const std::vector<WorkerPhases>& phases) {
  nlohmann::json out = nlohmann::json::array();
  for (const WorkerPhases& p : phases) out.push_back(to_json(p));
  return out;
}

}  // namespace

nlohmann::json to_json(const EpochMetrics& m) {
  return {{"event", "epoch"},           {"epoch", m.epoch},
          {"wall_s", m.wall_s},         {"train_loss", m.train_loss},
          {"val_accuracy", m.val_accuracy}, {"samples_per_s", m.samples_per_s},
          {"updates", m.updates},       {"worker_phases", phases_json(m.worker_phases)}};
}

nlohmann::json to_json(const EvalPoint& e) {
  nlohmann::json loss = nullptr;
  if (std::isfinite(e.train_loss)) loss = e.train_loss;
  return {{"event", "eval"}, {"wall_s", e.wall_s},   {"val_accuracy", e.val_accuracy},
          {"updates", e.updates}, {"samples", e.samples}, {"train_loss", loss}};
}

nlohmann::json to_json(const JobSummary& s) {
  nlohmann::json j = {{"event", "summary"},
                      {"policy", s.policy},
                      {"staleness", nullptr},
                      {"workers", s.workers},
                      {"shards", s.shards},
                      {"device", s.device},
                      {"model", s.model},
                      {"dataset", s.dataset},
                      {"epochs", s.epochs},
                      {"wall_s", s.wall_s},
                      {"train_s", s.train_s},
                      {"samples_per_s", s.samples_per_s},
                      {"final_test_accuracy", s.final_test_accuracy},
                      {"time_to_target_s", nullptr},
                      {"updates_applied", s.updates_applied},
                      {"staleness_mean", s.staleness_mean},
                      {"staleness_p99", s.staleness_p99},
                      {"staleness_max", s.staleness_max},
                      {"staleness_histogram", s.staleness_histogram},
                      {"worker_batch", s.worker_batch},
                      {"worker_wait_s", s.worker_wait_s},
                      {"worker_phases", phases_json(s.worker_phases)},
                      {"shard_optimizer_s", s.shard_optimizer_s},
                      {"evaluation_s", s.evaluation_s},
                      {"energy", to_json(s.energy)},
                      {"malformed_frames", s.malformed_frames},
                      {"nonfinite_rejected", s.nonfinite_rejected},
                      {"workers_lost", s.workers_lost},
                      {"shard_restarts", s.shard_restarts},
                      {"workers_rejoined", s.workers_rejoined},
                      {"checkpoint_failures", s.checkpoint_failures}};
  if (s.staleness) j["staleness"] = *s.staleness;
  if (s.time_to_target_s) j["time_to_target_s"] = *s.time_to_target_s;
  return j;
}

Result<MetricsWriter> MetricsWriter::open(const std::string& path, bool append) {
  MetricsWriter w;
  w.path_ = path;
  w.out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  // A path that cannot be created is the user's to fix: a configuration error.
  if (!w.out_) return Status::InvalidArgument("--metrics-out " + path + ": cannot write it: " + std::strerror(errno));
  return w;
}

Status MetricsWriter::write(const nlohmann::json& record) {
  out_ << json_text(record) << '\n';
  out_.flush();
  if (!out_) return Status::IOError("writing metrics file " + path_ + " failed");
  return {};
}

}  // namespace asgd
