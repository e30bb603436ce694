#include "loom/train/shard_ckpt.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/comm/group.h"
#include "loom/core/error.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'S', 'H', 'R', 'D'};
constexpr const char* kFormat = "loom-sharded-v1";

uint32_t crc_of(const float* p, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = reinterpret_cast<const Bytef*>(p);
  size_t left = n * sizeof(float);
  while (left > 0) {
    const uInt chunk = uInt(std::min<size_t>(left, size_t(1) << 30));
    crc = crc32(crc, bytes, chunk);
    bytes += chunk, left -= chunk;
  }
  return uint32_t(crc);
}

std::string step_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
  return b;
}

std::string rank_file(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.bin", rank);
  return b;
}

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

nlohmann::json layout_of(const Config& c) {
  const ParallelConfig& p = c.parallel;
  return {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"vpp", p.vpp}, {"sp", p.sp}, {"zero", p.zero},
          {"pp_layers", p.pp_layers}, {"vocab_parallel", p.vocab_parallel}};
}

std::string layout_text(const nlohmann::json& l) {
  std::ostringstream os;
  os << "dp " << l.value("dp", 0) << " tp " << l.value("tp", 0) << " pp " << l.value("pp", 0) << " vpp "
     << l.value("vpp", 0) << " zero " << l.value("zero", 0) << (l.value("sp", false) ? " sp" : "");
  return os.str();
}

// Keeps the newest `keep` complete steps (0: all); removes older ones and stale temporaries.
void prune(const std::string& root, int64_t keep, const std::string& newest) {
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp" && name != newest + ".tmp") {
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

}  // namespace

void save_shards(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank) {
  const std::string root = cfg.checkpoint.dir, name = step_name(step);
  const std::string tmp = (fs::path(root) / (name + ".tmp")).string();
  const int world_size = world ? world->size() : 1;
  if (global_rank == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  if (world) world->barrier().wait();
  // This rank's file: magic, three float counts, then the sections.
  const std::vector<float>* sections[3] = {s.params, s.m, s.v};
  int64_t info[6] = {0, 0, 0, 0, 0, 0};  // counts, CRCs
  {
    const std::string path = (fs::path(tmp) / rank_file(global_rank)).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(kMagic, sizeof kMagic);
    for (int i = 0; i < 3; ++i) {
      info[i] = int64_t(sections[i]->size());
      info[3 + i] = crc_of(sections[i]->data(), sections[i]->size());
      f.write(reinterpret_cast<const char*>(&info[i]), sizeof(int64_t));
    }
    for (const auto* sec : sections) f.write(reinterpret_cast<const char*>(sec->data()), std::streamsize(sec->size() * sizeof(float)));
    if (!f.flush()) throw Error("checkpoint: cannot write '" + path + "' (disk full?)");
    f.close();
    fsync_path(path, false);
  }
  std::vector<int64_t> all(size_t(6 * world_size));
  if (world) world->all_gather(std::span<const int64_t>(info, 6), std::span<int64_t>(all)).wait();
  else std::copy(info, info + 6, all.begin());
  if (global_rank == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world_size; ++r) {
      const int64_t* x = all.data() + 6 * r;
      ranks.push_back({{"file", rank_file(r)}, {"floats", {{"params", x[0]}, {"m", x[1]}, {"v", x[2]}}},
                       {"crc32", {{"params", x[3]}, {"m", x[4]}, {"v", x[5]}}}});
    }
    const nlohmann::json manifest = {{"format", kFormat}, {"step", step}, {"optimizer_steps", s.optimizer_steps},
                                     {"world", world_size}, {"layout", layout_of(cfg)}, {"config", to_toml(cfg)},
                                     {"ranks", ranks}};
    write_atomically((fs::path(tmp) / "manifest.json").string(), manifest.dump(1));
    fsync_path(tmp, true);
    const fs::path dest = fs::path(root) / name;
    fs::remove_all(dest);
    fs::rename(tmp, dest);
    fsync_path(root, true);
    write_atomically((fs::path(root) / "latest").string(), name + "\n");
    prune(root, cfg.checkpoint.keep_last, name);
  }
  if (world) world->barrier().wait();
}

std::optional<std::string> resolve_step_dir(const std::string& where) {
  if (fs::exists(fs::path(where) / "manifest.json")) return where;
  std::ifstream latest(fs::path(where) / "latest");
  std::string name;
  if (!(latest >> name)) return std::nullopt;
  const fs::path dir = fs::path(where) / name;
  if (!fs::exists(dir / "manifest.json"))
    throw Error("checkpoint: '" + (fs::path(where) / "latest").string() + "' names " + name +
                ", which has no manifest.json; remove the file to start over");
  return dir.string();
}

namespace {

nlohmann::json read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  std::ifstream f(path);
  if (!f) throw Error("checkpoint: cannot read '" + path + "'");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error("checkpoint: '" + path + "' is not valid JSON: " + e.what());
  }
  if (m.value("format", "") != kFormat)
    throw Error("checkpoint: '" + path + "' has format '" + m.value("format", "") + "', expected " + kFormat);
  return m;
}

}  // namespace

int64_t load_shards(const std::string& step_dir, const Config& cfg, ShardState& s, int global_rank, int world_size) {
  const nlohmann::json m = read_manifest(step_dir);
  const nlohmann::json want = layout_of(cfg);
  if (m["layout"] != want || m.value("world", 0) != world_size)
    throw ConfigError("checkpoint " + step_dir + " was written by layout " + layout_text(m["layout"]) + " on " +
                      std::to_string(m.value("world", 0)) + " ranks, this run is " + layout_text(want) + " on " +
                      std::to_string(world_size) + " ranks; resume with the layout that wrote it (loading into another "
                      "layout comes with checkpoint resharding)");
  // The [model] section (first in to_toml) must match; the rest (lr, steps, ...) may change on resume.
  auto model_section = [](const Config& c) {
    const std::string t = to_toml(c);
    return t.substr(0, t.find("[data]"));
  };
  if (model_section(config_from_toml_string(m["config"].get<std::string>())) != model_section(cfg))
    throw ConfigError("checkpoint " + step_dir + " holds a different model ([model] in its manifest differs from "
                      "this run's)");
  const nlohmann::json& entry = m["ranks"].at(size_t(global_rank));
  const std::string path = (fs::path(step_dir) / entry["file"].get<std::string>()).string();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("checkpoint: cannot read '" + path + "'");
  char magic[8];
  int64_t counts[3];
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(counts), sizeof counts);
  if (!f || std::memcmp(magic, kMagic, 8) != 0) throw Error("checkpoint: '" + path + "' has no loom shard header");
  std::vector<float>* sections[3] = {s.params, s.m, s.v};
  const char* names[3] = {"params", "m", "v"};
  int64_t offset = 8 + int64_t(sizeof counts);
  for (int i = 0; i < 3; ++i) {
    const int64_t n = counts[i], bytes = n * int64_t(sizeof(float));
    if (n != int64_t(sections[i]->size()) || n != entry["floats"][names[i]].get<int64_t>())
      throw Error(detail::cat("checkpoint: '", path, "' section ", names[i], " holds ", n, " floats; this rank needs ",
                              sections[i]->size()));
    f.read(reinterpret_cast<char*>(sections[i]->data()), std::streamsize(bytes));
    if (!f) throw Error(detail::cat("checkpoint: '", path, "' is truncated in section ", names[i], " (bytes ", offset,
                                    "..", offset + bytes, ")"));
    if (int64_t(crc_of(sections[i]->data(), size_t(n))) != entry["crc32"][names[i]].get<int64_t>())
      throw Error(detail::cat("checkpoint: '", path, "' section ", names[i], " (bytes ", offset, "..", offset + bytes,
                              ") fails its CRC-32: the file is damaged"));
    offset += bytes;
  }
  s.optimizer_steps = m.value("optimizer_steps", int64_t(0));
  return m.value("step", int64_t(0));
}

std::string describe_shards(const std::string& where) {
  const std::optional<std::string> dir = resolve_step_dir(where);
  if (!dir) throw ConfigError("checkpoint: '" + where + "' holds no sharded checkpoint (no manifest.json or latest)");
  const nlohmann::json m = read_manifest(*dir);
  std::ostringstream os;
  os << *dir << ": " << m.value("format", "") << ", step " << m.value("step", 0) << ", optimizer steps "
     << m.value("optimizer_steps", 0) << "\nlayout " << layout_text(m["layout"]) << " on " << m.value("world", 0)
     << " ranks\n";
  for (const auto& r : m["ranks"])
    os << "  " << r["file"].get<std::string>() << ": params " << r["floats"]["params"] << " floats (crc32 "
       << r["crc32"]["params"] << "), m " << r["floats"]["m"] << ", v " << r["floats"]["v"] << "\n";
  return os.str();
}

}  // namespace loom
