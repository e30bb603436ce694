#include "loom/train/optimizer.h"

#include <cmath>

namespace loom {

double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const double min_lr = o.lr * o.min_lr_ratio;
  const int64_t decay_steps = total_steps - o.warmup_steps;
  if (decay_steps <= 0) return o.lr;
  const double progress = std::min(1.0, double(step - o.warmup_steps) / double(decay_steps));
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double clip_grad_norm(const Kernels& k, std::vector<float>& grads, double max_norm) {
  const double norm = std::sqrt(k.sum_squares(grads.data(), int64_t(grads.size())));
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) k.scale_inplace(grads.data(), int64_t(grads.size()), float(coef));
  }
  return norm;
}

AdamW::AdamW(const ParamLayout& layout, const OptimConfig& cfg)
    : cfg_(cfg), m_(layout.total_floats(), 0.0f), v_(layout.total_floats(), 0.0f) {
  // A new run starts wherever the decay value changes. Alignment padding belongs to the
  // run before it; padding params and grads are zero and stay zero under any decay.
  for (const ParamSpec& s : layout.specs()) {
    const float wd = s.decay ? float(cfg.weight_decay) : 0.0f;
    if (runs_.empty() || runs_.back().weight_decay != wd) runs_.push_back({s.offset, 0, wd});
  }
  // Each run extends to the start of the next (or the end of the buffer).
  for (size_t i = 0; i < runs_.size(); i++)
    runs_[i].count = (i + 1 < runs_.size() ? runs_[i + 1].offset : layout.total_floats()) - runs_[i].offset;
}

void AdamW::step(const Kernels& k, std::vector<float>& params, const std::vector<float>& grads, double lr) {
  t_++;
  for (const Run& r : runs_)
    k.adamw_update(params.data() + r.offset, grads.data() + r.offset, m_.data() + r.offset, v_.data() + r.offset,
                   r.count, float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), r.weight_decay, t_);
}

}  // namespace loom
