#include "loom/optim/loss_scale.h"

#include <cmath>
#include <sstream>

#include "loom/core/error.h"

namespace loom {

LossScaler::Mode loss_scale_mode(const TrainConfig& t) {
  switch (loss_scale_kind(t.loss_scale)) {
    case LossScaleKind::kAuto: return t.precision == Precision::kFp16 ? LossScaler::Mode::kDynamic : LossScaler::Mode::kNone;
    case LossScaleKind::kDynamic: return LossScaler::Mode::kDynamic;
    case LossScaleKind::kNone: return LossScaler::Mode::kNone;
    case LossScaleKind::kStatic: break;
  }
  return LossScaler::Mode::kStatic;
}

LossScaler::LossScaler(const TrainConfig& t, const OptimConfig& o)
    : mode_(loss_scale_mode(t)), window_(t.loss_scale_window), min_(t.loss_scale_min), lr_(o.lr),
      warmup_(o.warmup_steps) {
  if (mode_ == Mode::kDynamic) state_.scale = t.loss_scale_init;
  if (mode_ == Mode::kStatic) state_.scale = std::stod(t.loss_scale);
}

void LossScaler::restore(const LossScaleState& s) {
  if (!enabled() || !(s.scale > 0)) return;  // a checkpoint without a scale keeps the initial one
  if (mode_ == Mode::kDynamic) state_ = s;
}

bool LossScaler::update(bool finite, int64_t step) {
  event_.clear();
  std::ostringstream os;
  if (!finite) {
    if (mode_ == Mode::kNone)
      throw diverged(detail::cat("the gradients hold NaN or infinity at step ", step + 1, " (train.loss_scale = none)"),
                     lr_, warmup_, "With train.precision = fp16 use train.loss_scale = dynamic");
    if (mode_ == Mode::kDynamic && state_.scale <= min_)
      throw diverged(detail::cat("the gradients hold NaN or infinity at step ", step + 1,
                                 " even at the loss scale floor train.loss_scale_min = ", min_),
                     lr_, warmup_);
    skipped_++;
    if (++skipped_in_a_row_ >= kMaxSkippedInARow)
      throw diverged(detail::cat(skipped_in_a_row_, " steps in a row up to step ", step + 1,
                                 " overflowed and were skipped at loss scale ", state_.scale),
                     lr_, warmup_, "Set a lower train.loss_scale");
    state_.good_steps = 0;
    os << "step " << step + 1 << " skipped: gradient overflow at loss scale " << state_.scale;
    if (mode_ == Mode::kDynamic) {
      state_.scale = std::max(min_, state_.scale * 0.5);
      os << ", scale now " << state_.scale;
    }
    event_ = os.str();
    return false;
  }
  skipped_in_a_row_ = 0;
  if (mode_ == Mode::kDynamic && ++state_.good_steps >= window_) {
    state_.good_steps = 0;
    state_.scale *= 2.0;
    os << "step " << step + 1 << ": " << window_ << " steps without overflow, loss scale now " << state_.scale;
    event_ = os.str();
  }
  return true;
}

}  // namespace loom
