// Sharded, resumable checkpoints (issue 6, first slice).
//
// Note [Sharded checkpoints]
// checkpoint.dir/step-NNNNNNNN/ holds one file per rank, rank-RRRRR.bin, with that rank's
// exact training state as it lives in memory (its flat parameters in its layout, its
// AdamW moments, sharded as its ZeRO stage shards them), plus manifest.json: format,
// step, optimizer step count, the resolved config, the layout, and per rank file the
// float count and CRC-32 of each section. Every rank writes its own file in parallel into
// step-N.tmp/ and fsyncs it; rank 0 then writes the manifest, renames the directory into
// place and replaces `latest` (a one-line file naming the newest complete step) by an
// atomic rename, and removes all but the newest checkpoint.keep_last steps. A save killed
// at any point leaves the previous steps and `latest` as they were. The data loader and
// learning-rate schedule are functions of the step, so step + parameters + moments + the
// optimizer step count is the whole state: resuming on the same layout gives bit-identical
// losses. Loading into a different layout (resharding) is the next slice: until then it
// is refused naming both layouts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/config.h"

namespace loom {

namespace comm {
class Group;
}

struct ShardState {
  std::vector<float>* params = nullptr;  // this rank's flat parameters
  std::vector<float>* m = nullptr;       // AdamW moments as this rank stores them
  std::vector<float>* v = nullptr;
  int64_t optimizer_steps = 0;
};

// Collective over `world` (nullptr: one process). Throws loom::Error on an IO failure.
void save_shards(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world, int global_rank);

// The step directory `where` points at: itself if it holds manifest.json, else the one its
// `latest` file names; nullopt when it holds neither.
std::optional<std::string> resolve_step_dir(const std::string& where);

// Loads this rank's state from `step_dir` into `s` (sizes must match) after checking the
// manifest's layout and model against `cfg` and the file's checksums; returns the step.
// Throws loom::Error naming the file, the section and the byte range of any damage.
int64_t load_shards(const std::string& step_dir, const Config& cfg, ShardState& s, int global_rank, int world_size);

// `loom ckpt inspect`: the manifest, readable.
std::string describe_shards(const std::string& where);

}  // namespace loom
