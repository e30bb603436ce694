// The Updater's side of 1-bit, top-k and 0/1 Adam (Note [1-bit Adam], Note [Top-k Adam],
// Note [Compressed Adam with ZeRO], Note [0/1 Adam] in parallel/compress.h): the optimizer
// decides what crosses the dp group.
#include "loom/core/error.h"
#include "loom/parallel/zero.h"
#include "loom/engine/engine.h"
#include "loom/parallel/grad_sync.h"

namespace loom {

// Note [1-bit Adam]: reduce the momentum instead of the gradients; under ZeRO (Note
// [Compressed Adam with ZeRO]) the ranks' g / D, each rank's momentum piece following their mean.
void Updater::step_local(double lr, bool sharded) {
  std::vector<float>& g = e_.model.grads();
  const int64_t frozen_at = cfg_.parallel.compress_warmup(cfg_.train.steps, cfg_.optim.warmup_steps);
  if (!sharded) {
    LOOM_ASSERT(adamw_.owned().size() == 1 && adamw_.owned()[0].offset == 0);
    adamw_.momentum_to_update(g, frozen_at);
    sync_->reduce_update(g.data());
    adamw_.step_with_update(e_.model.params(), g, lr, frozen_at);
    return;
  }
  const RankContext& rc = e_.rc;
  if (frozen_d_.empty()) {  // the first compressed step of this run: D whole, from every rank's pieces
    const std::vector<float> own = adamw_.frozen_preconditioner(frozen_at);
    frozen_d_.assign(g.size(), 0.0f);
    parallel::gather_pieces(*rc.dp, e_.plan, frozen_d_.data(), own.data());
    e_.memory.track(e_.memory.category("optimizer"), frozen_d_.data(), int64_t(frozen_d_.size() * sizeof(float)));
  }
  const float* D = frozen_d_.data();
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < g.size(); i++) g[i] = D[i] > 0.0f ? g[i] / D[i] : 0.0f;
  sync_->reduce_update(g.data());  // whole buckets: the same mean on every rank
  adamw_.step_with_mean_units(e_.model.params(), g, lr, frozen_at);
  if (sync_->every_micro())  // the next step zeroes only the own pieces (Note [Resident memory])
    for (const parallel::Bucket& b : e_.plan.buckets) parallel::release_unowned(b, rc.dp_size, rc.dp_rank, g.data());
}

// Note [0/1 Adam]: gradients all-reduced (exactly or compressed) before the variance
// freezes; local steps after, with the parameter moves synchronised on the schedule's steps.
void Updater::step_zero_one(double lr, int64_t step) {
  const parallel::CompressSpec& spec = sync_->spec();
  const int64_t k = spec.variance_updates(step);
  std::vector<float>& p = e_.model.params();
  std::vector<float>& g = e_.model.grads();
  if (!sync_->local_gradients()) {  // a variance step: g all-reduced exactly
    adamw_.step_counted(p, g, lr, true, k);
    return;
  }
  if (step + 1 <= spec.var_freeze) {  // before the freeze: g / D compressed, v unchanged
    adamw_.update_units(g, k, true);
    sync_->reduce_update(g.data());
    adamw_.update_units(g, k, false);
    adamw_.step_counted(p, g, lr, false, k);
    return;
  }
  // The residuals held g / D until now and hold parameter moves from here (DeepSpeed resets
  // its error buffers at the freeze too); a pure function of the step, so a resume agrees.
  if (step == spec.var_freeze) sync_->reset_compressor_state();
  if (p_sync_.empty()) {  // the first local step since the start: p is the same on every rank
    p_sync_ = p;
    e_.memory.track(e_.memory.category("optimizer"), p_sync_.data(), int64_t(p_sync_.size() * sizeof(float)));
  }
  lr_sum_ += adamw_.step_counted(p, g, lr, false, k);
  if (!spec.local_sync(step)) return;
  std::vector<float>& d = g;  // scratch: the move since the last synchronisation
  for (size_t i = 0; i < p.size(); i++) d[i] = p[i] - p_sync_[i];
  sync_->reduce_update(d.data());
  for (size_t i = 0; i < p.size(); i++) p[i] = p_sync_[i] + d[i];
  p_sync_ = p;
  adamw_.momentum_from_move(d.data(), lr_sum_, k);
  lr_sum_ = 0;
}

}  // namespace loom
