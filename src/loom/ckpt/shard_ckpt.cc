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
#include <sstream>

#include "loom/comm/group.h"
#include "loom/comm/mesh.h"
#include "loom/core/error.h"
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
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("checkpoint: fsync of '" + path + "' failed");
}

// Writes `text` to `path` through a temporary file and an atomic rename.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!(f << text) || !f.flush()) throw Error("checkpoint: cannot write '" + tmp + "' (disk full?)");
  }
  fsync_path(tmp, false);
  fs::rename(tmp, path);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("checkpoint: cannot read '" + path + "'");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Keeps the newest `keep` complete steps (0: all); removes older ones and stale temporaries.
void prune(const std::string& root, int64_t keep, const std::string& newest) {
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
      fs::remove_all(e.path());  // a save that never finished
      continue;
    }
    if (name.find('.') == std::string::npos) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  if (keep <= 0 || int64_t(steps.size()) <= keep) return;
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i)
    if (steps[i] != newest) fs::remove_all(fs::path(root) / steps[i]);
}

// Note [Failpoints]
// LOOM_FAILPOINT=POINT@STEP:RANK makes global rank RANK kill itself with SIGKILL at POINT
// of the save of step STEP, so tests and scripts/soak.py can kill a writer at an exact
// moment: shard (its rank file half written), manifest (rank 0: manifest written, the
// directory not yet renamed into place), latest (rank 0: renamed, `latest` not yet
// replaced). Unset, nothing happens.
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

void publish(const std::string& root, const std::string& tmp, const Manifest& m, int64_t keep_last,
             const std::function<void(const char*)>& at) {
  const std::string name = step_name(m.step);
  write_atomically((fs::path(tmp) / "manifest.json").string(), manifest_json(m));
  fsync_path(tmp, true);
  if (at) at("manifest");
  const fs::path dest = fs::path(root) / name;
  // A run resumed from an older step reaches a step it saved before: the earlier copy is
  // moved aside, never deleted (Note [Checkpoint directory ownership]).
  if (fs::exists(dest)) set_aside(root, {name});
  fs::rename(tmp, dest);
  fsync_path(root, true);
  if (at) at("latest");
  write_atomically((fs::path(root) / "latest").string(), name + "\n");
  prune(root, keep_last, name);
}

}  // namespace shard

namespace {
void save_into(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank,
               const std::string& root, const std::string& tmp);
}  // namespace

void save_shards(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank) {
  const std::string root = cfg.checkpoint.dir;
  const std::string tmp = (fs::path(root) / (shard::step_name(step) + ".tmp")).string();
  try {
    save_into(cfg, step, s, world, global_rank, root, tmp);
  } catch (...) {
    // Every rank has agreed the save failed: the unfinished step goes (a disk-full save
    // left it behind); the earlier steps and `latest` are untouched.
    std::error_code ec;
    if (global_rank == 0) fs::remove_all(tmp, ec);
    throw;
  }
}

namespace {

void save_into(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank,
               const std::string& root, const std::string& tmp) {
  const int world_size = world ? world->size() : 1;
  std::exception_ptr error;
  if (global_rank == 0) try {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    } catch (...) {
      error = std::current_exception();
    }
  agree_or_throw(world, global_rank, error);  // every rank learns the outcome
  const std::vector<shard::Tensor> table = shard::tensor_table(cfg);
  const std::string side = (fs::path(tmp) / ("rank-" + std::to_string(global_rank) + ".json")).string();
  try {
    const shard::RankFile rf =
        shard::write_rank_file(tmp, global_rank, table, s, [&] { failpoint("shard", step, global_rank); });
    if (!s.compressor.empty()) write_compressor_file(tmp, global_rank, s.compressor);
    write_atomically(side, shard::rank_json(rf));
  } catch (...) {
    error = std::current_exception();
  }
  agree_or_throw(world, global_rank, error);
  // The optimizer's step count, from the ranks that step it (a parameter-server job's
  // workers hold no optimizer: Note [Parameter server]).
  int64_t optimizer_steps = s.optimizer_steps;
  if (world && cfg.parallel.ps_servers > 0) {
    double most[1] = {double(optimizer_steps)};
    world->all_reduce(std::span<double>(most, 1), comm::ReduceOp::kMax);
    optimizer_steps = int64_t(most[0]);
  }
  if (global_rank == 0) try {
      shard::Manifest m;
      m.step = step, m.optimizer_steps = optimizer_steps, m.config = cfg, m.tensors = table;
      m.loss_scale = s.loss_scale;
      if (!s.compressor.empty()) m.compressor_signature = s.compressor_signature;
      for (int r = 0; r < world_size; ++r) {
        const std::string path = (fs::path(tmp) / ("rank-" + std::to_string(r) + ".json")).string();
        m.ranks.push_back(shard::parse_rank(read_text(path), path));
        const std::vector<int> c = shard::rank_coords(cfg.parallel, r);
        m.ranks.back().pp_rank = c[0], m.ranks.back().dp_rank = c[1], m.ranks.back().tp_rank = c[2];
        fs::remove(path);
      }
      shard::publish(root, tmp, m, cfg.checkpoint.keep_last, [&](const char* point) { failpoint(point, step, 0); });
    } catch (...) {
      error = std::current_exception();
    }
  agree_or_throw(world, global_rank, error);
}

}  // namespace

std::optional<std::string> resolve_step_dir(const std::string& where) {
  if (fs::exists(fs::path(where) / "manifest.json")) return where;
  std::ifstream latest(fs::path(where) / "latest");
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
