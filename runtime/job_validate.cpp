// Checking a job's settings before anything starts: validate(),
// validate_settings() and the device check, one place for the library,
// the CLI and the cluster's processes.

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "actors/job_plan.hpp"
#include "asgd/job.hpp"
#include "base/paths.hpp"
#include "compute/device.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/schedule.hpp"
#include "dataset/augment.hpp"
#include "dataset/cifar.hpp"
#include "dataset/dataset.hpp"
#include "policies/registry.hpp"
#include "runtime/config_file.hpp"
#include "runtime/job_internal.hpp"
#include "runtime/metrics.hpp"
#include "runtime/status_server.hpp"

namespace asgd {

namespace {

template <class T>
bool contains(const std::vector<std::string>& names, const T& x) {
  return std::find(names.begin(), names.end(), x) != names.end();
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// "--flag value: why", a usage error.
Status bad_flag(const std::string& flag, const std::string& value, const std::string& why) {
  return Status::InvalidArgument("--" + flag + " " + value + ": " + why);
}

// The bounds of the waits and of --threads (validate_config's part).
Status validate_limits(const JobConfig& c) {
  const auto& bad = bad_flag;
  if (!(c.eval_every_s >= 0.0 && c.eval_every_s <= kMaxWaitS))
    return bad("eval-every", fmt::format("{:g}", c.eval_every_s), "must be a number of seconds from 0 to a week (604800)");
  if (!(c.rpc_timeout_s > 0.0 && c.rpc_timeout_s <= kMaxWaitS))
    return bad("rpc-timeout", fmt::format("{:g}", c.rpc_timeout_s), "must be more than 0 s and at most a week (604800)");
  // Heartbeats go every second: a shorter timeout declares healthy processes dead.
  if (!(c.heartbeat_timeout_s >= 2.0 && c.heartbeat_timeout_s <= kMaxWaitS))
    return bad("heartbeat-timeout", fmt::format("{:g}", c.heartbeat_timeout_s),
               "must be at least 2 s (heartbeats go every second) and at most a week (604800)");
  if (c.threads > kMaxThreads)
    return bad("threads", std::to_string(c.threads),
               "must be at most " + std::to_string(kMaxThreads) + " (compute threads per worker; 0: the usable CPUs' share)");
  if (!(c.checkpoint_every_s >= 0.0 && c.checkpoint_every_s <= kMaxWaitS))
    return bad("checkpoint-every", fmt::format("{:g}", c.checkpoint_every_s), "must be 0 (off) or a number of seconds up to a week (604800)");
  return {};
}

// The named datasets' samples (channels, rows, columns) and classes,
// which their files give when loaded (dataset/idx.cpp, dataset/cifar.cpp).
constexpr std::size_t kDatasetClasses = 10;
std::optional<std::vector<std::size_t>> dataset_sample_shape(const std::string& dataset) {
  if (dataset == "mnist" || dataset == "fashion-mnist") return std::vector<std::size_t>{1, 28, 28};
  if (dataset == "cifar10") return std::vector<std::size_t>{data::kCifarChannels, data::kCifarSide, data::kCifarSide};
  return std::nullopt;
}

// The optimizer's settings: the rate and its schedule, the optimizer and
// its coefficients.
Status validate_training(const JobConfig& c) {
  const auto& bad = bad_flag;
  if (c.lr && !(*c.lr >= 1e-30 && *c.lr <= 1e6))  // (computed in float: 1e39 is inf there, 1e-50 zero)
    return bad("lr", fmt::format("{:g}", *c.lr), "must be a positive number from 1e-30 to 1e6");
  if (c.lr_warmup_epochs && (!(*c.lr_warmup_epochs >= 0.0) || !std::isfinite(*c.lr_warmup_epochs)))
    return bad("lr-warmup", fmt::format("{:g}", *c.lr_warmup_epochs), "must be a number of epochs >= 0");
  if (LrSchedule::Kind kind; !LrSchedule::parse(c.lr_schedule, kind))
    return bad("lr-schedule", c.lr_schedule, "unknown schedule (known: constant, cosine, step)");
  if (!contains(known_optimizers(), c.optimizer))
    return bad("optimizer", c.optimizer, "unknown optimizer (known: " + join(known_optimizers()) + ")");
  if (!(c.weight_decay >= 0.0 && c.weight_decay <= 1e6))
    return bad("weight-decay", fmt::format("{:g}", c.weight_decay), "must be a number from 0 to 1e6");
  if (c.momentum && !(*c.momentum >= 0.0 && *c.momentum < 1.0))
    return bad("momentum", fmt::format("{:g}", *c.momentum), "must be in [0, 1)");
  // Ignored by the others, while it still turned the staleness-aware steps
  // and the smaller batches off.
  if (c.momentum && c.optimizer != "momentum")
    return bad("momentum", fmt::format("{:g}", *c.momentum),
               "applies to --optimizer momentum only, not to " + c.optimizer);
  return {};
}

// validate(), with the dataset-name check only for jobs that load one, and
// the device checked on this machine only when the workers run here.
Status validate_config(const JobConfig& c, bool named_dataset, bool devices_here = true) {
  const auto& bad = bad_flag;
  if (named_dataset && !data::is_known_dataset(c.dataset))
    return bad("dataset", c.dataset, "unknown dataset (known: " + join(data::known_datasets()) + ")");
  if (c.model_spec) {
    if (c.model_spec->layers().empty()) return bad("model", c.model_spec->name(), "the model spec has no layers");
    // On a named dataset the spec must fit its images and classes now, not
    // once the job has started (Runtime::submit took one that did not).
    if (const auto shape = named_dataset ? dataset_sample_shape(c.dataset) : std::nullopt)
      if (auto n = validate(*c.model_spec, *shape, kDatasetClasses); !n)
        return Status::InvalidArgument("model spec '" + c.model_spec->name() + "' on " + c.dataset + ": " +
                                       n.status().message());
  } else if (!contains(known_models(), c.model)) return bad("model", c.model, "unknown model (known: " + join(known_models()) + ")");
  auto policy = make_policy(policy_config(c));
  if (!policy) return bad("policy", c.policy, policy.status().message());
  if (c.workers < 1 || c.workers > kMaxWorkers)
    return bad("workers", std::to_string(c.workers), "must be 1 to " + std::to_string(kMaxWorkers));
  if (auto b = c.policy_options.find("backup-workers"); b != c.policy_options.end() && b->second >= c.workers)
    return bad("backup-workers", fmt::format("{:g}", b->second),
               "must be less than --workers " + std::to_string(c.workers) + " (at least one gradient per clock)");
  if (c.worker_weights != "auto") {
    if (auto w = parse_worker_weights(c.worker_weights, c.workers); !w) return w.status();
  }
  if (auto f = parse_stragglers(c.straggler, c.workers, c.seed); !f) return f.status();
  if (auto a = data::parse_augment(c.augment, c.dataset); !a) return a.status();
  if (c.shards < 1 || c.shards > kMaxShards)
    return bad("shards", std::to_string(c.shards), "must be 1 to " + std::to_string(kMaxShards));
  auto devices = parse_worker_devices(c.device, c.workers);
  if (!devices) return devices.status();
  if (devices_here)
    for (std::uint32_t w = 0; w < c.workers; ++w)
      if (Status s = device_usable_here((*devices)[w]); !s.ok())
        return c.device.find(',') == std::string::npos
                   ? s
                   : Status::InvalidArgument("--device " + c.device + ": worker " + std::to_string(w) + "'s " +
                                             s.message().substr(std::string("--device ").size()));
  // Either value: `false` given to bsp was taken without a word.
  if (c.staleness_aware_lr && !takes_staleness_aware_lr(c.policy))
    return bad("staleness-aware-lr", *c.staleness_aware_lr ? "true" : "false",
               "applies to --policy async and ssp only, not to " + (*policy)->name());
  if (c.epochs < 1) return bad("epochs", std::to_string(c.epochs), "must be >= 1");
  if (c.batch && *c.batch < 1) return bad("batch", std::to_string(*c.batch), "must be >= 1");
  if (Status s = validate_training(c); !s.ok()) return s;
  if (c.target_accuracy && !(*c.target_accuracy > 0.0 && *c.target_accuracy <= 1.0))
    return bad("target-accuracy", fmt::format("{:g}", *c.target_accuracy), "must be in (0, 1]");
  if (c.stop_at_target && !c.target_accuracy)
    return bad("stop-at-target", "true", "needs --target-accuracy (the accuracy to stop at)");
  // User data brings its own validation split.
  if (named_dataset && c.validation_size < 1) return bad("validation-size", "0", "must be >= 1");
  if (c.prefetch < 1) return bad("prefetch", "0", "must be >= 1");
  // job.toml and a cluster's settings carry it as a TOML integer.
  if (c.seed > kLargestSettingInteger)
    return bad("seed", std::to_string(c.seed), "must be at most " + std::to_string(kLargestSettingInteger));
  // A feeder ahead by the whole job held every epoch's batches (1.7 GB
  // for 10 MNIST epochs) and made the steps staler, for no speed.
  if (c.prefetch > kMaxPrefetch)
    return bad("prefetch", std::to_string(c.prefetch),
               "must be at most " + std::to_string(kMaxPrefetch) + " (batches a feeder keeps ready; more only hold memory)");
  if (c.compress != "none" && c.compress != "fp16") return bad("compress", c.compress, "expected none or fp16");
  if (c.status_port != 0 && !StatusServer::is_address(c.status_address))
    return bad("status-address", c.status_address, "not an IP address (such as 127.0.0.1, 0.0.0.0 or ::1)");
  if (Status s = validate_limits(c); !s.ok()) return s;
  if (Status s = check_metrics_path(c.metrics_out, c.checkpoint_dir, c.resume); !s.ok()) return s;
  if (!c.resume.empty()) {
    const PathLook resume = look_at(c.resume);
    if (resume.kind == PathKind::unreadable) return bad("resume", c.resume, "cannot be read: " + resume.error);
    if (resume.kind != PathKind::folder) return bad("resume", c.resume, "is not a folder of checkpoints");
  }
  return {};
}

}  // namespace

Status validate(const JobConfig& c) { return validate_config(c, true); }

Status validate_settings(const JobConfig& c, bool devices_here) { return validate_config(c, true, devices_here); }

Status device_usable_here(const std::string& text) {
  auto device = Device::parse(text);
  if (!device) return device.status();
  if (device->kind != Device::Kind::cuda) return {};
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) return Status::InvalidArgument("--device " + text + ": no usable CUDA device: " + why);
  if (device->index >= count)
    return Status::InvalidArgument("--device " + text + ": this machine has " + std::to_string(count) +
                                   " CUDA device(s)");
  return {};
}

// What the job's plan would refuse of these data (samples of `shape`),
// said before it starts: more workers than samples, a worker's share
// smaller than its batch.
Status plannable(const JobConfig& c, const UserDataset& data, const Shape& shape, std::size_t params) {
  auto plan = plan_job(c, {params, data.train.count(), data.classes, shape, Placement::one_process, 1});
  return plan ? Status{} : plan.status();
}

Status validate(const JobConfig& c, const UserDataset& data) {
  if (Status s = validate_config(c, false); !s.ok()) return s;
  if (Status s = validate(data); !s.ok()) return s;
  // Vectors (N) reach a model as (1, 1, N).
  const Shape shape = data.sample_shape.size() == 1 ? Shape{1, 1, data.sample_shape[0]} : Shape(data.sample_shape);
  // Before the model: under a ModelSpec, crop on vectors was taken, and
  // blanked two samples in three (the one row shifted out). The default
  // for a job's own data is none, whatever config.dataset says.
  if (auto a = data::parse_augment(c.augment.empty() ? "none" : c.augment, ""); a && a->any()) {
    if (data.sample_shape.size() != 3)
      return Status::InvalidArgument("--augment " + data::to_string(*a) +
                                     " shifts and mirrors images; this job's own samples are vectors (" +
                                     std::to_string(data.sample_shape.at(0)) + " values): use --augment none");
    if (a->crop && std::min(shape[1], shape[2]) < 8)
      return Status::InvalidArgument("--augment crop shifts an image by up to an eighth of its side, at least a "
                                     "pixel; this job's own images are " + std::to_string(shape[1]) + "x" +
                                     std::to_string(shape[2]) + ", under 8 on a side: use --augment flip or none");
  }
  if (c.model_spec) {
    auto n = validate(*c.model_spec, data.sample_shape, data.classes);
    if (!n) return n.status();
    return plannable(c, data, shape, *n);
  }
  // A named model on these samples: built once here, unfilled, so that one
  // that does not fit is refused before anything starts.
  auto m = Model::build(c.model, nullptr, shape, data.classes);
  if (!m) return m.status();
  return plannable(c, data, shape, m->num_params());
}

}  // namespace asgd
