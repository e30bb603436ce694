// The training loop, on one process or as one rank of a parallel run: data, model, AdamW
// with warmup + cosine LR, gradient accumulation, clipping; what each step triggers
// (report, checkpoints, validation) is a step observer (train/step_observers.h).
#pragma once

#include "loom/core/config.h"
#include "loom/train/train_options.h"

namespace loom {

namespace comm {
class World;
}

// Single process: cfg.parallel must describe one rank.
TrainSummary train(const Config& cfg, const TrainOptions& opt);
// One rank of a parallel run over `world` (threads or MPI): world size must equal
// dp x tp x pp. Only global rank 0 writes to opt.out / opt.err.
TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World& world);

}  // namespace loom
