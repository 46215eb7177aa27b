// The parts of a process's start that need neither its connection nor its
// actors (runtime/cluster.cpp and cluster_coordinator.cpp run them): a
// worker's device, collective and step cost; how tensors are coded.
#include <spdlog/fmt/fmt.h>

#include "actors/job_plan.hpp"
#include "actors/thrown.hpp"
#include "actors/worker.hpp"
#include "actors/worker_core.hpp"
#include "base/log.hpp"
#include "messaging/collective.hpp"
#include "runtime/cluster_internal.hpp"
#include "runtime/job_internal.hpp"

namespace asgd::cluster_detail {

using messaging::Assignment;
using messaging::NetworkCollective;

// Worker `index`'s device (its item of a --device list), checked here,
// where it computes (not on the coordinator's host).
Result<std::string> device_of_worker(const JobConfig& cfg, std::uint32_t index) {
  auto devices = parse_worker_devices(cfg.device, cfg.workers);
  if (!devices) return devices.status();
  if (index >= devices->size()) return Status::Internal("assigned a worker index past the job's workers");
  if (Status s = device_usable_here((*devices)[index]); !s.ok())
    return Status::InvalidArgument(s.message() + " (on " + host_name() + ")");
  return (*devices)[index];
}

// Where a worker's collective listens: the host of --listen, on a port the
// system picks.
std::string collective_listen(const std::string& listen) {
  if (listen.rfind("tcp://", 0) != 0) return "tcp://127.0.0.1:*";
  const auto colon = listen.rfind(':');
  return (colon < 6 ? listen : listen.substr(0, colon)) + ":*";
}

// allreduce, gossip: this worker joins the others' collective.
Status connect_collective(NetworkCollective& collective, const Assignment& a, const std::string& name,
                          const JobConfig& cfg, Exchange exchange) {
  if (a.peer_endpoints.size() != a.workers || a.index >= a.workers)
    return Status::Internal(name + ": the assignment does not say where every worker's collective listens");
  for (std::size_t w = 0; w < a.peer_endpoints.size(); ++w)
    if (a.peer_endpoints[w].empty())
      return Status::InvalidArgument(fmt::format("{}: worker {} announced no collective", name, w));
  collective.set_half_precision(cfg.compress == "fp16");
  collective.set_allreduces(exchange == Exchange::allreduce);
  return collective.connect(a.index, a.peer_endpoints);
}

Status assignment_fits(const Assignment& a, std::size_t train_count, std::uint32_t epochs) {
  if (a.partition_end > train_count || a.partition_begin > a.partition_end || a.batch == 0)
    return Status::Internal("the assigned partition does not fit the training data here");
  if (a.first_epoch >= epochs) return Status::Internal("assigned to start after the last epoch");
  return {};
}

void log_share(const std::string& name, const Assignment& a, std::size_t shards) {
  logger().info("{}: samples [{}, {}) in batches of {}, {} shard(s){}", name, a.partition_begin, a.partition_end,
               a.batch, shards,
               a.first_epoch > 0 ? fmt::format(", from epoch {}", a.first_epoch + 1) : "");
}

void log_collective_drops(const std::string& name, const NetworkCollective& collective) {
  if (const std::uint64_t dropped = collective.rejected(); dropped > 0)
    logger().warn("{}: its collective dropped {} malformed or out-of-step message(s)", name, dropped);
  if (const std::uint64_t unsent = collective.unsent(); unsent > 0)
    logger().warn("{}: its collective dropped {} message(s) it could not send (see the warnings above)", name, unsent);
}

// A worker of one process's step, measured on the job's data and this
// worker's device (--worker-weights auto). A device that fails or runs out
// of memory at the probe batch (twice --batch) throws, as in a step: said
// as the job's error, where it aborted the process (no handler between
// here and main).
Result<StepCost> measure_step_cost(const JobPlan& plan, const data::DatasetSplits& data, const std::string& device,
                                   std::uint32_t index) {
  WorkerPlan probe_plan = plan_worker(index, {{0, data.train.count}, plan.batch}, Straggler{}, 0);
  probe_plan.device = device;
  WorkerSetup ws = worker_setup(plan, probe_plan);
  ws.compute = std::make_shared<ComputeContext>(plan.compute_threads);
  StepCost cost;
  try {  // (making the model on the device may throw as well)
    auto core = WorkerCore::make(ws, [] { return std::chrono::steady_clock::now(); });
    if (!core) return core.status();
    cost = core->calibrate(data::leading_batch(data.train, 2 * std::size_t{plan.batch}));
  } catch (...) {
    return thrown_status(std::current_exception(), "worker " + std::to_string(index) + " calibrating on " + device);
  }
  logger().info("worker {}: a step of B samples takes {:.3g} ms + B x {:.3g} us on {} in calibration", index,
                cost.fixed_s * 1e3, cost.per_sample_s * 1e6, device);
  return cost;
}

// --compress fp16 rounds the steps' traffic between workers and shards.
// Under allreduce and gossip that traffic is the workers' collective (which
// rounds its own): what reaches the shards there, first parameters and
// publishes, is what the job evaluates and checkpoints, and goes exact.
// Under averaging the pushes are the parameters whose mean the shards keep:
// rounded, they made the final model float16's (99.7% of its values).
namespace {

// Averaging's pushes: the parameters the shards keep (their mean), not a
// step's traffic.
bool pushes_are_kept_parameters(const JobPlan& settings) {
  auto policy = make_policy(settings.policy);
  return policy && (*policy)->combine().rule == Combine::Rule::replace;
}

}  // namespace

messaging::TensorCoding coding_of(const JobConfig& c) {
  using messaging::TensorCoding;
  if (c.compress != "fp16") return TensorCoding::float32;
  auto settings = plan_settings(c, Placement::processes, 1);
  return !settings || settings->exchange != Exchange::none || pushes_are_kept_parameters(*settings)
             ? TensorCoding::float32
             : TensorCoding::float16;
}

std::optional<std::string> compress_changes_nothing(const JobConfig& c) {
  if (c.compress != "fp16") return std::nullopt;
  auto settings = plan_settings(c, Placement::processes, 1);
  if (!settings) return std::nullopt;
  if (settings->exchange == Exchange::gossip)
    return "--compress fp16 changes nothing under gossip: the copies the workers exchange, and what they publish to "
           "the shards, go as float32";
  if (settings->exchange == Exchange::none && pushes_are_kept_parameters(*settings))
    return "--compress fp16 changes nothing under " + settings->policy_name +
           ": its pushes are the parameters the shards keep, sent exact so the model is not rounded";
  return std::nullopt;
}

}  // namespace asgd::cluster_detail
