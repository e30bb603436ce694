// AdamW over the flat parameter buffer, global grad-norm clipping, and the LR schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/config.h"
#include "loom/kernels/kernels.h"
#include "loom/model/layout.h"

namespace loom {

// Linear warmup from lr/warmup to lr over warmup_steps, then cosine decay to lr*min_lr_ratio
// at total_steps. `step` is 0-based (the step about to be taken).
double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps);

// Scales grads so their global L2 norm is at most max_norm, exactly as
// torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
// Returns the norm before clipping. max_norm <= 0 only measures.
double clip_grad_norm(const Kernels& k, std::vector<float>& grads, double max_norm);

class AdamW {
 public:
  AdamW(const ParamLayout& layout, const OptimConfig& cfg);
  // One update with learning rate `lr`; increments the step count (bias correction uses it).
  void step(const Kernels& k, std::vector<float>& params, const std::vector<float>& grads, double lr);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }

 private:
  // Contiguous runs of the flat buffer sharing one weight-decay value.
  struct Run {
    int64_t offset, count;
    float weight_decay;
  };
  std::vector<Run> runs_;
  OptimConfig cfg_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace loom
