// Loading sharded checkpoints into any layout (Note [Sharded checkpoints] in shard_ckpt.h):
// whole tensors assembled from the pieces, then cut to the loading rank's slice and shard.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/owned.h"
#include "loom/model/tp_slice.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/modes/ps/ps.h"
#include "loom/parallel/rank_plan.h"
#include "loom/ckpt/run_dir.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

using shard::Manifest;
using shard::Piece;

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  owned::require_regular(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("checkpoint: cannot read '" + path + "'");
  std::ostringstream os;
  os << f.rdbuf();
  return shard::parse_manifest(os.str(), path);
}

// Reads pieces out of a step directory's rank files, checking each one's CRC-32.
class PieceReader {
 public:
  PieceReader(std::string dir, const Manifest& m) : dir_(std::move(dir)), m_(m) {}

  void read(int rank, const Piece& p, float* dst) {
    std::ifstream& f = open(rank);
    const std::string path = path_of(rank);
    const std::string what = detail::cat("'", path, "' tensor ", m_.tensors[size_t(p.tensor)].name, " section ",
                                         shard::kSectionNames[p.section], " (bytes ", p.byte_offset, "..",
                                         p.byte_offset + 4 * p.count, ")");
    f.clear();
    f.seekg(std::streamoff(p.byte_offset));
    f.read(reinterpret_cast<char*>(dst), std::streamsize(4 * p.count));
    if (!f) throw Error("checkpoint: " + what + " is past the end of the file: it is truncated");
    if (shard::crc_of(dst, size_t(p.count)) != p.crc) throw Error("checkpoint: " + what + " fails its CRC-32: the file is damaged");
    bytes_ += 4 * p.count;
  }
  int64_t bytes_read() const { return bytes_; }

 private:
  std::string path_of(int rank) const { return (fs::path(dir_) / m_.ranks[size_t(rank)].file).string(); }
  std::ifstream& open(int rank) {
    auto it = files_.find(rank);
    if (it != files_.end()) return *it->second;
    const std::string path = path_of(rank);
    owned::require_regular(path);
    auto f = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*f) throw Error("checkpoint: cannot read '" + path + "'");
    char magic[8];
    int64_t floats[shard::kSections];
    f->read(magic, 8);
    f->read(reinterpret_cast<char*>(floats), sizeof floats);
    if (!*f || std::memcmp(magic, shard::kMagic, 8) != 0) throw Error("checkpoint: '" + path + "' has no loom shard header");
    for (int s = 0; s < shard::kSections; ++s)
      if (floats[s] != m_.ranks[size_t(rank)].floats[s])
        throw Error(detail::cat("checkpoint: '", path, "' section ", shard::kSectionNames[s], " holds ", floats[s],
                                " floats, its manifest says ", m_.ranks[size_t(rank)].floats[s]));
    return *files_.emplace(rank, std::move(f)).first->second;
  }

  std::string dir_;
  const Manifest& m_;
  std::map<int, std::unique_ptr<std::ifstream>> files_;
  int64_t bytes_ = 0;
};

// Whole tensors of one checkpoint, by tensor and section.
class WholeTensors {
 public:
  WholeTensors(const std::string& dir, const Manifest& m, int prefer_rank)
      : m_(m), reader_(dir, m), slices_(m.config), whole_(std::make_unique<ParamLayout>(m.config.model)) {
    // pieces_[tensor][section][slice]: (rank, piece), the preferred rank's first.
    pieces_.resize(m.tensors.size());
    for (size_t t = 0; t < m.tensors.size(); ++t)
      pieces_[t].assign(shard::kSections,
                        std::vector<std::vector<std::pair<int, int>>>(size_t(slices_.count(m.tensors[t]))));
    std::vector<int> order(m.ranks.size());
    for (size_t r = 0; r < order.size(); ++r) order[r] = int(r);
    if (prefer_rank >= 0 && prefer_rank < int(order.size())) std::rotate(order.begin(), order.begin() + prefer_rank, order.begin() + prefer_rank + 1);
    for (int r : order)
      for (size_t i = 0; i < m.ranks[size_t(r)].pieces.size(); ++i) {
        const Piece& p = m.ranks[size_t(r)].pieces[i];
        const int slice = slices_.of(m.tensors[size_t(p.tensor)], m.ranks[size_t(r)]);
        pieces_[size_t(p.tensor)][size_t(p.section)][size_t(slice)].push_back({r, int(i)});
      }
  }

  // Tensor `t`, section `sec`, in its whole shape (ParamLayout(model).at(name).shape).
  std::vector<float> whole(int t, int sec) {
    const std::string& name = m_.tensors[size_t(t)].name;
    const ParamSpec& w = whole_->at(name);
    std::vector<float> out(size_t(w.numel), 0.0f);
    const shard::Tensor& tensor = m_.tensors[size_t(t)];
    for (int slice = 0; slice < slices_.count(tensor); ++slice) {
      const ParamSpec& local = slices_.spec(tensor, slice);
      std::vector<float> buf(size_t(local.numel));
      std::vector<char> have(size_t(local.numel), 0);
      int64_t missing = local.numel;
      // A replicated tensor is one slice, which any rank's copy holds.
      for (auto [r, i] : pieces_[size_t(t)][size_t(sec)][size_t(slice)]) {
        const Piece& p = m_.ranks[size_t(r)].pieces[size_t(i)];
        if (std::all_of(have.begin() + p.local_offset, have.begin() + p.local_offset + p.count, [](char c) { return c; })) continue;
        std::vector<float> got(size_t(p.count));
        reader_.read(r, p, got.data());
        for (int64_t k = 0; k < p.count; ++k)
          if (!have[size_t(p.local_offset + k)]) {
            buf[size_t(p.local_offset + k)] = got[size_t(k)], have[size_t(p.local_offset + k)] = 1;
            --missing;
          }
        if (missing == 0) break;
      }
      if (missing > 0) {
        const int64_t first = std::find(have.begin(), have.end(), 0) - have.begin();
        throw Error(detail::cat("checkpoint: no rank file holds tensor ", name, " section ", shard::kSectionNames[sec],
                                " elements from ", first, " of slice ", slice, " (", missing, " floats missing)"));
      }
      const bool replicated = tensor.split_dim < 0;
      local_to_whole(local, w.shape, buf.data(), out.data(), replicated ? 1 : slices_.count(tensor),
                     replicated ? 0 : slice);
    }
    return out;
  }
  int index(const std::string& name) const {
    for (size_t i = 0; i < m_.tensors.size(); ++i)
      if (m_.tensors[i].name == name) return int(i);
    throw Error("checkpoint holds no tensor " + name);
  }
  int64_t bytes_read() const { return reader_.bytes_read(); }
  PieceReader& reader() { return reader_; }

 private:
  const Manifest& m_;
  PieceReader reader_;
  shard::Slices slices_;
  std::unique_ptr<ParamLayout> whole_;
  std::vector<std::vector<std::vector<std::vector<std::pair<int, int>>>>> pieces_;
};

// The tensors of a whole-model checkpoint (checkpoint.h), in the interface of
// WholeTensors: flat buffers over ParamLayout(model); absent moments read as zeros.
class FlatTensors {
 public:
  FlatTensors(const CheckpointData& ck) : ck_(ck), layout_(ck.config.model) {}
  int index(const std::string& name) const {
    const auto& specs = layout_.specs();
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == name) return int(i);
    throw Error("checkpoint holds no tensor " + name);
  }
  std::vector<float> whole(int t, int sec) const {
    const ParamSpec& spec = layout_.specs()[size_t(t)];
    const std::vector<float>* src = sec == 0 ? &ck_.params : sec == 1 ? (ck_.m ? &*ck_.m : nullptr) : (ck_.v ? &*ck_.v : nullptr);
    if (!src) return std::vector<float>(size_t(spec.numel), 0.0f);
    return std::vector<float>(src->begin() + spec.offset, src->begin() + spec.offset + spec.numel);
  }

 private:
  const CheckpointData& ck_;
  ParamLayout layout_;
};

// Fills `s` (its layout, slice and ranges) from the checkpoint's whole tensors.
template <class Source>
void fill(Source& src, const ModelConfig& model, ShardState& s) {
  const ParamLayout whole(model);
  for (const ParamSpec& spec : s.layout->specs()) {
    const int t = src.index(spec.name);
    const std::vector<int64_t>& shape = whole.at(spec.name).shape;
    std::vector<float> local(size_t(spec.numel));
    for (int sec = 0; sec < shard::kSections; ++sec) {
      const bool moments = sec > 0, packed = moments || s.params_packed;
      const std::vector<FlatRange>& ranges = moments ? s.moment_ranges : s.param_ranges;
      float* dst = moments ? (sec == 1 ? s.m : s.v).data() : s.params.data();
      bool loaded = false;
      int64_t q = 0;  // packed position of range r
      for (const FlatRange& r : ranges) {
        const int64_t lo = std::max(r.offset, spec.offset), hi = std::min(r.offset + r.count, spec.offset + spec.numel);
        if (hi > lo) {
          if (!loaded) {
            const std::vector<float> w = src.whole(t, sec);
            slice_to_local(spec, shape, w.data(), local.data(), s.tp, s.tp_rank);
            loaded = true;
          }
          std::copy(local.begin() + (lo - spec.offset), local.begin() + (hi - spec.offset),
                    dst + (packed ? q + (lo - r.offset) : lo));
        }
        q += r.count;
      }
    }
  }
}

void check_same_model(const Config& saved, const Config& cfg, const std::string& dir) {
  if (!same_model(saved, cfg))
    throw ConfigError("checkpoint " + dir + " holds a different model ([model] in its manifest differs from this run's)");
}

}  // namespace

std::string layout_text(const ParallelConfig& p) {
  return detail::cat("dp ", p.dp, " tp ", p.tp, " pp ", p.pp, " vpp ", p.vpp, " zero ", p.zero, p.sp ? " sp" : "",
                     p.pp_vocab ? " pp_vocab" : "",
                     p.ps_servers > 0 ? detail::cat(" + ", p.ps_servers, " parameter servers") : std::string(), " on ",
                     p.ranks(), " ranks");
}

std::string shard_layout(const std::string& step_dir) { return layout_text(read_manifest(step_dir).config.parallel); }

namespace {

// Note [Compressor state in checkpoints]: buffers that cannot be restored start at zero.
void reset_compressor(ShardState& s, const std::string& why) {
  if (s.compressor.empty()) return;
  for (const NamedBuffer& b : s.compressor) std::fill(b.data->begin(), b.data->end(), 0.0f);
  s.compressor_note = "gradient compressor state (error feedback, momentum, PowerSGD's Q) starts at zero: this run's is '" +
                      s.compressor_signature + "' and the checkpoint's " + why;
}

}  // namespace

int64_t load_shards(const std::string& step_dir, const Config& cfg, ShardState& s, int global_rank) {
  const Manifest m = read_manifest(step_dir);
  check_same_model(m.config, cfg, step_dir);
  WholeTensors src(step_dir, m, global_rank);
  fill(src, cfg.model, s);
  s.optimizer_steps = m.optimizer_steps;
  s.loss_scale = m.loss_scale;
  if (!s.compressor.empty() && m.compressor_signature == s.compressor_signature)
    read_compressor_file(step_dir, global_rank, s.compressor);
  else
    reset_compressor(s, m.compressor_signature.empty() ? "it saved none" : "it was saved under '" + m.compressor_signature + "'");
  return m.step;
}

int64_t load_whole_checkpoint(const std::string& dir, const Config& cfg, ShardState& s) {
  const CheckpointData ck = load_whole_files(dir);
  check_same_model(ck.config, cfg, dir);
  FlatTensors src(ck);
  fill(src, cfg.model, s);
  s.optimizer_steps = ck.m && ck.v ? ck.state.optimizer_steps : 0;
  reset_compressor(s, "a whole-model checkpoint holds none");
  return ck.state.step;
}

namespace {

// What rank r of `cfg` saves (Note [Sharded checkpoints]): its rank plan's ranges, or in a
// parameter-server layout (Note [Parameter server]) nothing on a worker and what the server
// saves of its shard's parameters and moments (ps_saved_ranges) on a server.
RankPlan ps_checkpoint_shape(const Config& cfg, int r) {
  RankPlan shape = plan_rank(cfg, r);
  if (cfg.parallel.ps_servers == 0) return shape;
  if (r < cfg.parallel.world()) shape.param_ranges.clear(), shape.moment_ranges.clear();
  else shape.param_ranges = shape.moment_ranges = ps_saved_ranges(shape, cfg.model);
  return shape;
}

}  // namespace

std::string convert_shards(const std::string& in, const std::string& out, const std::vector<std::string>& sets) {
  for (const std::string& s : sets)
    if (s.rfind("parallel.", 0) != 0 && s.rfind("train.grad_accum=", 0) != 0)
      throw ConfigError("ckpt convert: '" + s + "' is not a layout setting (parallel.* or train.grad_accum): "
                        "conversion changes the layout, never the model");
  const std::optional<std::string> dir = resolve_step_dir(in);
  if (!dir) throw ConfigError("ckpt convert: '" + in + "' holds no sharded checkpoint (no manifest.json or latest)");
  if (fs::exists(out) && fs::equivalent(out, in)) throw ConfigError("ckpt convert: --out must differ from --in");
  check_new_target(out, "ckpt convert: --out", false);
  const DirLock lock(out);
  remove_stale(check_new_target(out, "ckpt convert: --out", false));  // again, under the lock
  const Manifest m = read_manifest(*dir);
  const Config cfg = config_from_toml_string(to_toml(m.config), sets);
  const ParallelConfig& target = cfg.parallel;
  shard::Manifest outm;
  outm.step = m.step, outm.optimizer_steps = m.optimizer_steps, outm.config = cfg, outm.loss_scale = m.loss_scale;
  outm.tensors = shard::tensor_table(cfg);
  owned::TempDir made(out, shard::step_name(m.step));  // removed unless published
  const std::string& tmp = made.path();
  for (int r = 0; r < int(target.ranks()); ++r) {
    RankPlan shape = ps_checkpoint_shape(cfg, r);
    std::vector<float> params(size_t(shape.layout.total_floats()), 0.0f), mom_m, mom_v;
    int64_t packed = 0;
    for (const FlatRange& x : shape.moment_ranges) packed += x.count;
    mom_m.assign(size_t(packed), 0.0f), mom_v.assign(size_t(packed), 0.0f);
    ShardState s{&shape.layout, params, mom_m, mom_v, shape.param_ranges, shape.moment_ranges,
                 int(target.tp), shape.tp_rank, m.optimizer_steps, m.loss_scale};
    WholeTensors src(*dir, m, r);
    fill(src, cfg.model, s);
    outm.ranks.push_back(shard::write_rank_file(tmp, r, outm.tensors, s));
    const std::vector<int> c = shard::rank_coords(target, r);
    outm.ranks.back().pp_rank = c[0], outm.ranks.back().dp_rank = c[1], outm.ranks.back().tp_rank = c[2];
  }
  shard::publish(out, made, outm, 0);
  return (fs::path(out) / shard::step_name(m.step)).string();
}

WholeState load_whole(const std::string& where) {
  const std::optional<std::string> dir = resolve_step_dir(where);
  if (!dir) throw ConfigError("checkpoint: '" + where + "' holds no sharded checkpoint (no manifest.json or latest)");
  const Manifest m = read_manifest(*dir);
  WholeState w{m.config, {}, {}, {}, m.step, m.optimizer_steps};
  Config single = m.config;
  single.parallel = ParallelConfig{};
  const RankPlan shape = plan_rank(single, 0);
  w.params.assign(size_t(shape.layout.total_floats()), 0.0f);
  w.m = w.params, w.v = w.params;
  ShardState s{&shape.layout, w.params, w.m, w.v, shape.param_ranges, shape.moment_ranges, 1, 0, 0, {}};
  WholeTensors src(*dir, m, 0);
  fill(src, m.config.model, s);
  return w;
}

std::string describe_shards(const std::string& where, bool verify) {
  const std::optional<std::string> dir = resolve_step_dir(where);
  if (!dir) throw ConfigError("checkpoint: '" + where + "' holds no sharded checkpoint (no manifest.json or latest)");
  const Manifest m = read_manifest(*dir);
  std::ostringstream os;
  os << *dir << ": " << shard::kFormat << ", step " << m.step << ", optimizer steps " << m.optimizer_steps
     << "\nlayout " << layout_text(m.config.parallel) << "\n" << m.tensors.size() << " tensors:\n";
  for (const shard::Tensor& t : m.tensors) {
    os << "  " << t.name << " f32 [";
    for (size_t i = 0; i < t.shape.size(); ++i) os << (i ? ", " : "") << t.shape[i];
    os << "] " << (t.split_dim < 0 ? std::string("replicated") : "split(" + std::to_string(t.split_dim) + ")") << "\n";
  }
  for (size_t r = 0; r < m.ranks.size(); ++r) {
    const shard::RankFile& f = m.ranks[r];
    os << "  " << f.file << " (pp " << f.pp_rank << " dp " << f.dp_rank << " tp " << f.tp_rank << "): params "
       << f.floats[0] << " floats, m " << f.floats[1] << ", v " << f.floats[2] << "; " << f.pieces.size() << " pieces\n";
  }
  if (verify) {
    PieceReader reader(*dir, m);
    int64_t pieces = 0;
    std::vector<float> buf;
    for (size_t r = 0; r < m.ranks.size(); ++r)
      for (const Piece& p : m.ranks[r].pieces) {
        buf.resize(size_t(p.count));
        reader.read(int(r), p, buf.data());
        ++pieces;
      }
    os << "verified: " << pieces << " pieces, " << reader.bytes_read() << " bytes, every CRC-32 matches\n";
  }
  return os.str();
}

}  // namespace loom
