// Accordion: adaptive compression by critical-regime detection.
//
// Note [Accordion]
// Agarwal, Wang, Papailiopoulos, Venkataraman, "Accordion: Adaptive Gradient Communication
// via Critical Learning Regime Identification" (MLSys 2021), its detection rule: every interval,
// each layer's accumulated gradient norm |D_w| is compared with the previous interval's;
// a relative change |D_{w-1}| - |D_w| of at least eta (0.5) marks a critical regime, in
// which the layer is compressed lightly (PowerSGD rank / top-k ratio as configured), else
// heavily (accordion_heavy_rank / accordion_heavy_ratio). loom decides per bucket, on the
// sum over the window of the bucket's reduced gradient, which every rank holds with the
// same bits, so every rank decides alike; the first window is critical (light). The window
// is a number of optimizer steps (loom has no epochs; the paper's interval is an epoch).
// The paper also forces light compression for a few epochs after each learning-rate decay;
// loom's cosine schedule has no such steps, so that rule is not built. Switches are logged.
// State per bucket (checkpointed): the window's sum, its last norm, the setting and the
// steps into the window.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "loom/parallel/compress.h"

namespace loom::parallel {

class Accordion {
 public:
  Accordion(const CompressSpec& spec, const std::vector<Bucket>& buckets);

  // Before a step: every bucket's compressor at its current setting.
  void apply(const std::vector<std::unique_ptr<BucketCompressor>>& compressors) const;
  // After bucket b's reduce at optimizer step `step`: `g` is its reduced gradient. At the end
  // of a window decides the setting for the next one (and logs a switch).
  void observe(size_t b, std::span<const float> g, int64_t step, BucketCompressor& c);
  // The switches logged since the last call.
  std::vector<std::string> take_log();
  // Bucket b's checkpointed buffers.
  std::vector<CompressorState> state(size_t b);
  bool heavy(size_t b) const { return buckets_[b].meta[1] != 0.0f; }

 private:
  struct PerBucket {
    std::vector<float> sum;                  // sum of the reduced gradient over the window
    std::vector<float> meta{-1.0f, 0, 0};    // last window's norm (-1: none), heavy (0/1), steps in window
  };
  CompressSpec spec_;
  std::vector<PerBucket> buckets_;
  std::vector<std::string> log_;
};

}  // namespace loom::parallel
