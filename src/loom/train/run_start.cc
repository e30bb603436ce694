// Before the first step: claiming the outputs and loading --resume (run_start.h).
#include "loom/train/run_start.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/comm/agree.h"
#include "loom/train/report.h"
#include "loom/ckpt/memory_ckpt.h"
#include "loom/ckpt/shard_format.h"
#include "loom/model/layout.h"

namespace loom {

namespace fs = std::filesystem;

// Note [Checkpoint room]
// A save checks its own file's room before writing it (require_free_space), but a run whose
// disk cannot hold its checkpoints would learn that at its first save or, with keep_last, at
// a later one, after the steps before it. So before step 1 rank 0 checks that checkpoint.dir's
// file system holds what the run will have on disk at its peak beyond what is there now: a
// checkpoint is at least 4 bytes for each parameter and each optimizer moment (AdamW two, SGD
// one; headers and tp's replicated tensors left out, so this is a lower bound); the run saves
// n = ceil(train.steps / save_every) times (its end included), and a save is written before
// keep_last = k prunes the oldest, so writing the last one holds min(n, k + 1) of them. A
// resumed run has saved some of its n already and the directory holds them (the step it
// resumes from is not known yet here): only the next save is certain, one checkpoint's room.
CheckpointRoom checkpoint_room(const Config& cfg, bool resuming) {
  const CheckpointConfig& c = cfg.checkpoint;
  CheckpointRoom r;
  const int64_t every = std::max<int64_t>(1, c.save_every > 0 ? c.save_every : cfg.train.steps);
  r.saves = (cfg.train.steps + every - 1) / every;
  r.one_bytes = 4.0 * double(ParamLayout(cfg.model).param_count()) * (1 + (cfg.optim.sgd() ? 1 : 2));
  r.at_once = resuming ? 1 : c.keep_last > 0 ? std::min(r.saves, c.keep_last + 1) : r.saves;
  r.need_bytes = r.one_bytes * double(std::max<int64_t>(1, r.at_once));
  return r;
}

void check_checkpoint_room(const Config& cfg, const std::string& dir, bool resuming) {
  const CheckpointRoom r = checkpoint_room(cfg, resuming);
  require_free_space(dir, r.need_bytes,
                     "preflight (Note [Checkpoint room]): this run's checkpoints (" + std::to_string(r.saves) +
                         " saves of at least " + detail::cat(r.one_bytes / 1e9) + " GB each: " +
                         std::to_string(ParamLayout(cfg.model).param_count()) +
                         " parameters and their optimizer moments, 4 bytes each; " +
                         (resuming ? std::string("the next save") : std::to_string(r.at_once) + " new on disk at once with "
                                     "checkpoint.keep_last = " + std::to_string(cfg.checkpoint.keep_last)) + ")",
                     "free space, lower checkpoint.keep_last, raise checkpoint.save_every, or set checkpoint.dir on "
                     "another file system");
}

std::unique_ptr<DirLock> claim_outputs(const Config& cfg, const TrainOptions& opt, comm::Group* group, Reporter& rep) {
  const int rank = group ? group->group_rank() : 0;
  std::unique_ptr<DirLock> lock;
  std::exception_ptr error;
  if (rank == 0) try {
      check_output_file(opt.trace_path, "--trace", opt.overwrite, owned::marks::kTrace);
      const std::string& dir = cfg.checkpoint.dir;
      if (!dir.empty()) {
        check_run_dir(dir, !opt.resume.empty(), opt.overwrite);
        lock = std::make_unique<DirLock>(dir);
        // Under the lock: nothing else writes here now, so the survey holds.
        const DirSurvey s = survey_dir(dir);
        refuse_foreign(s, "checkpoint.dir");
        // Resuming from elsewhere into a directory of another model's run would mix the two.
        if (!opt.resume.empty() && opt.resume != "auto")
          if (const std::optional<Config> there = newest_config(s); there && !same_model(*there, cfg))
            throw ConfigError("checkpoint.dir '" + dir + "' holds checkpoints of another model (newest " +
                              describe_newest(s) + "); resume into a new checkpoint.dir");
        for (const std::string& n : remove_stale(s)) rep.info("removed an unfinished save: " + dir + "/" + n);
        check_checkpoint_room(cfg, dir, !opt.resume.empty() && s.holds_checkpoints());
        if (opt.overwrite && opt.resume.empty())
          if (const std::string to = move_aside(s); !to.empty())
            rep.info("--overwrite: moved the earlier run's checkpoints (newest " + describe_newest(s) + ") to " + to);
      }
    } catch (const Error&) {
      error = std::current_exception();
      lock.reset();
    }
  agree_or_throw(group, rank, error);
  if (group && group->size() > 1 && !cfg.checkpoint.dir.empty()) check_shared_dir(cfg.checkpoint.dir, *group);
  return lock;
}

// Note [Shared checkpoint directory]
// A sharded save has every rank write its file into the temporary step directory rank 0
// made, which rank 0 then renames into place (Note [Sharded checkpoints]), so checkpoint.dir
// must be one directory that every rank reaches: a filesystem every host mounts. A job whose
// hosts each see a directory of their own would fail at its first save, after the steps
// before it. So before step 1 each rank reads the lock rank 0 has just written there
// (loom.lock: "loom-lock-1 pid P on HOST") and the ranks all-gather a CRC-32 of what they
// read (0: nothing there); a rank that read anything other than rank 0 did is named with its
// host, on every rank.
void check_shared_dir(const std::string& dir, comm::Group& everyone) {
  std::ifstream in(lock_path(dir), std::ios::binary);
  const std::string text = in ? std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) : "";
  const int64_t mine = in ? 1 + int64_t(crc32_of(text.data(), text.size())) : 0;
  std::vector<int64_t> all(size_t(everyone.size()));
  everyone.all_gather(std::span<const int64_t>(&mine, 1), std::span<int64_t>(all));
  const std::vector<std::string>& hosts = everyone.world().hosts();
  auto host = [&](int r) {
    const size_t g = size_t(everyone.global_rank_of(r));
    return g < hosts.size() ? " on host " + hosts[g] : std::string();
  };
  std::string blind;
  for (int r = 1; r < everyone.size(); ++r)
    if (all[size_t(r)] != all[0]) blind += (blind.empty() ? "" : ", ") + ("rank " + std::to_string(r)) + host(r);
  if (!blind.empty())
    throw ConfigError("checkpoint.dir '" + dir + "' is not one directory for every rank: rank 0" + host(0) +
                      " holds its lock there and it is not seen by " + blind + "; every rank writes its shard into "
                      "the step directory rank 0 makes, so put checkpoint.dir on a filesystem every host mounts (Note "
                      "[Shared checkpoint directory])");
}

namespace {

struct Candidate {
  std::string dir;   // a step directory, or the checkpoint.dir holding whole-model files
  bool whole = false;
  std::string name;  // for the log
  int64_t step = -1;  // a sharded step's number
  bool memory = false;  // a host store's step (Note [In-memory checkpoints])
};

std::vector<Candidate> auto_candidates(const std::string& root, Reporter& rep) {
  const DirSurvey s = survey_dir(root);
  std::vector<Candidate> out;
  for (auto it = s.steps.rbegin(); it != s.steps.rend(); ++it) {
    const std::string name = shard::step_name(*it);
    out.push_back({(fs::path(root) / name).string(), false, name, *it});
  }
  if (s.whole) out.push_back({root, true, "the whole-model checkpoint in " + root});
  if (s.latest && !s.steps.empty()) {  // `latest` is a hint; say when it disagrees
    std::string named;
    try {
      const std::optional<std::string> d = resolve_step_dir(root);
      named = d ? fs::path(*d).filename().string() : "";
    } catch (const Error& e) {
      named = std::string("?");
      rep.info(std::string("resume auto: ignoring `latest`: ") + e.what());
    }
    if (named != "?" && named != out.front().name)
      rep.info("resume auto: `latest` names " + (named.empty() ? std::string("nothing") : named) + " but " +
               out.front().name + " is the newest complete step");
  }
  return out;
}

// Note [In-memory checkpoints]: the newest step the hosts' stores hold whole goes first
// when it is no older than the newest on disk (no disk read, fewer steps lost).
void memory_candidate(const Config& cfg, comm::Group* group, Reporter& rep, std::vector<Candidate>& candidates) {
  const std::optional<MemoryStep> m = restore_memory(cfg, group);
  if (!m) return;
  const int64_t disk = candidates.empty() ? -1 : candidates.front().step;
  const std::string name = detail::cat("the in-memory checkpoint of step ", m->step, " (held on ", m->hosts,
                                       " hosts; ", m->copied_bytes, " bytes copied to rank 0's host)");
  if (m->step < disk) {
    rep.info("resume auto: " + name + " is older than " + candidates.front().name + " on disk");
    return;
  }
  candidates.insert(candidates.begin(), Candidate{m->dir, false, name, m->step, true});
}

int64_t load_one(const Candidate& c, const Config& cfg, ShardState& s, int rank) {
  return c.whole ? load_whole_checkpoint(c.dir, cfg, s) : load_shards(c.dir, cfg, s, rank);
}

}  // namespace

int64_t load_resume(const Config& cfg, const std::string& resume, ShardState& s, comm::Group* group, Reporter& rep) {
  if (resume.empty()) return 0;
  const int rank = group ? group->group_rank() : 0;
  const bool is_auto = resume == "auto";
  const std::string where = is_auto ? cfg.checkpoint.dir : resume;
  if (where.empty()) throw ConfigError("--resume auto needs checkpoint.dir (where the checkpoints are)");
  std::vector<Candidate> candidates;
  if (is_auto) {
    candidates = auto_candidates(where, rep);
  } else if (const std::optional<std::string> dir = resolve_step_dir(where)) {
    candidates.push_back({*dir, false, *dir});
  } else if (survey_dir(where).whole) {
    candidates.push_back({where, true, where});
  } else {
    throw ConfigError("--resume " + where + ": no checkpoint there (no manifest.json, latest, or whole-model files)");
  }
  if (is_auto && cfg.checkpoint.memory_every > 0) memory_candidate(cfg, group, rep, candidates);
  if (candidates.empty()) {
    rep.info("resume auto: no checkpoint in " + where + "; starting at step 0");
    return 0;
  }
  std::string skipped;
  for (const Candidate& c : candidates) {
    int64_t step = 0;
    std::exception_ptr mine;
    try {
      step = load_one(c, cfg, s, rank);
    } catch (const Error&) {
      mine = std::current_exception();
    }
    const std::optional<AgreedFailure> f = agree(group, rank, mine);
    if (!f) {
      if (step > cfg.train.steps)
        throw ConfigError(detail::cat("--resume: checkpoint ", c.dir, " is at step ", step, ", past train.steps = ",
                                      cfg.train.steps, "; raise train.steps to continue"));
      if (!s.compressor_note.empty()) rep.info("warning: " + s.compressor_note);
      rep.info("resumed from " + (c.memory ? c.name + " (" + c.dir + ")" : c.dir) + " at step " + std::to_string(step) +
               (c.whole ? " (whole-model checkpoint)" : [&] {
                 const std::string from = shard_layout(c.dir), here = layout_text(cfg.parallel);
                 return from == here ? std::string() : " (resharded from " + from + " to " + here + ")";
               }()));
      return step;
    }
    const std::string why = (f->rank == rank || !group ? "" : "rank " + std::to_string(f->rank) + ": ") + f->message;
    // Damage is skipped in auto mode; a different model, or --resume DIR, stops here.
    if (!is_auto || f->kind == Error::Kind::kConfig) {
      if (mine) std::rethrow_exception(mine);
      throw Error("--resume: rank " + std::to_string(f->rank) + " could not load its part of " + c.dir + ": " +
                  f->message, f->kind);
    }
    rep.info("resume auto: skipping " + c.name + ": " + why);
    skipped += "\n  " + c.name + ": " + why;
  }
  throw Error("--resume auto: no checkpoint in " + where + " loads:" + skipped +
              "\nrepair or remove them, or start a fresh run in another checkpoint.dir");
}

}  // namespace loom
