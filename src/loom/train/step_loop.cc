#include "loom/train/step_loop.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/liveness.h"

namespace loom {

void check_finite_loss(const Config& cfg, int64_t step, double loss) {
  if (!std::isfinite(loss))
    throw diverged(detail::cat("loss is ", loss, " at step ", step + 1), cfg.optim.lr, cfg.optim.warmup_steps);
}

namespace {

// Hands a finished step to the observers (Note [Step observers]). A 2bw step whose loss comes
// with the next step's result (Note [2BW without a barrier]) is held until then.
void publish(const Config& cfg, const Role::Step& s, StepOutcome& held, std::span<StepObserver* const> observers) {
  if (s.has_earlier) {
    held.loss = s.earlier_loss;
    if (updates_per_batch(cfg.parallel.schedule)) held.norm = s.earlier_norm;  // 2bw's was known at its step
    check_finite_loss(cfg, held.step, held.loss);
    for (StepObserver* o : observers) o->after_step(held);
  }
  if (s.deferred) held = s.outcome;
  else
    for (StepObserver* o : observers) o->after_step(s.outcome);
}

}  // namespace

int64_t run_steps(Role& role, const Config& cfg, int global_rank, const Spans& spans,
                  std::span<StepObserver* const> observers) {
  const int64_t first = role.resume();
  StepOutcome held;  // a 2bw step whose loss comes with the next step's result
  for (int64_t step = first; role.runs(step, first); step++) {
    liveness::enter_step(step, global_rank);  // the heartbeat's step; Note [Failpoints]
    Trace::Args args;  // Note [Trace schema]: a stream's flush marked
    if (streams(cfg.parallel.schedule) && flushes_pipeline(cfg, step)) args.push_back({"flush", 1});
    const Spans::Scope step_span = spans.open("step " + std::to_string(step + 1), "step", std::move(args));
    const Role::Step s = role.step(step);
    // A skipped step's loss is checked too: the forward pass has no loss scale, so a
    // non-finite loss there means the weights themselves ran away (issue 59).
    if (!s.deferred) check_finite_loss(cfg, step, s.outcome.loss);
    publish(cfg, s, held, observers);
    if (s.stop || std::any_of(observers.begin(), observers.end(), [](const StepObserver* o) { return o->stops(); }))
      break;
  }
  return first;
}

}  // namespace loom
