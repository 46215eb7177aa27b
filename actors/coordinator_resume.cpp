// Checkpoints as the coordinator sees them: where a --resume'd job starts,
// and the metrics file's records of a resume and of a shard's restart
// (coordinator_resume.hpp).
#include "base/log.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <limits>

#include "actors/checkpoint_claim.hpp"
#include "actors/coordinator_resume.hpp"
#include "actors/parameter_shard.hpp"

namespace asgd {

Status resume_refused(const JobConfig& cfg, const Status& why) {
  if (why.code() == StatusCode::invalid_argument || why.code() == StatusCode::not_found) return why;
  return Status::InvalidArgument("--resume " + cfg.resume + ": " + why.message());
}

namespace {

// How many shards the checkpoints in `dir` were cut into, when shard-0 to
// shard-(K-1) hold every one of the model's `params` between them; nullopt
// when they do not (a file missing or another model's).
std::optional<std::uint32_t> checkpointed_shards(const std::string& dir, std::uint64_t params) {
  std::uint64_t keys = 0;
  for (std::uint32_t k = 0; k < kMaxShards && keys < params; ++k) {
    auto saved = ShardCore::saved(shard_checkpoint_path(dir, k));
    if (!saved) return std::nullopt;
    keys += saved->stats.keys;
    if (keys == params) return k + 1;
  }
  return std::nullopt;
}

// Why shard `index`'s checkpoint is not this job's: another shard count
// (a model's parameters are cut into shards by their count), when the
// folder holds a whole set of another; else `otherwise`.
Status not_this_jobs(const JobConfig& cfg, const JobPlan& job, Status otherwise) {
  const auto k = checkpointed_shards(cfg.resume, job.num_params);
  if (!k || *k == cfg.shards) return otherwise;
  return Status::InvalidArgument("--resume " + cfg.resume + ": it holds the checkpoints of " + std::to_string(*k) +
                                 " shard(s), this job has " + std::to_string(cfg.shards) +
                                 ": the shard count cannot change on resume (use --shards " + std::to_string(*k) +
                                 ")");
}

// Why a shard's checkpoint is not there: a write of it that never ended
// (FILE.K.tmp: its process was killed while it wrote its first), or none.
std::string why_no_checkpoint(const std::string& path) {
  const auto unfinished = unfinished_writes(path);
  if (!unfinished.empty())
    return "only " + std::filesystem::path(unfinished.front().second).filename().string() +
           " is there, a write that never ended: the shard's process was stopped while it wrote its first "
           "checkpoint, so the job has nothing to resume from";
  return "was the job run with --checkpoint-dir and --checkpoint-every?";
}

}  // namespace

Result<ResumePlan> plan_resume(const JobConfig& cfg, const JobPlan& job) {
  const std::vector<WorkerPlan>& workers = job.workers;
  ResumePlan plan;
  std::vector<Clock> done(workers.size(), std::numeric_limits<Clock>::max());  // per worker: steps every shard has
  plan.updates = std::numeric_limits<std::uint64_t>::max();
  plan.written_unix_s = std::numeric_limits<double>::max();
  for (const ShardPlan& shard : job.shards) {
    const std::string path = shard_checkpoint_path(cfg.resume, shard.index);
    auto saved = ShardCore::saved(path);
    if (!saved) {
      if (saved.status().code() == StatusCode::not_found)
        return not_this_jobs(cfg, job,
                             Status::NotFound("--resume " + cfg.resume + ": no checkpoint of shard " +
                                              std::to_string(shard.index) + " (" + path + "); " +
                                              why_no_checkpoint(path)));
      return resume_refused(cfg, saved.status());
    }
    if (saved->stats.keys != shard.range.size())
      return not_this_jobs(cfg, job,
                           Status::InvalidArgument("--resume " + cfg.resume + ": " + path + " holds " +
                                                   std::to_string(saved->stats.keys) + " parameters, this job's shard " +
                                                   std::to_string(shard.index) + " has " +
                                                   std::to_string(shard.range.size()) +
                                                   ": the checkpointed job had another model, or the folder "
                                                   "holds shard files of jobs with other --shards counts"));
    if (saved->optimizer != job.optimizer.kind)
      return Status::InvalidArgument("--resume " + cfg.resume + ": " + path + " holds the state of the " +
                                     saved->optimizer + " optimizer, this job's is " + job.optimizer.kind +
                                     ": the optimizer cannot change on resume (use --optimizer " + saved->optimizer +
                                     ")");
    if (Status s = claimable(path); !s.ok()) return resume_refused(cfg, s);
    if (saved->train_fingerprint != 0 && job.train_fingerprint != 0 && saved->train_fingerprint != job.train_fingerprint)
      return Status::InvalidArgument(fmt::format(
          "--resume {}: {} was trained on other data than this job's (training split fingerprint {:08x}, this "
          "job's {:08x}, {} samples): resume with the data and --seed it trained on",
          cfg.resume, path, saved->train_fingerprint, job.train_fingerprint, job.train_count));
    const auto& clocks = saved->stats.worker_clock;
    if (clocks.size() != workers.size())
      return Status::InvalidArgument("--resume " + cfg.resume + ": " + path + " is of a job with " +
                                     std::to_string(clocks.size()) + " workers, not " + std::to_string(workers.size()));
    for (std::size_t w = 0; w < clocks.size(); ++w) done[w] = std::min(done[w], clocks[w]);
    plan.updates = std::min(plan.updates, saved->stats.updates_applied);
    plan.written_unix_s = std::min(plan.written_unix_s, saved->written_unix_s);
  }
  std::uint64_t epochs_done = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t w = 0; w < workers.size(); ++w)
    epochs_done = std::min<std::uint64_t>(epochs_done, done[w] / std::max<std::uint64_t>(workers[w].steps_per_epoch, 1));
  if (epochs_done >= cfg.epochs)  // (what it trained, not this --epochs: a smaller one said "all 2" after 3)
    return Status::InvalidArgument("--resume " + cfg.resume + ": the checkpointed job had trained " +
                                   std::to_string(epochs_done) + (epochs_done == 1 ? " epoch" : " epochs") +
                                   ", all of --epochs " +
                                   std::to_string(cfg.epochs) + "; give --epochs above " +
                                   std::to_string(epochs_done) + " to train further");
  plan.first_epoch = static_cast<std::uint32_t>(epochs_done);
  for (const auto& w : workers) plan.restart.push_back(plan.first_epoch * w.steps_per_epoch);
  return plan;
}

void warn_of_worker_state_not_resumed(const JobPlan& plan) {
  auto policy = make_policy(plan.policy);
  if (!policy || !(*policy)->plan(0).local_update) return;
  const OptimizerConfig& o = plan.optimizer;
  const bool stateful = o.kind == "adagrad" || o.kind == "adam" || (o.kind == "momentum" && o.momentum > 0.0f);
  const bool own_params = (*policy)->combine().rule == Combine::Rule::elastic;  // easgd's workers drift from the center
  if (!stateful && !own_params) return;
  std::string lost;
  if (stateful) lost = "each worker's " + o.kind + " state starts again from zero";
  if (own_params)
    lost += std::string(lost.empty() ? "" : ", and ") + "each worker starts again from the center variable";
  logger().warn("the checkpoints hold the shards' state, not the workers' own: under {} {} (the shards' parameters "
                "and optimizer state are restored), so the resumed job's first steps differ from an uninterrupted "
                "run's",
                plan.policy_name, lost);
}

nlohmann::json resume_record(const JobConfig& cfg, const ResumePlan& resumed, double now_unix) {
  logger().info("resuming {} at epoch {} of {}: {} updates restored from checkpoints written {:.0f} s ago", cfg.resume,
               resumed.first_epoch + 1, cfg.epochs, resumed.updates, now_unix - resumed.written_unix_s);
  return {{"event", "resume"},
          {"from", cfg.resume},
          {"epoch", resumed.first_epoch + 1},
          {"updates", resumed.updates},
          {"checkpoint_age_s", now_unix - resumed.written_unix_s},
          // Updates after the last checkpoint were lost with the stopped job: at most one interval.
          {"lost_at_most_s", cfg.checkpoint_every_s}};
}

// What was lost is what the restarted process did not reload: it says
// which checkpoint it reloaded, if any (checkpoint writes may have been
// failing for a while, or never have succeeded).
nlohmann::json shard_restart_record(std::uint32_t shard, double at_s, const ShardStats* reloaded,
                                    const std::string& why, double now_unix, const std::string& checkpoint_dir) {
  if (!reloaded) {
    logger().warn("shard {} was restarted at {:.1f} s; it did not say which checkpoint it reloaded: {}", shard, at_s,
                 why);
    return {{"event", "shard_restarted"}, {"shard", shard}, {"train_s", at_s}, {"checkpoint_age_s", nullptr},
            {"restored_updates", nullptr}, {"lost_at_most_s", nullptr}};
  }
  nlohmann::json record = {{"event", "shard_restarted"}, {"shard", shard}, {"train_s", at_s}};
  if (reloaded->restored_unix_s > 0) {
    const double age_s = std::max(0.0, now_unix - reloaded->restored_unix_s);
    logger().warn("shard {} was restarted at {:.1f} s from its checkpoint of {:.1f} s before, "
                 "holding {} updates: the updates it applied after that checkpoint are lost",
                 shard, at_s, age_s, reloaded->restored_updates);
    record["checkpoint_age_s"] = age_s;
    record["restored_updates"] = reloaded->restored_updates;
    record["lost_at_most_s"] = age_s;
  } else {
    // (It may have written some where the new process does not look: a
    // folder not shared with the host it ran on before.)
    const std::string none =
        checkpoint_dir.empty()
            ? "the job keeps none: no --checkpoint-dir"
            : fmt::format("it found no shard-{}.ckpt in {} on its host: none was written yet, or that folder is not "
                          "one the hosts share",
                          shard, checkpoint_dir);
    logger().warn("shard {} was restarted at {:.1f} s without a checkpoint to reload ({}): it starts again from the "
                  "initial parameters, and every update it had applied is lost",
                  shard, at_s, none);
    record["checkpoint_age_s"] = nullptr;
    record["restored_updates"] = 0;
    record["lost_at_most_s"] = at_s;
  }
  return record;
}

}  // namespace asgd
