// `loom train --device cuda` (issue 20): the training loop of train/trainer.cc on one GPU
// with CudaModel: the same data order, LR schedule, clipping, AdamW, report lines,
// validation and sharded checkpoints (interchangeable with CPU runs: the same flat layout
// and file format). Refuses what it does not run yet, naming what does.
#pragma once

#include "loom/core/config.h"
#include "loom/train/train_options.h"

namespace loom::cuda {

TrainSummary train(const Config& cfg, const TrainOptions& opt);

// Throws ConfigError naming every setting train.device = cuda does not support yet.
void check_supported(const Config& cfg);

}  // namespace loom::cuda
