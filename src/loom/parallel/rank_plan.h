// Note [Rank plan]
// What one rank of a layout holds and does, from the config alone: its mesh coordinates,
// its model part, its pipeline schedule, activation slots and per-chunk peaks, its
// data-parallel plan (buckets, ZeRO pieces, padding), its parameter layout and the ranges
// of parameters and AdamW moments it keeps, its duties (role, gradient path, update rule,
// where its states live: Note [Rank duties]) and its model-state bytes (Note [Model-state
// bytes]). plan_rank() is pure (no communication, no
// allocation of state): the live context (groups), the engine and the offline checkpoint
// tools all take their layout from it, so no two of them can disagree. The simulator, which
// must price thousands of layouts a second in the planner, takes the same pieces from the
// same pure functions (parallel::rank_part for the part, the schedule and its validator for
// the peaks, rank::update_rule for a stream's exposed reduction, rank::model_state_bytes
// for memory) rather than the whole plan; it prices gradient buckets by size, not by the
// plan's bucket list.
#pragma once

#include <optional>
#include <vector>

#include "loom/core/config.h"
#include "loom/model/layout.h"
#include "loom/parallel/grad_sync.h"
#include "loom/parallel/schedule.h"
#include "loom/rank/compress_spec.h"
#include "loom/rank/duties.h"
#include "loom/rank/state_bytes.h"

namespace loom {

// ZeRO-3 unit numbering: blocks 0 .. layers-1, then the embedding, then the head.
inline int embedding_unit(const ModelConfig& m) { return int(m.layers); }
inline int head_unit(const ModelConfig& m) { return int(m.layers) + 1; }

struct RankPlan {
  int global_rank = 0;
  int pp_rank = 0, dp_rank = 0, tp_rank = 0;
  ModelPart part;                              // whole model unless pp > 1; the tp slice
  std::optional<parallel::Schedule> schedule;  // pp > 1
  int act_slots = 1;                           // activation slots (the schedule's peak in flight)
  std::vector<int> chunk_peaks;                // per chunk: most micro-batches it holds at once
  std::vector<Recompute> recompute;            // per layer of the whole model (parallel.recompute)
  parallel::DataParallelPlan dp_plan;          // buckets, pieces, padding (meaningful when dp > 1)
  std::vector<int> unit_bucket;                // ZeRO-3: unit -> bucket
  ParamLayout layout;                          // this rank's flat layout, padded as dp_plan pads it
  std::vector<FlatRange> param_ranges;         // parameters it keeps (ZeRO-3, dp > 1: own pieces)
  std::vector<FlatRange> moment_ranges;        // AdamW moments it keeps, packed in this order
  int w_slots = 0;  // split backward (zero-bubble schedules): W slots, the schedule's peak pending W's
  rank::Duties duties;  // Note [Rank duties]: role, gradient path, update rule, where states live
  rank::StateBytes state_bytes;  // Note [Model-state bytes]: this rank's, from its layout
  rank::CompressSpec compress;   // parallel.compress and its schedule (the gradient sync's codec)
  std::vector<int64_t> unit_floats;  // per ZeRO-3 unit of this part, its floats unpadded (dp 1)
  std::vector<FlatRange> ps_keys;    // parameter servers: each of the shard's servers' key ranges
  // cp > 1 (Note [Context-parallel chunks]): each cp rank's global positions of a sequence.
  std::vector<std::vector<int32_t>> cp_positions;
  int cp = 1;
  CpSplit cp_split = CpSplit::kZigZag;
};

// Each cp rank's positions of a sequence of `seq` tokens (cp_positions is train.seq's): a
// bucketed micro-batch's padded length (Note [Length bucketing]), a multiple of 2 cp (zigzag)
// or cp (plain).
std::vector<std::vector<int32_t>> cp_positions_of(const RankPlan& plan, int64_t seq);

// Throws loom::Error when the layout's schedule does not finish (the validator's problem).
// A parameter server's plan (Note [Parameter server with model parallelism]) is its shard's
// dp-0 worker's with the server's key range as its parameters and moments.
RankPlan plan_rank(const Config& cfg, int global_rank);

// What a parameter server saves in a checkpoint (Note [PS checkpoints]): its key range, less
// the head stage's copy of GPT's tied wte (the first stage's servers save that tensor; under
// ps.mode = async the copies are updated in different orders and only the first is used).
std::vector<FlatRange> ps_saved_ranges(const RankPlan& server, const ModelConfig& m);

}  // namespace loom
