// Note [0/1 Adam] (compress.h): which steps of a run are exact, compressed or local, as pure
// functions of the step, so every rank and a resumed run agree without saving them.
#include <algorithm>

#include "loom/parallel/compress.h"

namespace loom::parallel {

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

}  // namespace loom::parallel
