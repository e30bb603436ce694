#include "loom/rank/state_bytes.h"

namespace loom::rank {

StateWidths engine_widths(const OptimConfig& o) {
  StateWidths w;
  w.moment = double(o.moment_bytes());
  return w;
}

StateBytes model_state_bytes(double params, int64_t dp, int zero, const StateWidths& w) {
  const double D = double(dp > 1 ? dp : 1);
  StateBytes s;
  s.params = params * w.param / (zero >= 3 ? D : 1);
  s.grads = params * w.grad / (zero >= 2 ? D : 1);
  s.optimizer = params * w.optimizer() / (zero >= 1 ? D : 1);
  return s;
}

}  // namespace loom::rank
