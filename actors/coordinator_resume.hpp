#pragma once
// Checkpoints as the coordinator sees them: where a --resume'd job starts,
// and the metrics file's records of a resume and of a shard's restart.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/job_plan.hpp"
#include "asgd/job.hpp"
#include "asgd/status.hpp"
#include "messaging/protocol.hpp"

namespace asgd {

/// Where a resumed job starts (JobConfig::resume): read from the shards'
/// checkpoints, for the job's shares.
struct ResumePlan {
  std::uint32_t first_epoch = 0;        ///< 0-based: the first epoch not every worker had finished
  std::vector<Clock> restart;           ///< per worker: the clock of its first step (first_epoch x its steps per epoch)
  std::uint64_t updates = 0;            ///< updates the restored parameters hold
  double written_unix_s = 0.0;          ///< when the oldest of the shard checkpoints was written
};
/// Errors: not_found for a missing shard checkpoint, corruption, and
/// invalid_argument when the checkpoints are not this job's or it had
/// already trained every epoch.
Result<ResumePlan> plan_resume(const JobConfig& config, const JobPlan& plan);
/// What --resume was given is the user's to fix, whatever is wrong with it:
/// a usage error that names the folder and the file.
Status resume_refused(const JobConfig& cfg, const Status& why);
/// A warning where the policy's workers step optimizers of their own
/// (hogwild, averaging, easgd, allreduce, gossip) whose state (momentum,
/// Adam's moments; easgd's own parameters) the shard checkpoints lack.
void warn_of_worker_state_not_resumed(const JobPlan& plan);
/// The metrics file's "resume" record, logged.
nlohmann::json resume_record(const JobConfig& cfg, const ResumePlan& resumed, double now_unix);
/// The metrics file's "shard_restarted" record, logged: what the restarted
/// shard said it reloaded (`reloaded`), or that it did not say (`why`).
/// `checkpoint_dir`: the job's (empty: it keeps none), named when the shard
/// found nothing to reload there.
nlohmann::json shard_restart_record(std::uint32_t shard, double at_s, const ShardStats* reloaded,
                                    const std::string& why, double now_unix, const std::string& checkpoint_dir = {});

}  // namespace asgd
