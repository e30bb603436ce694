// The single-process training loop: data, model, AdamW with warmup + cosine LR,
// gradient accumulation, clipping, periodic validation, reporting and the final save.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "loom/core/config.h"

namespace loom {

struct TrainOptions {
  bool json = false;      // one JSON object per line on `out`
  bool progress = false;  // redraw a progress bar on `err` (terminals)
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
};

struct TrainSummary {
  std::vector<float> losses;  // train loss per step
  double final_val_loss = 0;
  double unigram_entropy = 0;
  double tokens_per_s = 0;
  int64_t params = 0;
};

TrainSummary train(const Config& cfg, const TrainOptions& opt);

}  // namespace loom
