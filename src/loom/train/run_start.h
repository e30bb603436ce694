// What a training run does before its first step with the files it was pointed at:
// claiming checkpoint.dir and the trace path (Note [Checkpoint directory ownership]) and
// choosing and loading the checkpoint it resumes from (Note [Resume auto]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/core/config.h"
#include "loom/ckpt/run_dir.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/train/trainer.h"

namespace loom {

namespace comm {
class Group;
}
class Reporter;

// Collective over `everyone` (every training rank; null: one process). Its rank 0 checks every output path, locks checkpoint.dir, moves an
// earlier run aside under --overwrite and removes unfinished saves; every rank learns the
// outcome before the first step (a refusal is thrown on every rank, naming the problem).
// Returns rank 0's lock (nullptr elsewhere, or without checkpoint.dir).
std::unique_ptr<DirLock> claim_outputs(const Config& cfg, const TrainOptions& opt, comm::Group* everyone, Reporter& rep);

// Note [Checkpoint room]: what a run's new checkpoints take on disk at their peak; `resuming`:
// a resume that finds checkpoints there.
struct CheckpointRoom {
  int64_t saves = 0;     // saves the run makes from step 0, its end included
  int64_t at_once = 0;   // new checkpoints on disk while the last is written, itself included
  double one_bytes = 0;  // a lower bound on one checkpoint
  double need_bytes = 0; // free space needed now
};
CheckpointRoom checkpoint_room(const Config& cfg, bool resuming);
// Throws Error when checkpoint.dir's file system has less free space than checkpoint_room's.
void check_checkpoint_room(const Config& cfg, const std::string& dir, bool resuming);

// Note [Shared checkpoint directory]: collective over `everyone`, after rank 0 took the lock in
// `dir` (claim_outputs): throws ConfigError on every rank when a rank does not see that lock,
// naming each such rank and its host.
void check_shared_dir(const std::string& dir, comm::Group& everyone);

// Note [Resume auto]
// --resume auto takes checkpoint.dir's complete steps newest first (whatever `latest`
// says: a save killed between publishing a step and updating `latest` leaves a newer
// complete step), then a whole-model checkpoint there (an old run's end, or `loom import`:
// moments absent mean zero moments, optimizer step 0). Every rank loads its part; if any
// rank finds damage, every rank skips to the next candidate and the log names the step
// skipped and why. A checkpoint of a different model is refused, not skipped. Nothing
// to resume from starts at step 0; candidates that all fail are an error listing each.
// --resume DIR is strict: that checkpoint or an error.
//
// Collective over `everyone`. Loads into `s`; returns the step to continue from (0 when starting fresh).
int64_t load_resume(const Config& cfg, const std::string& resume, ShardState& s, comm::Group* everyone, Reporter& rep);

}  // namespace loom
