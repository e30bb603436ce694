#include "loom/ckpt/shard_format.h"

#include <cmath>


#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/comm/mesh.h"
#include "loom/core/fileio.h"
#include "loom/rank/duties.h"
#include "loom/core/error.h"

namespace loom::shard {

namespace {

using nlohmann::json;

// Float counts above this are refused before any arithmetic on them (2^40 floats = 4 TiB).
constexpr int64_t kMaxFloats = int64_t(1) << 40;


json layout_json(const ParallelConfig& p) {
  return {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"vpp", p.vpp}, {"sp", p.sp}, {"zero", p.zero},
          {"pp_layers", pp_layers_text(p.pp_layers)}, {"vocab_parallel", p.vocab_parallel},
          {"ps_servers", p.ps_servers}, {"pp_vocab", p.pp_vocab}};
}

json rank_to_json(const RankFile& r) {
  json pieces = json::array();
  for (const Piece& p : r.pieces)
    pieces.push_back({p.tensor, p.section, p.local_offset, p.count, p.byte_offset, p.crc});
  return {{"file", r.file},
          {"dp_rank", r.dp_rank}, {"tp_rank", r.tp_rank}, {"pp_rank", r.pp_rank},
          {"floats", {{"params", r.floats[0]}, {"m", r.floats[1]}, {"v", r.floats[2]}}},
          {"pieces", pieces}};
}

// An integer field in [lo, hi], else an Error naming `where` and `what`.
int64_t int_in(const json& j, int64_t lo, int64_t hi, const std::string& where, const std::string& what) {
  if (!j.is_number_integer())
    throw Error("checkpoint: " + where + ": " + what + " is not an integer");
  const int64_t v = j.is_number_unsigned() ? (j.get<uint64_t>() > uint64_t(hi) ? hi + 1 : int64_t(j.get<uint64_t>()))
                                           : j.get<int64_t>();
  if (v < lo || v > hi)
    throw Error(detail::cat("checkpoint: ", where, ": ", what, " = ", v, " is outside [", lo, ", ", hi, "]"));
  return v;
}

json parse_json(std::string_view text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    throw Error("checkpoint: '" + where + "' is not valid JSON: " + e.what());
  }
}

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw Error("checkpoint: " + where + " has no '" + key + "'");
  return j[key];
}

RankFile rank_from_json(const json& j, const std::string& where) {
  RankFile r;
  const json& file = field(j, "file", where);
  if (!file.is_string()) throw Error("checkpoint: " + where + ": 'file' is not a string");
  r.file = file.get<std::string>();
  r.dp_rank = int(int_in(field(j, "dp_rank", where), 0, 1 << 24, where, "dp_rank"));
  r.tp_rank = int(int_in(field(j, "tp_rank", where), 0, 1 << 24, where, "tp_rank"));
  r.pp_rank = int(int_in(field(j, "pp_rank", where), 0, 1 << 24, where, "pp_rank"));
  const json& floats = field(j, "floats", where);
  for (int s = 0; s < kSections; ++s)
    r.floats[s] = int_in(field(floats, kSectionNames[s], where), 0, kMaxFloats, where, std::string("floats.") + kSectionNames[s]);
  const json& pieces = field(j, "pieces", where);
  if (!pieces.is_array()) throw Error("checkpoint: " + where + ": 'pieces' is not an array");
  r.pieces.reserve(pieces.size());
  for (const json& p : pieces) {
    if (!p.is_array() || p.size() != 6) throw Error("checkpoint: " + where + ": a piece is not [tensor, section, offset, count, byte, crc32]");
    Piece x;
    x.tensor = int(int_in(p[0], 0, 1 << 30, where, "piece tensor"));
    x.section = int(int_in(p[1], 0, kSections - 1, where, "piece section"));
    x.local_offset = int_in(p[2], 0, kMaxFloats, where, "piece offset");
    x.count = int_in(p[3], 1, kMaxFloats, where, "piece count");
    x.byte_offset = int_in(p[4], kHeaderBytes, 4 * kMaxFloats, where, "piece byte offset");
    x.crc = uint32_t(int_in(p[5], 0, 0xffffffffLL, where, "piece crc32"));
    r.pieces.push_back(x);
  }
  return r;
}

// Every piece inside its tensor's slice and inside its section of the file.
void check_pieces(const Manifest& m, const std::string& where) {
  const Slices slices(m.config);
  for (const RankFile& r : m.ranks) {
    int64_t start[kSections + 1] = {kHeaderBytes, 0, 0, 0};
    for (int s = 0; s < kSections; ++s) start[s + 1] = start[s] + 4 * r.floats[s];
    for (const Piece& p : r.pieces) {
      const std::string at = where + ", " + r.file;
      if (p.tensor >= int(m.tensors.size()))
        throw Error(detail::cat("checkpoint: ", at, ": piece names tensor #", p.tensor, " of ", m.tensors.size()));
      const Tensor& t = m.tensors[size_t(p.tensor)];
      const std::string& name = t.name;
      const int64_t numel = slices.spec(t, slices.of(t, r)).numel;
      if (p.local_offset + p.count > numel)
        throw Error(detail::cat("checkpoint: ", at, ": piece of ", name, " covers elements ", p.local_offset, "..",
                                p.local_offset + p.count, ", past its ", numel));
      if (p.byte_offset < start[p.section] || p.byte_offset + 4 * p.count > start[p.section + 1])
        throw Error(detail::cat("checkpoint: ", at, ": piece of ", name, " at bytes ", p.byte_offset, "..",
                                p.byte_offset + 4 * p.count, " lies outside section ", kSectionNames[p.section], " (bytes ",
                                start[p.section], "..", start[p.section + 1], ")"));
    }
  }
}


// Every element of every tensor, in every section, is held by some piece of its slice
// (Slices; any rank's for a replicated one). Pieces may repeat elements (dp replicas hold
// copies); none may be missing, or loading could not assemble the tensor. Reads no data:
// the manifest alone says it.
void check_coverage(const Manifest& m, const std::string& where) {
  const Slices slices(m.config);
  // runs[tensor][section][slice] = (first, end) element ranges
  std::vector<std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>>> runs(m.tensors.size());
  for (size_t t = 0; t < m.tensors.size(); ++t)
    runs[t].assign(kSections, std::vector<std::vector<std::pair<int64_t, int64_t>>>(size_t(slices.count(m.tensors[t]))));
  for (const RankFile& r : m.ranks)
    for (const Piece& p : r.pieces) {
      const int slice = slices.of(m.tensors[size_t(p.tensor)], r);
      runs[size_t(p.tensor)][size_t(p.section)][size_t(slice)].push_back({p.local_offset, p.local_offset + p.count});
    }
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const bool replicated = m.tensors[t].split_dim < 0;
    for (int sec = 0; sec < kSections; ++sec)
      for (int slice = 0; slice < slices.count(m.tensors[t]); ++slice) {
        auto& v = runs[t][size_t(sec)][size_t(slice)];
        std::sort(v.begin(), v.end());
        const int64_t numel = slices.spec(m.tensors[t], slice).numel;
        int64_t covered = 0;
        for (const auto& [lo, hi] : v) {
          if (lo > covered) break;
          covered = std::max(covered, hi);
        }
        if (covered < numel)
          throw Error(detail::cat("checkpoint: '", where, "': no piece holds tensor ", m.tensors[t].name, " section ",
                                  kSectionNames[sec], replicated ? "" : " slice " + std::to_string(slice),
                                  " elements from ", covered, " (of ", numel, "): the manifest is incomplete"));
      }
  }
}

}  // namespace

Slices::Slices(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  tp_ = int(p.tp);
  vocab_tp_ = p.vocab_parallel ? tp_ : 1;
  vocab_pp_ = p.pp_vocab ? int(p.pp) : 1;
  for (int k = 0; k < vocab_pp_ * tp_; ++k) {
    ModelPart part;  // every layer, both ends
    part.tp = tp_, part.tp_rank = k % tp_, part.vocab_parallel = p.vocab_parallel;
    part.vocab_pp = vocab_pp_, part.vocab_pp_rank = k / tp_;
    layouts_.emplace_back(cfg.model, LayoutPadding{}, part);
  }
}

bool Slices::vocab_rows(const Tensor& t) const { return vocab_pp_ > 1 && layouts_[0].at(t.name).vocab_parts > 0; }

int Slices::count(const Tensor& t) const {
  if (vocab_rows(t)) return vocab_pp_ * vocab_tp_;
  return t.split_dim < 0 ? 1 : tp_;
}

int Slices::of(const Tensor& t, const RankFile& r) const {
  if (vocab_rows(t)) return r.pp_rank * vocab_tp_ + (vocab_tp_ > 1 ? r.tp_rank : 0);
  return t.split_dim < 0 ? 0 : r.tp_rank;
}

const ParamSpec& Slices::spec(const Tensor& t, int slice) const {
  LOOM_ASSERT(slice >= 0 && slice < count(t));
  if (vocab_rows(t)) return layouts_[size_t(vocab_tp_ > 1 ? slice : slice * tp_)].at(t.name);  // vocab part == slice
  return layouts_[size_t(t.split_dim < 0 ? 0 : slice)].at(t.name);
}

std::string step_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
  return b;
}

std::vector<int> rank_coords(const ParallelConfig& p, int r) {
  if (r < p.world()) return comm::training_mesh(p).coords(r);
  const rank::PsPlace at = rank::ps_place(p, r);  // Note [Parameter server with model parallelism]
  return {at.shard / int(p.tp), int(p.dp) + at.index, at.shard % int(p.tp)};
}

std::string rank_file_name(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.bin", rank);
  return b;
}

uint32_t crc_of(const float* p, size_t n) { return crc32_of(p, n * sizeof(float)); }

std::vector<Tensor> tensor_table(const Config& cfg) {
  ModelPart part;  // tp rank 0's and (pp_vocab) vocabulary part 0's layout
  part.tp = int(cfg.parallel.tp), part.vocab_parallel = cfg.parallel.vocab_parallel;
  if (cfg.parallel.pp_vocab) part.vocab_pp = int(cfg.parallel.pp);
  const ParamLayout whole(cfg.model), sliced(cfg.model, {}, part);
  std::vector<Tensor> out;
  for (const ParamSpec& s : whole.specs()) {
    const ParamSpec& mine = sliced.at(s.name);
    out.push_back({s.name, s.shape, mine.vocab_parts > 0 ? 0 : cfg.parallel.tp > 1 ? mine.split_dim : -1});
  }
  return out;
}

std::vector<Piece> pieces_of(const std::vector<Tensor>& table, const ParamLayout& layout,
                             const std::vector<FlatRange>& param_ranges, const std::vector<FlatRange>& moment_ranges,
                             bool params_packed) {
  std::map<std::string, int> index;
  for (size_t i = 0; i < table.size(); ++i) index[table[i].name] = int(i);
  int64_t packed = 0, params = 0;
  for (const FlatRange& r : moment_ranges) packed += r.count;
  for (const FlatRange& r : param_ranges) params += r.count;
  if (!params_packed) params = layout.total_floats();
  const int64_t section_start[kSections] = {kHeaderBytes, kHeaderBytes + 4 * params,
                                            kHeaderBytes + 4 * (params + packed)};
  std::vector<Piece> out;
  // Section `sec` holds `ranges` of the flat buffer packed one after another.
  auto add = [&](int sec, const std::vector<FlatRange>& ranges, bool packed_section) {
    int64_t q = 0;  // floats of the section before range r
    for (const FlatRange& r : ranges) {
      for (const ParamSpec& s : layout.specs()) {
        const int64_t lo = std::max(r.offset, s.offset), hi = std::min(r.offset + r.count, s.offset + s.numel);
        if (hi <= lo) continue;
        const int64_t at = packed_section ? q + (lo - r.offset) : lo;
        out.push_back({index.at(s.name), sec, lo - s.offset, hi - lo, section_start[sec] + 4 * at, 0});
      }
      q += r.count;
    }
  };
  add(0, param_ranges, params_packed);
  add(1, moment_ranges, true);
  add(2, moment_ranges, true);
  return out;
}

std::string rank_json(const RankFile& r) { return rank_to_json(r).dump(); }

RankFile parse_rank(std::string_view text, const std::string& where) { return rank_from_json(parse_json(text, where), where); }

std::string manifest_json(const Manifest& m) {
  json tensors = json::array();
  for (const Tensor& t : m.tensors)
    tensors.push_back({{"name", t.name}, {"dtype", "f32"}, {"shape", t.shape},
                       {"placement", t.split_dim < 0 ? std::string("replicated") : "split(" + std::to_string(t.split_dim) + ")"}});
  json ranks = json::array();
  for (const RankFile& r : m.ranks) ranks.push_back(rank_to_json(r));
  // The rest of the training state, spelled out: the loader's order and the learning rate
  // are functions of the step, training draws no random numbers (weights are initialised
  // from train.seed, then overwritten on load); the loss scale (Note [Dynamic loss scaling])
  // is the one piece of state besides the tensors and the step counts.
  const json scale = m.loss_scale.scale > 0 ? json{{"scale", m.loss_scale.scale}, {"good_steps", m.loss_scale.good_steps}}
                                            : json("none");
  const json state = {{"data_position", "step " + std::to_string(m.step) + " (row r of step s reads hash(seed, s, r))"},
                      {"lr_schedule", "lr_at(step " + std::to_string(m.step) + ")"},
                      {"rng", "none kept (TernGrad's rounding hashes seed, step, bucket and rank)"}, {"loss_scale", scale}};
  json out = {{"format", kFormat}, {"step", m.step}, {"optimizer_steps", m.optimizer_steps}, {"state", state},
              {"world", m.ranks.size()}, {"layout", layout_json(m.config.parallel)},
              {"config", to_toml(m.config)}, {"tensors", tensors}, {"ranks", ranks}};
  if (!m.compressor_signature.empty()) out["compressor"] = m.compressor_signature;
  return out.dump(1);
}

Manifest parse_manifest(std::string_view text, const std::string& where) {
  const json j = parse_json(text, where);
  const json& format = field(j, "format", where);
  if (!format.is_string() || format.get<std::string>() != kFormat)
    throw Error("checkpoint: '" + where + "' has format " + format.dump() + ", expected " + kFormat);
  Manifest m;
  m.step = int_in(field(j, "step", where), 0, kMaxFloats, where, "step");
  m.optimizer_steps = int_in(field(j, "optimizer_steps", where), 0, kMaxFloats, where, "optimizer_steps");
  if (j.contains("state") && j["state"].is_object() && j["state"].contains("loss_scale") &&
      j["state"]["loss_scale"].is_object()) {
    const json& ls = j["state"]["loss_scale"];
    const json& scale = field(ls, "scale", where);
    if (!scale.is_number() || !(scale.get<double>() > 0) || !std::isfinite(scale.get<double>()))
      throw Error("checkpoint: '" + where + "': state.loss_scale.scale is " + scale.dump() + ", expected a positive number");
    m.loss_scale.scale = scale.get<double>();
    m.loss_scale.good_steps = int_in(field(ls, "good_steps", where), 0, kMaxFloats, where, "state.loss_scale.good_steps");
  }
  if (j.contains("compressor")) {
    if (!j["compressor"].is_string()) throw Error("checkpoint: '" + where + "': 'compressor' is not a string");
    m.compressor_signature = j["compressor"].get<std::string>();
  }
  const json& cfg = field(j, "config", where);
  if (!cfg.is_string()) throw Error("checkpoint: '" + where + "': 'config' is not a string");
  try {
    m.config = config_from_toml_string(cfg.get<std::string>());
  } catch (const Error& e) {
    throw Error("checkpoint: '" + where + "' holds a config loom refuses: " + e.what());
  }
  // The tensor table must be the one its own model has (and is checked before it is built:
  // a block has several tensors, so more layers than listed tensors is a lie).
  const json& tensors = field(j, "tensors", where);
  if (!tensors.is_array() || int64_t(tensors.size()) < m.config.model.layers)
    throw Error("checkpoint: '" + where + "': 'tensors' does not list the model's tensors");
  m.tensors = tensor_table(m.config);
  if (tensors.size() != m.tensors.size())
    throw Error(detail::cat("checkpoint: '", where, "' lists ", tensors.size(), " tensors, its model has ", m.tensors.size()));
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const json& t = tensors[i];
    const Tensor& want = m.tensors[i];
    const std::string placement = want.split_dim < 0 ? "replicated" : "split(" + std::to_string(want.split_dim) + ")";
    if (!t.is_object() || t.value("name", json()) != json(want.name) || t.value("shape", json()) != json(want.shape) ||
        t.value("dtype", json()) != json("f32") || t.value("placement", json()) != json(placement))
      throw Error("checkpoint: '" + where + "': tensor #" + std::to_string(i) + " is not " + want.name + " f32 " +
                  json(want.shape).dump() + " " + placement + " as its model has it");
  }
  const ParallelConfig& p = m.config.parallel;
  const int64_t world = p.ranks();
  const json& ranks = field(j, "ranks", where);
  if (!ranks.is_array() || int64_t(ranks.size()) != world)
    throw Error(detail::cat("checkpoint: '", where, "': 'ranks' does not list the ", world, " ranks of its layout"));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string at = "'" + where + "' rank " + std::to_string(r);
    m.ranks.push_back(rank_from_json(ranks[r], at));
    const RankFile& f = m.ranks.back();
    const std::vector<int> c = rank_coords(p, int(r));
    if (f.file != rank_file_name(int(r)))
      throw Error("checkpoint: " + at + " names file '" + f.file + "', expected " + rank_file_name(int(r)));
    if (f.pp_rank != c[0] || f.dp_rank != c[1] || f.tp_rank != c[2])
      throw Error("checkpoint: " + at + " has mesh coordinates that are not its layout's");
  }
  if (j.contains("world") && j["world"] != json(world))
    throw Error(detail::cat("checkpoint: '", where, "': 'world' = ", j["world"].dump(), " but its layout has ",
                            world, " ranks"));
  check_pieces(m, where);
  check_coverage(m, where);
  return m;
}

}  // namespace loom::shard
