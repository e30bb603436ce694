// The single-process training loop: data, model, AdamW with warmup + cosine LR,
// gradient accumulation, clipping, periodic validation, reporting and the final save.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "loom/core/config.h"

namespace loom {

namespace comm {
class World;
}

struct TrainOptions {
  bool json = false;      // one JSON object per line on `out`
  bool progress = false;  // redraw a progress bar on `err` (terminals)
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  bool keep_params = false;  // copy the final parameters (layout order, no padding) into the summary
  std::string trace_path;    // non-empty: write a Chrome trace of the run there (Note [Trace schema])
  // "auto": continue from checkpoint.dir's newest sharded checkpoint if there is one; a
  // directory: from that checkpoint (Note [Sharded checkpoints]); empty: start fresh.
  std::string resume;
  // Not resuming into a checkpoint.dir that holds an earlier run: move its checkpoints into
  // checkpoint.dir/replaced-<time>/ instead of refusing (Note [Checkpoint directory ownership]).
  bool overwrite = false;
};

struct TrainSummary {
  std::vector<float> losses;  // train loss per step (the global batch's mean on every rank)
  double final_val_loss = 0;
  double unigram_entropy = 0;
  double tokens_per_s = 0;      // real (target) tokens per second
  double padding_fraction = 0;  // data.bucketing: share of the positions computed that were padding
  std::vector<double> step_seconds;  // wall time of each step on this rank (validation excluded)
  int64_t params = 0;
  // Data parallel only: share of gradient-communication time that ran during backward
  // (Note [Overlap] in parallel/grad_sync.h) and the seconds waited for it afterwards.
  double comm_hidden_fraction = -1;
  double comm_exposed_s = 0;
  std::vector<float> final_params;  // filled when TrainOptions::keep_params (tests)
  // This rank's peak resident bytes per category (params, grads, optimizer, activations),
  // measured (Note [Resident memory]), and the ZeRO formula for its model states.
  std::vector<std::pair<std::string, int64_t>> memory_peak_bytes;
  int64_t model_state_formula_bytes = 0;
};

// Single process: cfg.parallel must describe one rank.
TrainSummary train(const Config& cfg, const TrainOptions& opt);
// One rank of a parallel run over `world` (threads or MPI): world size must equal
// dp x tp x pp. Only global rank 0 writes to opt.out / opt.err.
TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World& world);

}  // namespace loom
