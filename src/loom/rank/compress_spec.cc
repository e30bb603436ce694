// Note [0/1 Adam] and Note [Gradient compressors] (parallel/compress.h): the spec from the
// config, and which steps of a run are exact, compressed or local, as pure functions of the
// step, so every rank and a resumed run agree without saving them.
#include "loom/rank/compress_spec.h"

#include <algorithm>

namespace loom::rank {

CompressSpec compress_spec(const Config& cfg) {
  CompressSpec s;
  s.kind = cfg.parallel.compress;
  if (s.kind == CompressKind::kNone && cfg.comm.grad_dtype == FloatFormat::kBf16) s.kind = CompressKind::kBf16;
  s.ratio = cfg.parallel.compress_ratio;
  s.momentum = cfg.parallel.compress_momentum;
  s.rank = cfg.parallel.compress_rank;
  s.warmup_steps = cfg.parallel.compress_warmup(cfg.train.steps, cfg.optim.warmup_steps);
  s.adasum = cfg.parallel.reduce == GradReduce::kAdasum;
  const ParallelConfig& p = cfg.parallel;
  s.accordion = p.compress_adapt == CompressAdapt::kAccordion;
  s.heavy_rank = p.accordion_heavy_rank;
  s.heavy_ratio = p.heavy_ratio();
  s.window = p.accordion_window;
  s.eta = p.accordion_eta;
  s.seed = uint64_t(cfg.train.seed) ^ 0x636f6d7072657373ull;
  s.var_freeze = p.zero_one_var_freeze_steps >= 0 ? p.zero_one_var_freeze_steps : cfg.optim.warmup_steps;
  s.var_scaler = p.zero_one_var_scaler, s.local_scaler = p.zero_one_local_scaler, s.local_clip = p.zero_one_local_clip;
  s.train_steps = cfg.train.steps, s.save_every = cfg.checkpoint.dir.empty() ? 0 : cfg.checkpoint.save_every;
  s.val_every = cfg.train.val_every;  // "compress": apart from init's stream
  return s;
}

StepSync CompressSpec::sync_at(int64_t step) const {
  if (kind == CompressKind::kZeroOneAdam) {
    // The optimizer compresses the gradients of the other steps itself (Note [0/1 Adam]).
    return step + 1 <= var_freeze && variance_step(step) ? StepSync::kExact : StepSync::kLocal;
  }
  if (!post_backward() || step < warmup_steps) return StepSync::kExact;
  return in_optimizer() ? StepSync::kLocal : StepSync::kCompressed;
}

// Variance steps come in runs of var_scaler at intervals I = 1, 2, 4, ...: run k holds the
// first var_scaler multiples of I = 2^k after the previous run's last step (DeepSpeed
// counts t % I == 0 on the global step and doubles I after var_scaler updates). Counted
// over t <= min(step + 1, var_freeze).
int64_t CompressSpec::variance_updates(int64_t step) const {
  const int64_t t = std::min(step + 1, var_freeze);
  int64_t count = 0, end = 0;
  for (int64_t interval = 1;; interval *= 2) {
    const int64_t first = (end / interval + 1) * interval, last = first + (var_scaler - 1) * interval;
    if (t < first) return count;
    if (t <= last) return count + (t - first) / interval + 1;
    count += var_scaler, end = last;
  }
}

bool CompressSpec::variance_step(int64_t step) const {
  return step + 1 <= var_freeze && variance_updates(step) > (step > 0 ? variance_updates(step - 1) : 0);
}

// Local step j = t - var_freeze (1-based) runs at interval J = min(local_clip,
// 2^floor((j - 1) / local_scaler)) and synchronises when t % J == 0, or when the step must.
bool CompressSpec::local_sync(int64_t step) const {
  const int64_t t = step + 1, j = t - var_freeze;
  if (j < 1) return false;
  if (t == train_steps || (save_every > 0 && t % save_every == 0) || (val_every > 0 && t % val_every == 0))
    return true;
  int64_t interval = 1;
  for (int64_t doublings = (j - 1) / local_scaler; doublings > 0 && interval < local_clip; doublings--) interval *= 2;
  return t % std::min(interval, local_clip) == 0;
}

}  // namespace loom::rank
