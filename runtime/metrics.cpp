#include "runtime/metrics.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/json_text.hpp"
#include "base/log.hpp"
#include "base/paths.hpp"
#include "runtime/config_file.hpp"

namespace asgd {

nlohmann::json to_json(const WorkerPhases& p) {
  return {{"wall_s", p.wall_s},         {"data_wait_s", p.data_wait_s}, {"forward_s", p.forward_s},
          {"backward_s", p.backward_s}, {"copy_s", p.copy_s},           {"device_s", p.device_s},
          {"delay_s", p.delay_s},
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

namespace {

// {"push-every": 4}, not 4.0: the settings that are counts read as counts.
nlohmann::json whole_numbers_as_such(const std::map<std::string, double>& options) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, v] : options)
    if (v == std::floor(v) && std::fabs(v) < 9e15) j[name] = static_cast<std::int64_t>(v);
    else j[name] = v;
  return j;
}

}  // namespace

nlohmann::json to_json(const JobSummary& s) {
  nlohmann::json j = {{"event", "summary"},
                      {"policy", s.policy},
                      {"policy_options", whole_numbers_as_such(s.policy_options)},
                      {"lr", s.lr},
                      {"momentum", nullptr},
                      {"optimizer", s.optimizer},
                      {"lr_schedule", s.lr_schedule},
                      {"weight_decay", s.weight_decay},
                      {"seed", s.seed},
                      {"compress", s.compress},
                      {"threads", nullptr},
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
                      {"stopped_at_target", s.stopped_at_target},
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
                      {"checkpoint_failures", s.checkpoint_failures},
                      {"input_mean", s.input_mean},
                      {"input_stddev", s.input_stddev}};
  if (s.staleness) j["staleness"] = *s.staleness;
  if (s.momentum) j["momentum"] = *s.momentum;
  if (s.threads) j["threads"] = *s.threads;
  if (s.time_to_target_s) j["time_to_target_s"] = *s.time_to_target_s;
  return j;
}

namespace {

// j[key] as a T; a null one as `none` (a field to_json writes as null when
// it has no value). Throws nlohmann's type_error or out_of_range.
template <class T>
T field(const nlohmann::json& j, const char* key, T none = T{}) {
  const nlohmann::json& v = j.at(key);
  return v.is_null() ? none : v.get<T>();
}

WorkerPhases phases_from_json(const nlohmann::json& j) {
  WorkerPhases p;
  p.wall_s = field<double>(j, "wall_s");
  p.data_wait_s = field<double>(j, "data_wait_s");
  p.forward_s = field<double>(j, "forward_s");
  p.backward_s = field<double>(j, "backward_s");
  p.copy_s = j.contains("copy_s") ? field<double>(j, "copy_s") : 0.0;  // written since 2026-11-26
  p.device_s = field<double>(j, "device_s");
  p.delay_s = field<double>(j, "delay_s");
  p.push_pull_s = field<double>(j, "push_pull_s");
  p.policy_wait_s = field<double>(j, "policy_wait_s");
  p.other_s = field<double>(j, "other_s");
  return p;
}

std::vector<WorkerPhases> phases_list(const nlohmann::json& j) {
  std::vector<WorkerPhases> out;
  for (const auto& p : j.at("worker_phases")) out.push_back(phases_from_json(p));
  return out;
}

template <class F>
auto reading(const char* record, F read) -> Result<decltype(read())> {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("a metrics \"") + record + "\" record: " + e.what());
  }
}

}  // namespace

Result<EpochMetrics> epoch_from_json(const nlohmann::json& j) {
  return reading("epoch", [&] {
    EpochMetrics m;
    m.epoch = field<std::uint32_t>(j, "epoch");
    m.wall_s = field<double>(j, "wall_s");
    m.train_loss = field<double>(j, "train_loss", std::nan(""));
    m.val_accuracy = field<double>(j, "val_accuracy");
    m.samples_per_s = field<double>(j, "samples_per_s");
    m.updates = field<std::uint64_t>(j, "updates");
    m.worker_phases = phases_list(j);
    return m;
  });
}

Result<EvalPoint> eval_from_json(const nlohmann::json& j) {
  return reading("eval", [&] {
    EvalPoint e;
    e.wall_s = field<double>(j, "wall_s");
    e.val_accuracy = field<double>(j, "val_accuracy");
    e.updates = field<std::uint64_t>(j, "updates");
    e.samples = field<std::uint64_t>(j, "samples");
    e.train_loss = field<double>(j, "train_loss", std::nan(""));
    return e;
  });
}

Result<JobSummary> summary_from_json(const nlohmann::json& j) {
  return reading("summary", [&] {
    JobSummary s;
    s.policy = field<std::string>(j, "policy");
    if (j.contains("policy_options")) {  // written since 2026-11-29
      s.policy_options = field<std::map<std::string, double>>(j, "policy_options");
      s.lr = field<double>(j, "lr");
      if (!j.at("momentum").is_null()) s.momentum = j.at("momentum").get<double>();
    }
    if (j.contains("seed")) {  // written since 2026-11-29 (the thirty-third session)
      s.optimizer = field<std::string>(j, "optimizer");
      s.lr_schedule = field<std::string>(j, "lr_schedule");
      s.weight_decay = field<double>(j, "weight_decay");
      s.seed = field<std::uint64_t>(j, "seed");
      s.compress = j.value("compress", std::string("none"));
      if (j.contains("threads") && !j.at("threads").is_null()) s.threads = j.at("threads").get<std::uint32_t>();
    }
    if (!j.at("staleness").is_null()) s.staleness = j.at("staleness").get<std::uint32_t>();
    s.workers = field<std::uint32_t>(j, "workers");
    s.shards = field<std::uint32_t>(j, "shards");
    s.device = field<std::string>(j, "device");
    s.model = field<std::string>(j, "model");
    s.dataset = field<std::string>(j, "dataset");
    s.epochs = field<std::uint32_t>(j, "epochs");
    s.wall_s = field<double>(j, "wall_s");
    s.train_s = field<double>(j, "train_s");
    s.samples_per_s = field<double>(j, "samples_per_s");
    s.final_test_accuracy = field<double>(j, "final_test_accuracy");
    if (!j.at("time_to_target_s").is_null()) s.time_to_target_s = j.at("time_to_target_s").get<double>();
    s.stopped_at_target = j.value("stopped_at_target", false);  // absent before --stop-at-target
    s.updates_applied = field<std::uint64_t>(j, "updates_applied");
    s.staleness_mean = field<double>(j, "staleness_mean");
    s.staleness_p99 = field<double>(j, "staleness_p99");
    s.staleness_max = field<double>(j, "staleness_max");
    s.staleness_histogram = field<std::vector<std::uint64_t>>(j, "staleness_histogram");
    s.worker_batch = field<std::vector<std::uint32_t>>(j, "worker_batch");
    s.worker_wait_s = field<std::vector<double>>(j, "worker_wait_s");
    s.worker_phases = phases_list(j);
    s.shard_optimizer_s = field<std::vector<double>>(j, "shard_optimizer_s");
    s.evaluation_s = field<double>(j, "evaluation_s");
    const nlohmann::json& e = j.at("energy");
    s.energy.measured = field<bool>(e, "measured");
    s.energy.reason = field<std::string>(e, "reason");
    s.energy.joules = field<double>(e, "joules");
    s.energy.seconds = field<double>(e, "seconds");
    for (const auto& [device, joules] : e.at("devices").items()) s.energy.devices.push_back({device, joules.get<double>()});
    s.malformed_frames = field<std::uint64_t>(j, "malformed_frames");
    s.nonfinite_rejected = field<std::uint64_t>(j, "nonfinite_rejected");
    s.workers_lost = field<std::uint32_t>(j, "workers_lost");
    s.shard_restarts = field<std::uint32_t>(j, "shard_restarts");
    s.workers_rejoined = field<std::uint32_t>(j, "workers_rejoined");
    s.checkpoint_failures = field<std::uint64_t>(j, "checkpoint_failures");
    if (j.contains("input_mean")) {  // written since 2026-11-28
      s.input_mean = j.at("input_mean").get<std::vector<float>>();
      s.input_stddev = j.at("input_stddev").get<std::vector<float>>();
    }
    return s;
  });
}

Status check_metrics_path(const std::string& metrics_out, const std::string& checkpoint_dir, const std::string& resume) {
  namespace fs = std::filesystem;
  if (metrics_out.empty()) return {};
  auto refuse = [&](const std::string& why) { return Status::InvalidArgument("--metrics-out " + metrics_out + ": " + why); };
  const fs::path path = fs::absolute(metrics_out).lexically_normal();
  std::error_code ec;
  const std::string& folder = checkpoint_dir.empty() ? resume : checkpoint_dir;
  if (!folder.empty() && is_checkpoint_folder_file(path.filename().string()) &&
      fs::weakly_canonical(path.parent_path(), ec) == fs::weakly_canonical(fs::absolute(folder), ec))
    return refuse("is a file of the job's checkpoint folder " + folder + " (the job writes it, or --resume reads it); "
                  "give another file");
  return {};
}

namespace {

// STDOUT_FILENO or STDERR_FILENO where `st` is the file it writes to; -1.
int our_output(const struct stat& st) {
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat out{};
    if (::fstat(fd, &out) == 0 && out.st_dev == st.st_dev && out.st_ino == st.st_ino) return fd;
  }
  return -1;
}

// write(2) to a pipe whose reader has gone raises SIGPIPE, which ended the
// whole job (exit 141, no summary, no model): here it is held back for the
// write and taken if it came, so the write fails with EPIPE instead, and
// the job goes on without the file as after any failed write.
ssize_t write_without_sigpipe(int fd, const char* data, std::size_t size) {
  sigset_t pipe_only, before;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_only, &before);
  const ssize_t n = ::write(fd, data, size);
  const int saved = errno;
  if (n < 0 && saved == EPIPE && !was_pending) {
    const timespec now{0, 0};
    while (sigtimedwait(&pipe_only, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  errno = saved;
  return n;
}

}  // namespace

Result<MetricsWriter> MetricsWriter::open(const std::string& path, bool append) {
  // A path that cannot be created is the user's to fix: a configuration error.
  auto refuse = [&](const std::string& why) { return Status::InvalidArgument("--metrics-out " + path + ": " + why); };
  if (Status s = writable_file(path); !s.ok()) return refuse(s.message());
  MetricsWriter w;
  w.path_ = path;
  // Not blocking at open: a named pipe no one reads held the job there, deaf
  // to Ctrl-C (the open is restarted after the signal). Its writes block
  // again once open: a reader that falls behind slows the lines, as a disk.
  w.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (w.fd_ < 0 && errno == ENXIO) return refuse("a named pipe that no process is reading");
  if (w.fd_ < 0) return refuse(std::string("cannot write it: ") + std::strerror(errno));
  if (const int flags = ::fcntl(w.fd_, F_GETFL); flags < 0 || ::fcntl(w.fd_, F_SETFL, flags & ~O_NONBLOCK) != 0)
    return refuse(std::string("cannot write it: ") + std::strerror(errno));
  struct stat st{};
  if (::fstat(w.fd_, &st) != 0) return refuse(std::string("cannot look at it: ") + std::strerror(errno));
  w.file_ = S_ISREG(st.st_mode);
  // Locked before it is emptied: a second job must not cut the first's
  // lines. Not /dev/null, a terminal or a pipe, which any job may share.
  if (w.file_ && ::flock(w.fd_, LOCK_EX | LOCK_NB) != 0)
    return refuse(errno == EWOULDBLOCK ? "another job is writing it (in this process or another); give each job a "
                                         "metrics file of its own"
                                       : std::string("cannot lock it: ") + std::strerror(errno));
  // Only a file is emptied: /dev/null or /dev/stdout takes the lines as they
  // come (emptying one failed at the first line, after the job had trained),
  // and so does the file this process's output goes to (/dev/stdout
  // redirected to it: emptying it cut the lines printed before).
  const int output = w.file_ ? our_output(st) : -1;
  w.empty_first_ = !append && w.file_ && output < 0;
  if (output >= 0) {
    // Written through that descriptor, at its offset, after what the process
    // printed: a descriptor of our own wrote over the printed lines.
    const int shared = ::fcntl(output, F_DUPFD_CLOEXEC, 0);
    if (shared < 0) return refuse(std::string("cannot write it: ") + std::strerror(errno));
    ::close(w.fd_);
    w.fd_ = shared;
    w.flush_first_ = output == STDOUT_FILENO ? stdout : stderr;
  }
  return w;
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      empty_first_(other.empty_first_),
      file_(other.file_),
      flush_first_(other.flush_first_) {}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);  // and the lock with it
}

Status MetricsWriter::write(const nlohmann::json& record) {
  auto failed = [&](const char* what) {
    return Status::IOError("writing metrics file " + path_ + " failed: " + what + std::strerror(errno));
  };
  if (empty_first_) {
    if (::ftruncate(fd_, 0) != 0) return failed("cannot empty it: ");
    empty_first_ = false;
  }
  if (flush_first_) std::fflush(flush_first_);
  const off_t start = flush_first_ ? ::lseek(fd_, 0, SEEK_CUR) : ::lseek(fd_, 0, SEEK_END);
  const std::string line = json_text(record) + '\n';
  std::size_t done = 0;
  while (done < line.size()) {  // O_APPEND (or stdout's offset): each write lands at the end
    const ssize_t n = file_ ? ::write(fd_, line.data() + done, line.size() - done)
                            : write_without_sigpipe(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const Status why = failed("");
      if (done > 0 && start >= 0) {  // no torn line
        [[maybe_unused]] const int cut = ::ftruncate(fd_, start);
      }
      return why;
    }
    done += static_cast<std::size_t>(n);
  }
  return {};
}

Status MetricsSink::open(const std::string& path, bool append) {
  if (path.empty()) return {};
  auto w = MetricsWriter::open(path, append);
  if (!w) return w.status();
  writer.emplace(std::move(w).value());
  return {};
}

void MetricsSink::write(const nlohmann::json& record) {
  if (!writer || !error.ok()) return;
  error = writer->write(record);
  if (!error.ok())
    logger().error("{}: the job goes on without writing more lines there, and ends with this error", error.message());
}

void MetricsSink::stopped(const Status& why, double wall_s) {
  write({{"event", "stopped"}, {"status", code_name(why.code())}, {"message", why.message()}, {"wall_s", wall_s}});
}

}  // namespace asgd
