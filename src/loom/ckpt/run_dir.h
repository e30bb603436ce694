// What loom may do to the directory a user points it at (checkpoint.dir, import's
// --checkpoint, convert's --out).
//
// Note [Checkpoint directory ownership]
// loom deletes or replaces only what it can prove it wrote, by content (Note [Ownership by
// content], core/owned.h), and a run never mixes its checkpoints with another run's:
//  - loom's entries are: `latest` holding one step name; `loom.lock` holding a lock line;
//    step-NNNNNNNN/ whose manifest.json carries the sharded format tag; abandoned
//    temporary directories `<name>.loom-tmp-<token>/` whose marker proves them loom's and
//    whose maker is gone (unfinished saves, imports); replaced-<UTC time>/ (what
//    --overwrite moved aside); and a whole-model checkpoint's four files when
//    model.safetensors carries loom's format tag. No entry is loom's by its name alone, and
//    a symlink, FIFO or device never is. Anything else is the user's: a target holding
//    any of it is refused, naming the entries; nothing there is touched.
//  - a run that is not resuming refuses a directory holding checkpoints (it names their
//    model, layout and newest step, and offers --resume auto, another checkpoint.dir, or
//    --overwrite, which moves them into replaced-<UTC time>/ and deletes nothing).
//  - one job at a time: the job's global rank 0 holds an exclusive flock on loom.lock for
//    the whole run (the kernel drops it when the process dies, so a killed job never
//    leaves it held). Every command that writes into the directory (train, import,
//    ckpt convert) takes it; a `loom.lock` that is a symlink, not a regular file, or holds
//    anything but a lock line is refused, never followed or truncated.
//  - pruning (checkpoint.keep_last) removes only the files a step's manifest names, then
//    the manifest, then the directory if it is left empty.
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
  std::vector<std::string> stale;      // abandoned temporaries of loom's (names)
  std::vector<std::string> busy;       // temporaries of loom's whose maker still runs (names)
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
// Returns the survey it checked.
DirSurvey check_new_target(const std::string& dir, const std::string& what, bool whole_ok);

// The checks of a training run's checkpoint.dir that read only (the supervisor of --nproc
// runs them before launching; rank 0 runs them again under the lock): refuses a file at
// the path, foreign entries, an over-long path, and, unless `resuming` or `overwrite`,
// a directory holding checkpoints.
void check_run_dir(const std::string& dir, bool resuming, bool overwrite);

// An exclusive flock on dir/loom.lock, held until destroyed. Creates `dir` (and parents).
// Throws Error naming the path and the OS reason when it cannot be created or written,
// and ConfigError naming the holder (pid, host) when another live job holds it.
// The lock file DirLock holds in `dir`.
std::string lock_path(const std::string& dir);

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

// Removes the abandoned temporaries of the survey, each proven again; returns their names.
std::vector<std::string> remove_stale(const DirSurvey& s);

// Removes root/step-N/ if it is a complete step of loom's: the files its manifest names,
// the manifest, and the directory once empty. False when it is not loom's or something
// else is left in it (then that stays).
bool remove_step(const std::string& root, int64_t step);

// Refuses an output file path before any work: its directory must exist and be
// writable, the path must not be a directory or over-long; an entry already there must be
// a regular file, replaced only with `overwrite` or when it carries one of `marks` (Note
// [User-named outputs] in core/owned.h). Leaves no file behind.
void check_output_file(const std::string& path, const std::string& what, bool overwrite = false,
                       const std::vector<std::string>& marks = {});

}  // namespace loom
