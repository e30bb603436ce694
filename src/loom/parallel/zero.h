// ZeRO-3: parameters sharded over dp and gathered layer by layer just in time.
//
// Note [ZeRO-3]
// Stage 3 uses one bucket per unit (a block, the embedding, the final norm + head) so a
// unit's parameters and gradients are each one (offset, count) range split evenly over dp
// (Note [Sharded buckets]). Only the own piece of each unit stays resident (Note
// [Resident memory]); the model calls acquire(unit) before it reads a unit's weights and
// release(unit) after, so a unit is all-gathered when first needed - into a buffer from a
// small pool that stays resident, the model's views pointed at it (so the flat buffer's
// other parts are never touched and never fault in) - the next unit in the same
// direction is prefetched (asynchronously, on the dp group's worker), and a unit no one
// holds gives its buffer back and points at its own piece again. Every dp rank runs the same model code, so all
// issue the same gathers in the same order. After the optimizer updates the own pieces,
// invalidate() drops every gathered copy. Gradients are reduce-scattered every
// micro-batch and their non-owned parts released the same way (see GradSync).
//
// Note [bf16 parameter gathers]
// comm.param_dtype = bf16 (FSDP's MixedPrecision(param_dtype=bfloat16), ZeRO-3 with bf16
// parameters): each rank rounds its own piece to bf16 (nearest even), the unit is gathered
// in bf16 (half the bytes) and widened into the gathered fp32 buffer, own piece included,
// so every dp rank computes with the same rounded weights. Forward and backward then see
// every parameter of the unit rounded to bf16 (norm weights, biases and the embedding too,
// which train.precision = bf16 alone keeps in fp32); gradients, the fp32 masters and the
// optimizer are unchanged, and gather_all() (checkpoints, final weights) stays exact.
// parallel.zeropp_qwz = true is ZeRO++'s qwZ (Wang et al., "ZeRO++: Extremely Efficient
// Collective Communication for Giant Model Training", 2023): the same path with the int8
// codec of Note [Compressed all-reduce] - per block of kQuantBlock values one fp32 scale
// max|x| / 127 and q = round(x / scale) - so each weight is off by at most half a step,
// max|block| / 254, and the gather moves 1 + 4/256 bytes a parameter (a quarter of fp32).
//
// Note [hpZ]
// parallel.zeropp_hpz = true is ZeRO++'s hierarchical partitioning (hpZ): besides its primary
// piece (1/dp of each unit), a rank keeps a secondary piece, 1/L of the unit where L is the
// number of its dp group's ranks on its host, node-rank k holding slice k. The first gather
// of a unit in a step (forward) runs over the whole dp group as before; when the unit is
// dropped, the rank copies its slice of the gathered unit into its secondary piece, and every
// later gather in the step (backward, recomputed forward) all-gathers the secondary pieces
// over the host's ranks only, so it never crosses the network. The values are the ones the
// first gather delivered (qwZ/bf16-rounded when those are on), so hpZ computes exactly what
// the run without it computes, on one host or many; it costs the secondary pieces' memory
// (the unit / L for every unit not kept gathered). invalidate() forgets them.
#pragma once

#include <functional>
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/memory.h"
#include "loom/parallel/grad_sync.h"

namespace loom::parallel {

// One bucket per unit of `part` (blocks, embedding, final norm + head), in launch
// (reverse layout) order, padded to split over dp. unit_bucket[u] is the bucket of unit
// u (block l = l, embedding = layers, head = layers + 1; -1 when the part lacks it).
DataParallelPlan plan_units(const ModelConfig& m, int dp, const ModelPart& part, std::vector<int>* unit_bucket);

class ParamGather {
 public:
  // bind(unit, base) points the model's views of `unit` at base (nullptr: the flat buffer).
  using Bind = std::function<void(int unit, float* base)>;
  // keep[unit] (optional): the unit's gathered copy stays until invalidate() - gathered
  // once per step instead of per use (parallel.zero_keep), for memory it then holds.
  // codec kBF16 / kInt8: gather rounded copies (Note [bf16 parameter gathers]).
  ParamGather(comm::Group& dp, const DataParallelPlan& plan, std::vector<int> unit_bucket, float* params, Bind bind,
              MemoryTracker* tracker = nullptr, std::vector<bool> keep = {},
              comm::Compression codec = comm::Compression::kNone, comm::Group* node = nullptr);
  void acquire(int unit);
  void release(int unit);
  // Drops every gathered copy (after the own pieces changed).
  void invalidate();
  // Gathers every unit into the flat buffer itself and keeps them (saving, final weights);
  // invalidate() undoes it. packed: the own pieces in owned order (else in the flat buffer).
  void gather_all(const float* packed = nullptr);
  // Note [Parameter offload] with ZeRO-3: the own pieces live elsewhere (the chunk manager's
  // packed buffer). own(unit, true) returns the unit's own piece, resident until own(unit,
  // false), which comes once the gather that sends it is done.
  using OwnPiece = std::function<const float*(int unit, bool acquire)>;
  void set_own_pieces(OwnPiece own);
  // Units gathered at most at once, and the floats they held beyond the own pieces.
  int peak_units() const { return peak_units_; }
  // Unit gathers so far over the dp group, and from hpZ's secondary pieces on the host.
  int64_t dp_gathers() const { return dp_gathers_; }
  int64_t host_gathers() const { return host_gathers_; }
  int64_t pool_bytes() const;

 private:
  enum class State { kShard, kGathering, kGathered };
  bool from_node(int unit) const { return node_ && has_secondary_[size_t(unit)]; }
  void start_gather(int unit);
  void finish_gather(int unit);  // the unit's gather done, its own piece handed back
  int next_unit(int unit, int direction) const;
  void drop(int unit);

  comm::Group& dp_;
  const DataParallelPlan& plan_;
  std::vector<int> unit_bucket_;
  float* params_;
  Bind bind_;
  MemoryTracker* tracker_;
  std::vector<State> state_;
  std::vector<int> refs_;
  std::vector<bool> keep_;
  std::vector<comm::Work> work_;
  // Gathered copies: buffers of exact unit sizes, never resized (so the memory tracker's
  // ranges stay valid); a unit takes the smallest free one that fits, else a new one.
  std::vector<std::vector<float>> pool_;
  // Rounded gathers: per pool buffer, the encoded gather target (dp messages of
  // compressed_bytes(codec_, piece)) and this rank's encoded piece.
  comm::Compression codec_ = comm::Compression::kNone;
  std::vector<std::vector<uint8_t>> pool_w_, own_w_;
  // hpZ (Note [hpZ]): the host's dp ranks, each unit's secondary piece and whether it holds
  // this step's values.
  comm::Group* node_ = nullptr;
  std::vector<std::vector<float>> secondary_;
  std::vector<bool> has_secondary_, decode_;  // decode_: the pending gather is encoded
  std::vector<int> slot_user_;            // unit using each pool buffer, -1 when free
  std::vector<int> slot_of_;              // per unit: pool buffer, -1 = none (own piece or flat)
  OwnPiece own_;
  std::vector<bool> own_held_;            // per unit: own_ lent its piece to a pending gather
  int last_unit_ = -1, gathered_ = 0, peak_units_ = 0;
  int64_t dp_gathers_ = 0, host_gathers_ = 0;
};

}  // namespace loom::parallel
