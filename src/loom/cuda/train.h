// `loom train --device cuda` (issue 20): the training loop of train/trainer.cc on one GPU
// with CudaModel, or on one GPU per rank with data parallelism over NCCL (Note [GPU data
// parallelism] in cuda/nccl.h): the same data order, LR schedule, clipping, AdamW, report
// lines, validation and sharded checkpoints (interchangeable with CPU runs: the same flat
// layout and file format). Refuses what it does not run yet, naming what does.
#pragma once

#include "loom/core/config.h"
#include "loom/train/train_options.h"

namespace loom::comm {
class World;
}

namespace loom::cuda {

// world: the ranks of a data-parallel run (parallel.dp = its size), or nullptr for one
// process on one GPU.
TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World* world = nullptr);

// Throws ConfigError naming every setting train.device = cuda does not support yet, for a
// run of `ranks` processes.
void check_supported(const Config& cfg, int ranks = 1);

}  // namespace loom::cuda
