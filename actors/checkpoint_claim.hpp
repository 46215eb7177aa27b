#pragma once
// Who may replace a shard's checkpoint file. A shard process that stopped
// answering (SIGSTOP, a frozen VM, a long swap storm) is given up for dead
// and another takes its place, reloading the file; when the first one wakes
// it must not overwrite the newer process's checkpoints with its own older
// state, periodically or when told to stop, or a later restart or --resume
// goes back in time without a word. So every shard that checkpoints into
// FILE claims it when it starts: FILE.claim holds the newest claim's number,
// one more with each claim, and a write replaces FILE only while that number
// is still the writer's, checked under an flock of FILE.claim together with
// the rename. (flock is advisory and local: every writer here is asgd, and
// a checkpoint folder on a network file system is locked as far as the file
// system's flock reaches.)

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

/// Takes the next claim on the checkpoint `file` (its folder made if
/// missing) and removes the temporary files older claims left; its number,
/// 1 for the first. Errors: io_error naming the path (a claim file that
/// another holds locked for over kClaimLockWait among them), corruption for
/// a claim file that holds no number.
Result<std::uint64_t> claim_checkpoint(const std::string& file);

/// Whether a shard can claim `file`: no FILE.claim, or one that holds a
/// claim number. A resumed job checks before it starts (a claim file with
/// anything else in it left a whole job without checkpoints, each write a
/// warning). Errors: corruption naming FILE.claim, io_error.
Status claimable(const std::string& file);

/// The writes of `file` that never ended (FILE.K.tmp, its process killed
/// mid-write): each claim K with the temporary's path.
std::vector<std::pair<std::uint64_t, std::string>> unfinished_writes(const std::string& file);

/// Writes `bytes` to `file` atomically, through FILE.K.tmp for claim K, if
/// no newer claim was taken on it since `claim` (a claim file removed
/// meanwhile counts as none). Errors: cancelled when a newer
/// claim was taken (the message names both), io_error naming the path.
Status write_claimed(const std::string& file, std::uint64_t claim, const std::string& bytes);

}  // namespace asgd
