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
  // bf16: gather bf16 copies (Note [bf16 parameter gathers]).
  ParamGather(comm::Group& dp, const DataParallelPlan& plan, std::vector<int> unit_bucket, float* params, Bind bind,
              MemoryTracker* tracker = nullptr, std::vector<bool> keep = {}, bool bf16 = false);
  void acquire(int unit);
  void release(int unit);
  // Drops every gathered copy (after the own pieces changed).
  void invalidate();
  // Gathers every unit into the flat buffer itself and keeps them (saving, final weights);
  // invalidate() undoes it.
  void gather_all();
  // Units gathered at most at once, and the floats they held beyond the own pieces.
  int peak_units() const { return peak_units_; }
  int64_t pool_bytes() const;

 private:
  enum class State { kShard, kGathering, kGathered };
  void start_gather(int unit);
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
  // bf16 gathers: per pool buffer, the bf16 gather target and this rank's piece in bf16.
  bool bf16_ = false;
  std::vector<std::vector<comm::bf16>> pool_h_, own_h_;
  std::vector<int> slot_user_;            // unit using each pool buffer, -1 when free
  std::vector<int> slot_of_;              // per unit: pool buffer, -1 = none (own piece or flat)
  int last_unit_ = -1, gathered_ = 0, peak_units_ = 0;
};

}  // namespace loom::parallel
