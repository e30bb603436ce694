// One step's micro-batches as the engine's gradient pass reads them (engine/gradient_pass.h):
// train.grad_accum fixed ones, or data.bucketing's (Note [Length bucketing]).
#pragma once

#include <cstdint>

#include "loom/core/config.h"
#include "loom/data/loader.h"
#include "loom/engine/engine.h"

namespace loom {

// Targets and computed positions of one global batch (they differ by padding).
struct StepTokens {
  int64_t real = 0, positions = 0;
  StepTokens& operator+=(const StepTokens& o) {
    real += o.real, positions += o.positions;
    return *this;
  }
};

// One step's forward and backward through the engine's gradient pass (Note [Engine parts]);
// returns this rank's share of the loss.
double step_gradients(Engine& e, const Config& cfg, const DataLoader& train_data, const BucketLoader* buckets,
                      int64_t step, double S, bool flush, StepTokens& tokens);

}  // namespace loom
