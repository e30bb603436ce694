// What loom may do to the directory a user points it at (checkpoint.dir, import's
// --checkpoint, convert's --out).
//
// Note [Checkpoint directory ownership]
// loom deletes or replaces only what it can prove it wrote, and a run never mixes its
// checkpoints with another run's:
//  - loom's entries are: `latest` (+ `.tmp`), `loom.lock`, step-NNNNNNNN/ holding a
//    manifest.json (complete sharded steps), step-NNNNNNNN.tmp/ (unfinished saves),
//    replaced-*/ (what --overwrite moved aside), and a whole-model checkpoint's four files
//    when model.safetensors carries loom's format tag. Anything else is the user's: a
//    target holding any of it is refused, naming the entries; nothing there is touched.
//  - a run that is not resuming refuses a directory holding checkpoints (it names their
//    model, layout and newest step, and offers --resume auto, another checkpoint.dir, or
//    --overwrite, which moves them into replaced-<UTC time>/ and deletes nothing).
//  - one job at a time: the job's global rank 0 holds an exclusive flock on loom.lock for
//    the whole run (the kernel drops it when the process dies, so a killed job never
//    leaves it held). Holding it proves no live job owns the unfinished saves
//    (step-N.tmp), so they are removed then.
//  - every output path is checked (created, written, over-long, read-only) before the
//    first training step, so a bad path never costs the run's result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct Config;

struct DirSurvey {
  std::string path;
  bool exists = false;
  std::vector<int64_t> steps;          // complete sharded steps (step-N/manifest.json), ascending
  std::vector<std::string> stale;      // unfinished saves: step-N.tmp/, *.tmp files (names)
  std::vector<std::string> replaced;   // replaced-*/ directories (names)
  bool latest = false;                 // a `latest` file
  bool whole = false;                  // a whole-model checkpoint (config.toml + loom's model.safetensors)
  std::vector<std::string> foreign;    // entries loom did not write (names, sorted)
  bool holds_checkpoints() const { return !steps.empty() || whole; }
};

// Reads the directory; throws ConfigError when `dir` exists but is not a directory.
DirSurvey survey_dir(const std::string& dir);

// "step 30 (model gpt, 2 layers, d_model 64, vocab 256; layout dp 2 tp 1 pp 1 vpp 1 zero 0
// on 2 ranks)" for the newest checkpoint of the survey; tolerant of damage (it only names).
std::string describe_newest(const DirSurvey& s);

// The config of the newest complete step of the survey (nullopt: none, or unreadable).
std::optional<Config> newest_config(const DirSurvey& s);

// Throws ConfigError unless every entry of the survey is loom's (names them and the fix).
void refuse_foreign(const DirSurvey& s, const std::string& what);

// A target that receives one whole checkpoint (`loom import`, `loom ckpt convert --out`)
// must be new, empty, or (whole_ok) an earlier whole-model checkpoint: throws ConfigError
// naming foreign entries or the run whose checkpoints are there. `what` names the flag.
void check_new_target(const std::string& dir, const std::string& what, bool whole_ok);

// The checks of a training run's checkpoint.dir that read only (the supervisor of --nproc
// runs them before launching; rank 0 runs them again under the lock): refuses a file at
// the path, foreign entries, an over-long path, and, unless `resuming` or `overwrite`,
// a directory holding checkpoints.
void check_run_dir(const std::string& dir, bool resuming, bool overwrite);

// An exclusive flock on dir/loom.lock, held until destroyed. Creates `dir` (and parents).
// Throws Error naming the path and the OS reason when it cannot be created or written,
// and ConfigError naming the holder (pid, host) when another live job holds it.
class DirLock {
 public:
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// Moves the entries `names` of `root` into a new root/replaced-<UTC time>/ (never
// deleting); returns that directory ("" when `names` is empty).
std::string set_aside(const std::string& root, const std::vector<std::string>& names);

// --overwrite: moves the steps, `latest` and any whole-model checkpoint of `s` into
// s.path/replaced-<UTC time>/ (never deleting); returns that directory ("" when empty).
std::string move_aside(const DirSurvey& s);

// Removes the unfinished saves of the survey (call only while holding the DirLock);
// returns their names.
std::vector<std::string> remove_stale(const DirSurvey& s);

// Refuses an output file path before any work: its directory must exist and be
// writable, the path must not be a directory or over-long. Leaves no file behind.
void check_output_file(const std::string& path, const std::string& what);

}  // namespace loom
