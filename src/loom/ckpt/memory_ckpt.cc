// In-memory checkpoints on the job's hosts (Note [In-memory checkpoints] in memory_ckpt.h).
#include "loom/ckpt/memory_ckpt.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <vector>

#include "loom/ckpt/compressor_state.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"
#include "loom/comm/agree.h"
#include "loom/comm/group.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/hosts.h"
#include "loom/core/owned.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMarkerFile = "loom-memory";
constexpr const char* kManifest = "manifest.json";
constexpr size_t kChunk = size_t(1) << 28;  // bytes a message carries (a count is an int)
constexpr int kTagBase = 7100;

std::string job_dir(const Config& cfg) { return fs::absolute(cfg.checkpoint.dir).lexically_normal().string(); }
std::string marker_line(const Config& cfg) { return "loom-memory-v1 " + job_dir(cfg) + "\n"; }

// The ranks of a group by host: hosts in order of first appearance.
struct Hosts {
  std::vector<std::string> of;          // per group rank
  std::vector<int> index;               // per group rank: its host's index
  std::vector<std::vector<int>> ranks;  // per host: its group ranks, ascending
  bool leads(int r) const { return ranks[size_t(index[size_t(r)])].front() == r; }
  int leader(int host) const { return ranks[size_t(host)].front(); }
  // The rank that keeps r's copy: the same index on the next host (-1: one host).
  int peer(int r) const {
    if (ranks.size() < 2) return -1;
    const std::vector<int>& mine = ranks[size_t(index[size_t(r)])];
    const size_t at = size_t(std::find(mine.begin(), mine.end(), r) - mine.begin());
    const std::vector<int>& next = ranks[(size_t(index[size_t(r)]) + 1) % ranks.size()];
    return next[at % next.size()];
  }
};

Hosts hosts_of(comm::Group* g) {
  Hosts h;
  const int n = g ? g->size() : 1;
  for (int r = 0; r < n; ++r) {
    std::string name = this_host();
    if (g) {
      const std::vector<std::string>& named = g->world().hosts();
      const size_t global = size_t(g->global_rank_of(r));
      name = global < named.size() ? named[global] : "localhost";
    }
    auto it = std::find_if(h.ranks.begin(), h.ranks.end(), [&](const std::vector<int>& on) {
      return h.of[size_t(on.front())] == name;
    });
    h.of.push_back(name);
    if (it == h.ranks.end()) {
      h.index.push_back(int(h.ranks.size()));
      h.ranks.push_back({r});
    } else {
      h.index.push_back(int(it - h.ranks.begin()));
      it->push_back(r);
    }
  }
  return h;
}

// Proves the store at `path` this job's by its marker (or, `create`, makes it); false when
// absent and not created. Anything else at the path is refused, never touched.
bool open_store(const Config& cfg, const std::string& path, bool create) {
  const owned::Kind k = owned::kind_of(path);
  if (k == owned::Kind::kNone) {
    if (!create) return false;
    if (owned::kind_of(cfg.checkpoint.memory_dir) != owned::Kind::kDir)
      throw ConfigError("checkpoint.memory_dir = '" + cfg.checkpoint.memory_dir +
                        "' is not a directory on this host; set it to a memory file system every host has (/dev/shm)");
    std::error_code ec;
    fs::create_directory(path, ec);
    if (ec) throw Error("checkpoint.memory_dir: cannot make '" + path + "': " + ec.message());
    write_file_atomic((fs::path(path) / kMarkerFile).string(), marker_line(cfg));
    return true;
  }
  std::string text;
  if (k == owned::Kind::kDir) try {
      text = owned::read_regular((fs::path(path) / kMarkerFile).string(), 4096, false);
    } catch (const Error&) {
    }
  if (text != marker_line(cfg))
    throw ConfigError("checkpoint.memory_dir: '" + path + "' is " +
                      (k == owned::Kind::kDir ? "a directory without this job's marker (" + std::string(kMarkerFile) +
                                                    " naming " + job_dir(cfg) + ")"
                                              : std::string(owned::kind_text(k))) +
                      ", not this job's in-memory store; loom touches only what it wrote: remove it, or set "
                      "checkpoint.memory_dir elsewhere");
  return true;
}

// The step directories of a proven store, by step.
std::map<int64_t, fs::path> store_steps(const std::string& store) {
  std::map<int64_t, fs::path> out;
  for (const fs::directory_entry& e : fs::directory_iterator(store)) {
    const std::string name = e.path().filename().string();
    long long step = -1;
    char tail = 0;
    if (owned::kind_of(e.path().string()) == owned::Kind::kDir && name.size() == 13 &&
        std::sscanf(name.c_str(), "step-%8lld%c", &step, &tail) == 1 && step >= 0)
      out[step] = e.path();
  }
  return out;
}

// Removes the steps of a proven store that `drop` selects.
template <typename Drop>
void clear_steps(const std::string& store, Drop drop) {
  for (const auto& [step, dir] : store_steps(store))
    if (drop(step)) fs::remove_all(dir);
}

// "step file bytes" lines: the whole files of a proven store (a file of loom's form only).
std::string list_store(const std::string& store) {
  std::ostringstream os;
  for (const auto& [step, dir] : store_steps(store))
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      const bool ours = name == kManifest || (name.size() == 14 && name.rfind("rank-", 0) == 0) ||
                        (name.size() == 18 && name.rfind("compress-", 0) == 0);
      if (ours && owned::kind_of(e.path().string()) == owned::Kind::kFile)
        os << step << " " << name << " " << fs::file_size(e.path()) << "\n";
    }
  return os.str();
}

std::vector<std::string> gather_text(comm::Group* g, const std::string& mine) {
  if (!g || g->size() == 1) return {mine};
  const int64_t len = int64_t(mine.size());
  std::vector<int64_t> lens(size_t(g->size()));
  g->all_gather(std::span<const int64_t>(&len, 1), std::span<int64_t>(lens)).wait();
  const size_t most = size_t(std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end())));
  std::vector<uint8_t> padded(most, 0), all(most * lens.size());
  std::copy(mine.begin(), mine.end(), padded.begin());
  g->all_gather(std::span<const uint8_t>(padded), std::span<uint8_t>(all)).wait();
  std::vector<std::string> out;
  for (size_t r = 0; r < lens.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data() + r * most), size_t(lens[r]));
  return out;
}

std::string broadcast_text(comm::Group* g, std::string text, int root) {
  if (!g || g->size() == 1) return text;
  int64_t len = int64_t(text.size());
  g->broadcast(std::span<int64_t>(&len, 1), root).wait();
  text.resize(size_t(len));
  std::vector<uint8_t> bytes(text.begin(), text.end());
  if (len > 0) g->broadcast(std::span<uint8_t>(bytes), root).wait();
  return std::string(bytes.begin(), bytes.end());
}

// A store file mapped whole, so that a copy goes from one host's memory to the other's with no
// buffer between: read-only (a file to send), or made `size` bytes long as `path`.part to be
// received into and renamed into place by keep() (so a name present is a whole file).
class Mapped {
 public:
  Mapped(const std::string& path, size_t size, bool make) : path_(path), size_(size), make_(make) {
    const std::string at = make ? path + ".part" : path;
    fd_ = make ? ::open(at.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644)
               : ::open(at.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd_ < 0) throw Error("in-memory checkpoint: cannot open '" + at + "': " + std::strerror(errno));
    if (!make) size_ = size_t(::lseek(fd_, 0, SEEK_END));
    if (make && ::ftruncate(fd_, off_t(size_)) != 0)
      throw Error("in-memory checkpoint: '" + at + "' cannot hold " + std::to_string(size_) + " bytes (" +
                  std::strerror(errno) + "); checkpoint.memory_dir needs room for two steps of a host's shards");
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, make ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw Error("in-memory checkpoint: cannot map '" + at + "': " + std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
  }
  ~Mapped() {
    if (data_) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
    if (make_ && !kept_) ::unlink((path_ + ".part").c_str());
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  std::span<uint8_t> bytes() { return {data_, data_ ? size_ : 0}; }
  void keep() {
    fs::rename(path_ + ".part", path_);
    kept_ = true;
  }

 private:
  std::string path_;
  size_t size_ = 0;
  bool make_ = false, kept_ = false;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
};

// The ops moving `bytes` to or from `peer`, in messages of at most kChunk bytes; tags from
// `tag` up, so two files between one pair of ranks are told apart.
void add_ops(std::vector<comm::P2POp>& ops, bool send, std::span<uint8_t> bytes, int peer, int tag) {
  for (size_t at = 0, i = 0; at < bytes.size(); at += kChunk, ++i) {
    const std::span<uint8_t> part = bytes.subspan(at, std::min(kChunk, bytes.size() - at));
    ops.push_back(send ? comm::isend_op(std::span<const uint8_t>(part), peer, tag + 2 * int(i))
                       : comm::irecv_op(part, peer, tag + 2 * int(i)));
  }
}

void run_ops(comm::Group* g, std::vector<comm::P2POp> ops) {
  if (g && !ops.empty()) g->batch(std::move(ops)).wait();
}

// Writes this rank's files into `dir` through a staging directory, so that a name present is a
// whole file; returns their names (the rank file, the compressor file or "") and piece table.
std::pair<std::string, std::string> write_own(const Config& cfg, const ShardState& s, int r, const fs::path& dir,
                                              std::string& table) {
  const fs::path stage = dir / (".staging-" + std::to_string(r));
  fs::remove_all(stage);
  fs::create_directory(stage);
  const shard::RankFile rf = shard::write_rank_file(stage.string(), r, shard::tensor_table(cfg), s);
  std::pair<std::string, std::string> names{rf.file, ""};
  fs::rename(stage / rf.file, dir / rf.file);
  if (!s.compressor.empty()) {
    names.second = compressor_file_name(r);
    write_compressor_file(stage.string(), r, s.compressor);
    fs::rename(stage / names.second, dir / names.second);
  }
  fs::remove(stage);
  table = shard::rank_json(rf);
  return names;
}

template <typename F>
void agreed(comm::Group* g, F&& work) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  agree_or_throw(g, g ? g->group_rank() : 0, error);
}

}  // namespace

std::string memory_store_path(const Config& cfg, const std::string& host) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a, 64 bits, of the absolute checkpoint.dir
  for (const unsigned char c : job_dir(cfg)) hash = (hash ^ c) * 1099511628211ull;
  std::string safe = host;
  for (char& c : safe)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return (fs::path(cfg.checkpoint.memory_dir) / ("loom-memory-" + std::string(hex) + "-" + safe)).string();
}

// The copies of one save on their way: this rank's files going to its peer, its peers'
// coming into its store (renamed into place once all have arrived).
struct MemorySaver::InFlight {
  int64_t step = 0;
  std::vector<std::unique_ptr<Mapped>> own, kept;
  comm::Work work;
  bool arrived = false;
};

MemorySaver::MemorySaver(const Config& cfg, comm::World* world) : cfg_(cfg), world_(world) {
  if (!world_ || world_->world_size() == 1) return;
  std::vector<int> all(size_t(world_->world_size()));
  for (size_t r = 0; r < all.size(); ++r) all[r] = int(r);
  group_ = world_->group({all}, "memory-checkpoints");  // the copies' own queue, beside training's
}

MemorySaver::~MemorySaver() {
  if (!flight_) return;
  try {  // the mappings outlive the transfer
    flight_->work.wait();
  } catch (...) {
  }
}

void MemorySaver::poll() {
  if (!flight_ || flight_->arrived || !flight_->work.done()) return;
  try {
    flight_->work.wait();
    for (const std::unique_ptr<Mapped>& m : flight_->kept) m->keep();
    flight_->arrived = true;
  } catch (...) {  // said on every rank at the next save or the end (complete)
  }
}

void MemorySaver::complete() {
  comm::Group* world = world_ ? &world_->world_group() : nullptr;
  const Hosts h = hosts_of(world);
  const int r = world ? world->group_rank() : 0;
  std::exception_ptr error;
  if (flight_ && !flight_->arrived) try {
      flight_->work.wait();
      for (const std::unique_ptr<Mapped>& m : flight_->kept) m->keep();
      flight_->arrived = true;
    } catch (...) {
      error = std::current_exception();
    }
  const int64_t step = flight_ ? flight_->step : -1;
  flight_.reset();
  agree_or_throw(world, r, error);
  // Every store holds `step` whole: the older ones go.
  if (step >= 0 && h.leads(r))
    clear_steps(memory_store_path(cfg_, h.of[size_t(r)]), [&](int64_t m) { return m < step; });
}

void MemorySaver::finish(bool drop) {
  complete();
  if (drop) drop_memory(cfg_, world_ ? &world_->world_group() : nullptr);
}

void MemorySaver::save(int64_t step, const ShardState& s) {
  complete();
  comm::Group* world = world_ ? &world_->world_group() : nullptr;
  const Hosts h = hosts_of(world);
  const int r = world ? world->group_rank() : 0, n = int(h.of.size());
  const std::string store = memory_store_path(cfg_, h.of[size_t(r)]);
  const fs::path dir = fs::path(store) / shard::step_name(step);
  // The host's first rank proves the store and clears what a save of this step or a later
  // one left (a job resumed from an older step).
  agreed(world, [&] {
    if (!h.leads(r)) return;
    open_store(cfg_, store, true);
    clear_steps(store, [&](int64_t m) { return m >= step; });
    fs::create_directory(dir);
  });
  auto f = std::make_unique<InFlight>();
  f->step = step;
  // Every rank writes its own files; one all-gather brings every rank's outcome, piece table
  // and file sizes to every rank ("E<error>" for a failure).
  std::string said;
  try {
    std::string table;
    const auto [bin, comp] = write_own(cfg_, s, r, dir, table);
    f->own.push_back(std::make_unique<Mapped>((dir / bin).string(), 0, false));
    if (!comp.empty()) f->own.push_back(std::make_unique<Mapped>((dir / comp).string(), 0, false));
    said = std::to_string(f->own[0]->bytes().size()) + " " +
           std::to_string(f->own.size() > 1 ? f->own[1]->bytes().size() : 0) + " " + table;
  } catch (const std::exception& e) {
    said = std::string("E") + e.what();
  }
  const std::vector<std::string> all = gather_text(world, said);
  std::vector<int64_t> bin(static_cast<size_t>(n)), comp(static_cast<size_t>(n));
  std::vector<shard::RankFile> ranks;
  for (int q = 0; q < n; ++q) {
    const std::string& t = all[size_t(q)];
    if (t.rfind('E', 0) == 0) throw Error("in-memory checkpoint of step " + std::to_string(step) + ": rank " +
                                          std::to_string(q) + " on host " + h.of[size_t(q)] + ": " + t.substr(1));
    std::istringstream in(t);
    in >> bin[size_t(q)] >> comp[size_t(q)];
    ranks.push_back(shard::parse_rank(t.substr(size_t(in.tellg()) + 1), "rank " + std::to_string(q) + "'s pieces"));
  }
  // Every host's first rank writes the manifest (every rank has every piece table); each
  // rank's files go to its peer on the next host in the background, received straight into
  // the peer's store (a step is whole where all its files are: Note [In-memory checkpoints]).
  const int64_t optimizer_steps = shard::agreed_optimizer_steps(cfg_, s, world);
  std::vector<comm::P2POp> ops;
  agreed(world, [&] {
    if (h.leads(r))
      write_file_atomic((dir / kManifest).string(),
                        shard::manifest_json(shard::manifest_of(cfg_, step, optimizer_steps, s, std::move(ranks))));
    if (const int peer = h.peer(r); peer >= 0)
      for (size_t i = 0; i < f->own.size(); ++i) add_ops(ops, true, f->own[i]->bytes(), peer, kTagBase + int(i));
    for (int q = 0; q < n; ++q)
      if (q != r && h.peer(q) == r) {
        f->kept.push_back(std::make_unique<Mapped>((dir / shard::rank_file_name(q)).string(), size_t(bin[size_t(q)]), true));
        add_ops(ops, false, f->kept.back()->bytes(), q, kTagBase);
        if (comp[size_t(q)] == 0) continue;
        f->kept.push_back(
            std::make_unique<Mapped>((dir / compressor_file_name(q)).string(), size_t(comp[size_t(q)]), true));
        add_ops(ops, false, f->kept.back()->bytes(), q, kTagBase + 1);
      }
  });
  comm::CallOptions background;
  background.async = background.lazy = true;
  if (group_ && !ops.empty()) f->work = group_->batch(std::move(ops), background);
  flight_ = std::move(f);
}

namespace {

struct Copy {
  int64_t bytes = 0;
  std::vector<int> hosts;  // the hosts holding it, ascending
};
using StepFiles = std::map<std::string, Copy>;

std::map<int64_t, StepFiles> parse_listings(const Hosts& h, const std::vector<std::string>& listings) {
  std::map<int64_t, StepFiles> held;
  for (size_t host = 0; host < h.ranks.size(); ++host) {
    std::istringstream in(listings[size_t(h.leader(int(host)))]);
    int64_t step = 0, bytes = 0;
    std::string name;
    while (in >> step >> name >> bytes) {
      Copy& c = held[step][name];
      c.bytes = bytes;
      c.hosts.push_back(int(host));
    }
  }
  return held;
}

// The step's manifest, read by the first host holding it and broadcast; nullopt when it
// does not parse or names a file no running host holds (the same verdict on every rank).
bool whole_step(comm::Group* world, const Hosts& h, const Config& cfg, int64_t step, const StepFiles& files) {
  const auto m = files.find(kManifest);
  if (m == files.end()) return false;
  const int root = h.leader(m->second.hosts.front());
  const int r = world ? world->group_rank() : 0;
  std::string text;
  if (r == root) try {
      text = read_file_bytes((fs::path(memory_store_path(cfg, h.of[size_t(r)])) / shard::step_name(step) /
                              kManifest).string());
    } catch (const Error&) {
    }
  text = broadcast_text(world, text, root);
  try {
    const shard::Manifest parsed = shard::parse_manifest(text, "the in-memory manifest of step " + std::to_string(step));
    return parsed.step == step && std::all_of(parsed.ranks.begin(), parsed.ranks.end(), [&](const shard::RankFile& f) {
             return files.count(f.file) > 0;
           });
  } catch (const Error&) {
    return false;
  }
}

// Every host lacking a file of the step gets it from a holder, host to host in the order of
// (file, host) pairs, the holders taking turns; returns the bytes this host received. An
// error is kept in `error` (the caller agrees on it) and the rank still takes part in every
// transfer (sending zeros, receiving into a buffer), so its partner never waits.
int64_t fetch_missing(comm::Group* world, const Hosts& h, const fs::path& dir, const StepFiles& files,
                      std::exception_ptr& error) {
  const int r = world ? world->group_rank() : 0, mine = h.index[size_t(r)];
  int64_t copied = 0;
  size_t turn = 0;
  for (const auto& [name, copy] : files)
    for (int host = 0; host < int(h.ranks.size()); ++host) {
      if (std::binary_search(copy.hosts.begin(), copy.hosts.end(), host)) continue;
      const int from = copy.hosts[turn++ % copy.hosts.size()];
      if (!h.leads(r) || (mine != from && mine != host)) continue;
      std::unique_ptr<Mapped> file;
      try {
        file = std::make_unique<Mapped>((dir / name).string(), size_t(copy.bytes), mine != from);
        if (file->bytes().size() != size_t(copy.bytes)) throw Error("'" + (dir / name).string() + "' changed size");
      } catch (...) {
        if (!error) error = std::current_exception();
        file.reset();
      }
      std::vector<uint8_t> spare(file ? 0 : size_t(copy.bytes));
      std::vector<comm::P2POp> ops;
      add_ops(ops, mine == from, file ? file->bytes() : std::span<uint8_t>(spare), h.leader(mine == from ? host : from),
              kTagBase);
      run_ops(world, std::move(ops));
      if (mine == host && file) try {
          file->keep();
          copied += copy.bytes;
        } catch (...) {
          if (!error) error = std::current_exception();
        }
    }
  return copied;
}

}  // namespace

std::optional<MemoryStep> restore_memory(const Config& cfg, comm::Group* world) {
  const Hosts h = hosts_of(world);
  const int r = world ? world->group_rank() : 0;
  const std::string store = memory_store_path(cfg, h.of[size_t(r)]);
  std::string listing;
  agreed(world, [&] {
    if (h.leads(r) && open_store(cfg, store, false)) listing = list_store(store);
  });
  const std::map<int64_t, StepFiles> held = parse_listings(h, gather_text(world, listing));
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (!whole_step(world, h, cfg, it->first, it->second)) continue;
    const int64_t step = it->first;
    const fs::path dir = fs::path(store) / shard::step_name(step);
    MemoryStep out{step, dir.string(), 0, 0};
    std::vector<bool> holds(h.ranks.size(), false);
    for (const auto& [name, copy] : it->second)
      for (const int host : copy.hosts) holds[size_t(host)] = true;
    out.hosts = int(std::count(holds.begin(), holds.end(), true));
    agreed(world, [&] {
      if (h.leads(r) && open_store(cfg, store, true) && !fs::exists(dir)) fs::create_directory(dir);
    });
    std::exception_ptr error;
    out.copied_bytes = fetch_missing(world, h, dir, it->second, error);
    agree_or_throw(world, r, error);
    return out;
  }
  return std::nullopt;
}

bool drop_memory(const Config& cfg, comm::Group* world) {
  const Hosts h = hosts_of(world);
  const int r = world ? world->group_rank() : 0;
  bool dropped = false;
  agreed(world, [&] {
    const std::string store = memory_store_path(cfg, h.of[size_t(r)]);
    if (!h.leads(r) || !open_store(cfg, store, false)) return;
    dropped = true;
    clear_steps(store, [](int64_t) { return true; });
    fs::remove((fs::path(store) / kMarkerFile));
    std::error_code ec;
    fs::remove(store, ec);  // anything else left in it stays, with the directory
  });
  return dropped;
}

}  // namespace loom
