// The one step loop every rank of a CPU job runs (Note [One step loop]).
#pragma once

#include <cstdint>
#include <span>

#include "loom/ckpt/shard_ckpt.h"
#include "loom/train/step_observers.h"

namespace loom {

// Note [One step loop]
// Every rank of a CPU job - a trainer, a PS worker, a PS server - runs run_steps: resume,
// then for each step its role's work, the step's outcome handed to the observers (Note
// [Step observers]) - one checkpoint trigger, one validation, one divergence check for all
// roles - and the heartbeat's step (liveness::enter_step, Note [Failpoints]). A Role is what
// a rank does in a step: a trainer's (or a PS worker's) forward, backward and update
// (train/trainer.cc), or a PS server's round of pushes, mean, update and answers
// (modes/ps/ps_server.cc; under ps.mode = async / ssp the pushes arrive in no step order, so
// a server's run is one step, its outcome the run's last). The observers a role is given
// are the ones it has work for: a server neither logs nor validates (its workers do).
class Role {
 public:
  struct Step {
    StepOutcome outcome;  // outcome.loss unknown yet when deferred
    // Note [2BW without a barrier]: this step's loss arrives with the next step's result
    // (deferred); earlier_* the previous step's, held until now.
    bool deferred = false, has_earlier = false;
    double earlier_loss = 0, earlier_norm = 0;
    bool stop = false;  // Note [Asynchronous parameter server]: the servers ended the run
  };
  virtual ~Role() = default;
  // --resume (collective with every rank's): loads this rank's state, returns the step to
  // go on from (0 when fresh).
  virtual int64_t resume() = 0;
  // Whether step `step` runs (a run that began at `first`).
  virtual bool runs(int64_t step, int64_t first) const = 0;
  virtual Step step(int64_t step) = 0;
  // What a checkpoint saves of this rank, and the parameters it checks for NaN / infinity
  // first (Note [Diverged runs]); saved(): after the save.
  virtual ShardState state() = 0;
  virtual std::span<const float> params() = 0;
  virtual void saved() {}
};

// Runs `role` from its resume point to its end; returns the first step it ran.
int64_t run_steps(Role& role, const Config& cfg, int global_rank, const Spans& spans,
                  std::span<StepObserver* const> observers);

// The finite-loss check every published loss passes (a diverged update stops the run
// before anything is logged or saved from it).
void check_finite_loss(const Config& cfg, int64_t step, double loss);

}  // namespace loom
