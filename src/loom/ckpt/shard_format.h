// The on-disk form of a sharded checkpoint (Note [Sharded checkpoints] in shard_ckpt.h):
// the manifest as data, its parser (hostile input: every field is checked against the
// model its own config describes before anything is read), and the piece tables.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/owned.h"
#include "loom/model/layout.h"
#include "loom/optim/loss_scale.h"

namespace loom {
struct ShardState;
namespace comm {
class Group;
}
}

namespace loom::shard {

inline constexpr const char* kFormat = "loom-sharded-v2";
inline constexpr int kSections = 3;  // params, m, v
inline constexpr const char* kSectionNames[kSections] = {"params", "m", "v"};
// A rank file: 8 magic bytes, three int64 float counts, then the sections' raw floats.
inline constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'S', 'H', 'R', 'D'};
inline constexpr int64_t kHeaderBytes = 8 + 3 * 8;

// A contiguous run of one tensor's local elements (this rank's tp slice, row-major) in
// one section of a rank file.
struct Piece {
  int tensor = 0;            // index into Manifest::tensors
  int section = 0;           // 0 params, 1 m, 2 v
  int64_t local_offset = 0;  // first element within the rank's slice of the tensor
  int64_t count = 0;         // floats
  int64_t byte_offset = 0;   // in the rank file
  uint32_t crc = 0;          // CRC-32 (zlib) of the piece's bytes
};

// One tensor of the whole model: its global shape and placement over tp.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;  // whole tensor, vocabulary padding excluded
  int split_dim = -1;          // -1: replicated on every tp rank
};

struct RankFile {
  std::string file;  // rank-RRRRR.bin, nothing else (no paths from the file are followed)
  int dp_rank = 0, tp_rank = 0, pp_rank = 0;
  int64_t floats[kSections] = {0, 0, 0};
  std::vector<Piece> pieces;
};

// How a checkpoint of `cfg` cuts each tensor over its rank files: a replicated tensor is
// one slice any rank may hold; a tp-split one has tp slices, rank file (pp, tp_rank) holding
// slice tp_rank; the vocabulary rows under parallel.pp_vocab (Note [Vocabulary passes] in
// parallel/schedule.h) have one slice per vocabulary part, rank (pp, tp_rank) holding part
// ModelPart::vocab_index(). Each slice's local form is a ParamSpec of some rank's layout.
class Slices {
 public:
  explicit Slices(const Config& cfg);
  int count(const Tensor& t) const;
  int of(const Tensor& t, const RankFile& r) const;
  const ParamSpec& spec(const Tensor& t, int slice) const;

 private:
  bool vocab_rows(const Tensor& t) const;
  int tp_ = 1, vocab_tp_ = 1, vocab_pp_ = 1;  // tp; the vocabulary's parts over tp and over pp
  std::vector<ParamLayout> layouts_;  // [vocab pp rank x tp + tp rank]: that rank's whole-model layout
};

struct Manifest {
  int64_t step = 0, optimizer_steps = 0;
  LossScaleState loss_scale;  // scale 0: the run had no loss scaling
  Config config;  // the run that wrote it; config.parallel is the layout
  std::vector<Tensor> tensors;
  std::vector<RankFile> ranks;
  std::string compressor_signature;  // Note [Compressor state in checkpoints]; empty: none saved
};

std::string step_name(int64_t step);
std::string rank_file_name(int rank);
// Rank r's (pp, dp, tp) coordinates in a checkpoint of layout p: the training mesh's, and for
// a parameter server (r >= p.world(), Note [Parameter server with model parallelism]) its
// shard's (pp, tp) with dp + its index among the shard's servers. p.ranks() ranks.
std::vector<int> rank_coords(const ParallelConfig& p, int r);
uint32_t crc_of(const float* p, size_t n);

// The whole model's tensor table for `cfg` (names, whole shapes, placements).
std::vector<Tensor> tensor_table(const Config& cfg);

// The pieces of one rank's state: its flat parameters restricted to `param_ranges` (or,
// params_packed, those ranges packed one after another), its packed moments covering
// `moment_ranges` (in that order), over `layout` (a tp slice `tp_rank`). CRCs are left 0;
// byte offsets assume the file layout above.
std::vector<Piece> pieces_of(const std::vector<Tensor>& table, const ParamLayout& layout,
                             const std::vector<FlatRange>& param_ranges, const std::vector<FlatRange>& moment_ranges,
                             bool params_packed = false);

// JSON text <-> Manifest. parse_manifest throws loom::Error naming `where` and the field
// for anything malformed or inconsistent with the model (a piece outside its tensor or
// its section, a file name that is not rank-RRRRR.bin, ranks not matching the layout).
std::string manifest_json(const Manifest& m);
Manifest parse_manifest(std::string_view text, const std::string& where);
// One rank's piece table (the side file each rank writes during a save).
std::string rank_json(const RankFile& r);
RankFile parse_rank(std::string_view text, const std::string& where);

// Writes rank `rank`'s file into `dir` from `s` (fsynced) and returns its piece table with
// CRCs. Throws loom::Error when the file cannot be written.
// `mid_write` (optional) runs once the parameter section is on disk, the moments not yet.
RankFile write_rank_file(const std::string& dir, int rank, const std::vector<Tensor>& table, const ShardState& s,
                         const std::function<void()>& mid_write = {});
// The optimizer's step count the manifest records: this rank's, or in a parameter-server
// job the most of any rank's (collective over `world` there).
int64_t agreed_optimizer_steps(const Config& cfg, const ShardState& s, comm::Group* world);
// The manifest of a save of step `step`: every rank's piece table (global rank order) with
// its mesh coordinates, the model's tensor table, and s's loss scale and compressor
// signature (the same on every rank).
Manifest manifest_of(const Config& cfg, int64_t step, int64_t optimizer_steps, const ShardState& s,
                     std::vector<RankFile> ranks);
// Rank 0's half of a save: writes m as `tmp`/manifest.json, publishes `tmp` as
// root/step-N (an earlier step of that name is moved aside), replaces `latest`, keeps the newest `keep_last` steps (0: all).
// `at` (optional) is called at the points "manifest" (written) and "latest" (renamed).
void publish(const std::string& root, owned::TempDir& tmp, const Manifest& m, int64_t keep_last,
             const std::function<void(const char*)>& at = {});

}  // namespace loom::shard
