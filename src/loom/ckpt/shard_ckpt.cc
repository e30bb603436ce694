// Saving sharded checkpoints (Note [Sharded checkpoints] in shard_ckpt.h); loading and
// resharding are in shard_load.cc.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>

#include "loom/comm/group.h"
#include "loom/comm/mesh.h"
#include "loom/core/error.h"
#include "loom/core/liveness.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/comm/agree.h"
#include "loom/ckpt/run_dir.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error("checkpoint: cannot open '" + path + "' to sync it");
  const liveness::Waiting waiting;  // a slow disk is not a hung rank (Note [Heartbeats])
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("checkpoint: fsync of '" + path + "' failed");
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("checkpoint: cannot read '" + path + "'");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Keeps the newest `keep` complete steps (0: all) and never `newest`; removes only steps
// whose manifest proves them loom's, and only what the manifest names
// (Note [Checkpoint directory ownership]).
void prune(const std::string& root, int64_t keep, int64_t newest) {
  if (keep <= 0) return;  // keep all: no need to read the steps
  const DirSurvey s = survey_dir(root);
  if (int64_t(s.steps.size()) <= keep) return;
  for (size_t i = 0; i + size_t(keep) < s.steps.size(); ++i)
    if (s.steps[i] != newest && !remove_step(root, s.steps[i]))
      std::fprintf(stderr, "loom: keep_last: left %s/%s: it holds entries loom did not write\n", root.c_str(),
                   shard::step_name(s.steps[i]).c_str());
}

// Note [Failpoints]
// LOOM_FAILPOINT=POINT@STEP:RANK makes global rank RANK kill itself with SIGKILL at POINT
// of the save of step STEP, so tests and scripts/soak.py can kill a writer at an exact
// moment: shard (its rank file half written), manifest (rank 0: manifest written, the
// directory not yet renamed into place), latest (rank 0: renamed, `latest` not yet
// replaced). Unset, nothing happens. The points hang and busy act at the start of a step
// instead (liveness::enter_step in core/liveness.h).
void failpoint(const char* point, int64_t step, int rank) {
  const char* spec = std::getenv("LOOM_FAILPOINT");
  if (!spec) return;
  char name[32] = {};
  long long at_step = -1;
  int at_rank = -1;
  if (std::sscanf(spec, "%31[a-z]@%lld:%d", name, &at_step, &at_rank) != 3) return;
  if (std::strcmp(name, point) != 0 || at_step != step || at_rank != rank) return;
  std::fprintf(stderr, "loom: LOOM_FAILPOINT %s: rank %d kills itself in the save of step %lld\n", spec, rank, at_step);
  std::fflush(stderr);
  ::raise(SIGKILL);
}

}  // namespace

namespace shard {

RankFile write_rank_file(const std::string& dir, int rank, const std::vector<Tensor>& table, const ShardState& s,
                         const std::function<void()>& mid_write) {
  RankFile rf;
  rf.file = rank_file_name(rank);
  rf.pieces = pieces_of(table, *s.layout, s.param_ranges, s.moment_ranges, s.params_packed);
  const std::span<const float> sections[kSections] = {s.params, s.m, s.v};
  int64_t start[kSections] = {kHeaderBytes, 0, 0};
  for (int i = 0; i < kSections; ++i) {
    rf.floats[i] = int64_t(sections[i].size());
    if (i > 0) start[i] = start[i - 1] + 4 * rf.floats[i - 1];
  }
  for (Piece& p : rf.pieces)
    p.crc = crc_of(sections[p.section].data() + (p.byte_offset - start[p.section]) / 4, size_t(p.count));
  const std::string path = (fs::path(dir) / rf.file).string();
  require_free_space(dir, double(start[kSections - 1]) + 4.0 * double(rf.floats[kSections - 1]),
                     "checkpoint: rank " + std::to_string(rank) + "'s file",
                     "free space, lower checkpoint.keep_last, or set checkpoint.dir on another file system");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(kMagic, sizeof kMagic);
  f.write(reinterpret_cast<const char*>(rf.floats), sizeof rf.floats);
  for (int i = 0; i < kSections; ++i) {
    f.write(reinterpret_cast<const char*>(sections[i].data()), std::streamsize(sections[i].size() * sizeof(float)));
    if (i == 0 && mid_write) {
      f.flush();
      mid_write();
    }
  }
  if (!f.flush()) throw Error("checkpoint: cannot write '" + path + "' (disk full?)");
  f.close();
  fsync_path(path, false);
  return rf;
}

int64_t agreed_optimizer_steps(const Config& cfg, const ShardState& s, comm::Group* world) {
  // From the ranks that step it (a parameter-server job's workers hold no optimizer: Note
  // [Parameter server]).
  if (!world || cfg.parallel.ps_servers == 0) return s.optimizer_steps;
  double most[1] = {double(s.optimizer_steps)};
  world->all_reduce(std::span<double>(most, 1), comm::ReduceOp::kMax);
  return int64_t(most[0]);
}

Manifest manifest_of(const Config& cfg, int64_t step, int64_t optimizer_steps, const ShardState& s,
                     std::vector<RankFile> ranks) {
  Manifest m;
  m.step = step, m.optimizer_steps = optimizer_steps, m.config = cfg, m.tensors = tensor_table(cfg);
  m.loss_scale = s.loss_scale;
  if (!s.compressor.empty()) m.compressor_signature = s.compressor_signature;
  m.ranks = std::move(ranks);
  for (size_t r = 0; r < m.ranks.size(); ++r) {
    const std::vector<int> c = rank_coords(cfg.parallel, int(r));
    m.ranks[r].pp_rank = c[0], m.ranks[r].dp_rank = c[1], m.ranks[r].tp_rank = c[2];
  }
  return m;
}

void publish(const std::string& root, owned::TempDir& tmp, const Manifest& m, int64_t keep_last,
             const std::function<void(const char*)>& at) {
  const std::string name = step_name(m.step);
  write_file_atomic((fs::path(tmp.path()) / "manifest.json").string(), manifest_json(m));
  fsync_path(tmp.path(), true);
  if (at) at("manifest");
  const fs::path dest = fs::path(root) / name;
  // A run resumed from an older step reaches a step it saved before: the earlier copy is
  // moved aside, never deleted (Note [Checkpoint directory ownership]).
  if (owned::kind_of(dest.string()) != owned::Kind::kNone) set_aside(root, {name});
  tmp.publish(dest.string());
  fsync_path(root, true);
  if (at) at("latest");
  // `latest` is replaced only when it is loom's (the survey under the run's lock said so,
  // or it is absent); a user's file of that name was refused before the first step.
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  prune(root, keep_last, m.step);
}

}  // namespace shard

namespace {
void save_into(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank,
               const std::string& root, owned::TempDir* made);
}  // namespace

void save_shards(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank) {
  // Rank 0 makes the step's marked temporary directory (Note [Ownership by content]) and
  // holds it: if the save fails anywhere, every rank agrees so and its destructor removes
  // it; the earlier steps and `latest` are untouched.
  std::unique_ptr<owned::TempDir> made;
  std::exception_ptr error;
  if (global_rank == 0) try {
      fs::create_directories(cfg.checkpoint.dir);
      made = std::make_unique<owned::TempDir>(cfg.checkpoint.dir, shard::step_name(step));
    } catch (...) {
      error = std::current_exception();
    }
  agree_or_throw(world, global_rank, error);  // every rank learns the outcome
  save_into(cfg, step, s, world, global_rank, cfg.checkpoint.dir, made.get());
}

namespace {

// The temporary directory's name on every rank: rank 0's token, broadcast.
std::string agreed_temp_dir(const std::string& root, int64_t step, comm::Group* world, const owned::TempDir* made) {
  int64_t token = made ? int64_t(std::stoull(made->token(), nullptr, 16)) : 0;
  if (world) world->broadcast(std::span<int64_t>(&token, 1), 0).wait();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(token));
  return (fs::path(root) / owned::temp_name(shard::step_name(step), hex)).string();
}

void save_into(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank,
               const std::string& root, owned::TempDir* made) {
  const int world_size = world ? world->size() : 1;
  std::exception_ptr error;
  const std::string tmp = agreed_temp_dir(root, step, world, made);
  const std::vector<shard::Tensor> table = shard::tensor_table(cfg);
  const std::string side = (fs::path(tmp) / ("rank-" + std::to_string(global_rank) + ".json")).string();
  try {
    const shard::RankFile rf =
        shard::write_rank_file(tmp, global_rank, table, s, [&] { failpoint("shard", step, global_rank); });
    if (!s.compressor.empty()) write_compressor_file(tmp, global_rank, s.compressor);
    write_file_atomic(side, shard::rank_json(rf));
  } catch (...) {
    error = std::current_exception();
  }
  agree_or_throw(world, global_rank, error);
  const int64_t optimizer_steps = shard::agreed_optimizer_steps(cfg, s, world);
  if (global_rank == 0) try {
      std::vector<shard::RankFile> ranks;
      for (int r = 0; r < world_size; ++r) {
        const std::string path = (fs::path(tmp) / ("rank-" + std::to_string(r) + ".json")).string();
        ranks.push_back(shard::parse_rank(read_text(path), path));
        fs::remove(path);
      }
      const shard::Manifest m = shard::manifest_of(cfg, step, optimizer_steps, s, std::move(ranks));
      shard::publish(root, *made, m, cfg.checkpoint.keep_last, [&](const char* point) { failpoint(point, step, 0); });
    } catch (...) {
      error = std::current_exception();
    }
  agree_or_throw(world, global_rank, error);
}

}  // namespace

std::optional<std::string> resolve_step_dir(const std::string& where) {
  if (fs::exists(fs::path(where) / "manifest.json")) return where;
  const std::string latest_path = (fs::path(where) / "latest").string();
  if (owned::kind_of(latest_path) == owned::Kind::kNone) return std::nullopt;
  std::istringstream latest(owned::read_regular(latest_path, 4096, false));  // never a FIFO or a symlink
  std::string name;
  if (!(latest >> name)) return std::nullopt;
  // `latest` names a step directory beside it, nothing else; what it holds is shown
  // escaped and cut short (it may be any bytes).
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
    std::string shown;
    for (size_t i = 0; i < name.size() && i < 40; ++i) {
      const unsigned char c = static_cast<unsigned char>(name[i]);
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : std::string(hex);
    }
    if (name.size() > 40) shown += "...";
    throw Error("checkpoint: '" + (fs::path(where) / "latest").string() + "' holds '" + shown +
                "', not a step name; remove the file (the step directories beside it are untouched)");
  }
  const fs::path dir = fs::path(where) / name;
  if (!fs::exists(dir / "manifest.json"))
    throw Error("checkpoint: '" + (fs::path(where) / "latest").string() + "' names " + name +
                ", which has no manifest.json; remove the file to start over");
  return dir.string();
}

}  // namespace loom
