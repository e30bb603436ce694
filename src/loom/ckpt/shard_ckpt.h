// Sharded, resumable checkpoints (issue 6, first slice).
//
// Note [Sharded checkpoints]
// checkpoint.dir/step-NNNNNNNN/ holds one file per rank, rank-RRRRR.bin, with that rank's
// exact training state as it lives in memory (its flat parameters in its layout, its
// AdamW moments packed as its ZeRO stage shards them), plus manifest.json: format, step,
// optimizer step count, the resolved config (so the layout), every tensor's global shape,
// dtype and placement, and per rank file its pieces: runs of one tensor's local elements
// (tensor, section, first element, count, byte offset) each with its CRC-32. Every rank
// writes its file and its piece table in parallel into the temporary directory rank 0
// made, step-N.loom-tmp-<token>/ (Note [Ownership by content]), and fsyncs them; rank
// 0 merges the tables into the manifest, renames the directory into place and replaces
// `latest` (a one-line file naming the newest complete step) by an atomic rename, then
// removes all but the newest checkpoint.keep_last steps. A save killed at any point
// leaves the previous steps and `latest` as they were.
//
// The data loader and learning-rate schedule are functions of the step and training uses
// no random state, so step + parameters + moments + the optimizer step count is the whole
// state: resuming on the same layout gives bit-identical losses.
//
// Loading reshards: a rank asks, per tensor it holds, for the whole tensor (assembled from
// the pieces of every tp slice, preferring the pieces of its own rank number so that a
// same-layout resume reads its own file) and cuts its own slice, and the parts of it its
// ZeRO stage keeps. So any layout of the same model loads any other; the values are
// copied, never recomputed, so training continues exactly as it would have on the
// writing layout up to the new layout's own arithmetic order. Nothing read from a
// checkpoint is executed or followed as a path: file names must be rank-RRRRR.bin, and
// every piece is checked against the model before a byte is read.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/ckpt/compressor_state.h"
#include "loom/core/config.h"
#include "loom/model/layout.h"
#include "loom/optim/loss_scale.h"

namespace loom {

namespace comm {
class Group;
}

struct ShardState {
  const ParamLayout* layout = nullptr;   // this rank's layout (a tp slice, a pipeline part)
  std::span<float> params;  // flat parameters over `layout` (a mapping of the offload file under parameter offload)
  // AdamW moments covering moment_ranges, packed (AdamW::moment: in memory, or a mapping of
  // the optimizer-offload file).
  std::span<float> m, v;
  std::vector<FlatRange> param_ranges;   // the parts of params this rank holds (ZeRO-3: own pieces)
  std::vector<FlatRange> moment_ranges;  // AdamW::owned()
  int tp = 1, tp_rank = 0;
  int64_t optimizer_steps = 0;
  LossScaleState loss_scale;  // the same on every rank (Note [Dynamic loss scaling])
  // Note [Compressor state in checkpoints]: this rank's compressor buffers and the
  // signature they are valid under (empty: none); a load that starts them at zero says
  // why in compressor_note.
  std::vector<NamedBuffer> compressor;
  std::string compressor_signature;
  std::string compressor_note;
  // params holds param_ranges packed one after another, not the flat buffer (ZeRO-3 with
  // parameter offload: the offload file's packed view, Note [ZeRO-3 offload]).
  bool params_packed = false;
};

// Collective over `world` (nullptr: one process). Throws loom::Error on an IO failure, on
// every rank (the ranks agree on the outcome before any goes on).
void save_shards(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank);

// The step directory `where` points at: itself if it holds manifest.json, else the one its
// `latest` file names; nullopt when it holds neither.
std::optional<std::string> resolve_step_dir(const std::string& where);

// Loads this rank's state from `step_dir` into `s` (buffers sized for this rank), from
// whatever layout wrote it, after checking that the checkpoint holds the same model as
// `cfg`; returns the step. Throws loom::Error naming the file, the tensor, the section and
// the byte range of any damage.
int64_t load_shards(const std::string& step_dir, const Config& cfg, ShardState& s, int global_rank);

// The same from a whole-model checkpoint directory (checkpoint.h: a run's end before
// sharded steps, or `loom import`); absent moments load as zeros with optimizer step 0.
int64_t load_whole_checkpoint(const std::string& dir, const Config& cfg, ShardState& s);

// A layout, readable ("dp 2 tp 1 pp 1 vpp 1 zero 0 on 2 ranks").
std::string layout_text(const ParallelConfig& p);
// The checkpoint's layout, readable ("dp 2 tp 1 pp 1 vpp 1 zero 0 on 2 ranks").
std::string shard_layout(const std::string& step_dir);

// `loom ckpt inspect`: the manifest, readable; with `verify`, every piece's CRC-32 too.
std::string describe_shards(const std::string& where, bool verify);

// `loom ckpt convert`: rewrites the checkpoint at `in` for its config with `sets` applied
// (parallel.* and train.grad_accum only: the layout changes, the model does not) as
// out/step-N, one target rank at a time; returns the new step directory.
std::string convert_shards(const std::string& in, const std::string& out, const std::vector<std::string>& sets);

// The whole model (single-process layout) from a sharded checkpoint, for export and
// sampling: config, params in ParamLayout(config.model), moments, step.
struct WholeState {
  Config config;
  std::vector<float> params, m, v;
  int64_t step = 0, optimizer_steps = 0;
};
WholeState load_whole(const std::string& where);

}  // namespace loom
