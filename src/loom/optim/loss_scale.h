// Loss scaling for reduced-precision gradients (train.loss_scale).
//
// Note [Dynamic loss scaling]
// Micikevicius et al., "Mixed Precision Training" (ICLR 2018), Sec. 3.2: backward starts
// from S times the loss, so gradients too small for fp16 (below its 2^-24 subnormal step)
// survive the fp16 GEMM inputs; the update uses the gradients divided by S. Dynamic
// scaling (their Sec. 3.2 last paragraph; PyTorch's GradScaler; Megatron's
// DynamicGradScaler) adapts S to the largest value that does not overflow:
//   - a step whose gradients hold an infinity or NaN on any rank is skipped: no parameter,
//     moment or optimizer-step change; S halves;
//   - after `window` consecutive applied steps S doubles (GradScaler: 2^16, x2, x0.5, 2000).
// loom keeps S a power of two (init, min, growth 2 and backoff 1/2 are fixed so), so
// multiplying by S and dividing by it change no bits unless a value leaves the format's
// range: a scaled fp32 or bf16 run equals the unscaled one bit for bit until a step
// overflows (a test holds this).
// Agreement: the overflow test is the global gradient norm, whose sum of squares every rank
// all-reduces over its owned gradients anyway, so one non-finite value anywhere makes every
// rank see a non-finite norm and skip the same step, with no extra collective.
// An overflow at S = train.loss_scale_min is not a range problem but a divergence: the run
// stops with an error naming the step and the scale. A static scale (a number) skips
// overflowing steps without changing S; `none` treats a non-finite gradient as divergence.
// A run whose every step overflows is a runaway, not a range problem (issue 59: at
// optim.lr = 1e30 the weights overflow at step 1 and every later step is skipped): after
// kMaxSkippedInARow consecutive skipped steps the run stops as diverged, whatever the mode.
// 32 lets a dynamic scale back off from 2^32 to 1 before it says so (it stops at its floor
// first with the default train.loss_scale_min).
#pragma once

#include <cstdint>
#include <string>

#include "loom/core/config.h"

namespace loom {

// The checkpointed part (Note [Sharded checkpoints]): scale 0 means no loss scaling.
struct LossScaleState {
  double scale = 0;
  int64_t good_steps = 0;  // applied steps since the last overflow or growth
};

class LossScaler {
 public:
  static constexpr int64_t kMaxSkippedInARow = 32;
  enum class Mode { kNone, kStatic, kDynamic };
  // `o`: the learning rate and warm-up a divergence names (Note [Diverged runs]).
  explicit LossScaler(const TrainConfig& t, const OptimConfig& o = {});

  Mode mode() const { return mode_; }
  bool enabled() const { return mode_ != Mode::kNone; }
  // The factor backward starts from (1 when disabled).
  double scale() const { return enabled() ? state_.scale : 1.0; }
  // After a step's gradients: `finite` = the global gradient norm is finite. Returns true
  // when the update applies, false when the step is skipped (the scale then moves as the
  // note says). Throws loom::Error for an overflow at the floor (dynamic) or without scaling.
  bool update(bool finite, int64_t step);
  int64_t skipped() const { return skipped_; }
  // One line on what happened in the last update ("" when it applied and S did not move).
  const std::string& event() const { return event_; }

  LossScaleState state() const { return enabled() ? state_ : LossScaleState{}; }
  // Resuming: a checkpoint's scale replaces the initial one when it has one.
  void restore(const LossScaleState& s);

 private:
  Mode mode_ = Mode::kNone;
  LossScaleState state_;
  int64_t window_ = 2000;
  double min_ = 1.0;
  double lr_ = 0;
  int64_t warmup_ = 0;
  int64_t skipped_ = 0;
  int64_t skipped_in_a_row_ = 0;  // not checkpointed: a resumed run counts afresh
  std::string event_;
};

// train.loss_scale resolved against train.precision: "auto" is dynamic for fp16, none
// otherwise. Validation (core/config.cc) has refused anything else.
LossScaler::Mode loss_scale_mode(const TrainConfig& t);

}  // namespace loom
