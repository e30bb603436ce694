// A stream's part of the engine (Note [Engine parts]): 2bw's two weight versions or
// pipedream / pipemare's stashes, and their flushing references. The pipeline pass runs the
// stream's executor; a reference's pass computes on the versions the stream would have used.
#pragma once

#include <cstdint>
#include <optional>

#include "loom/engine/estimate.h"
#include "loom/engine/part.h"
#include "loom/parallel/pipeline.h"

namespace loom {

class StreamPart : public Part {
 public:
  // This rank runs the stream (a pipeline stage), or is a rank of its flushing reference.
  virtual bool pipeline() const = 0;
  // The executor's part of step `step` for the pipeline runner; nullopt: the flushing
  // schedule runs as it is (the 2bw reference binds its version around the pass instead).
  virtual std::optional<parallel::PipelineRunner::Stream> executor(int64_t step, bool flush) = 0;
  // Around the pass's forward and backward (the 2bw reference computes on its stash).
  virtual void begin_pass() {}
  virtual void end_pass() {}
  // A GPT pipeline's tied wte: the stream sums the two copies' gradients itself (with each
  // update) rather than the pass at the step's end.
  virtual bool sums_tied_itself(bool flush) const = 0;
  // Note [Part memory estimates], Note [Pipeline streams]: 2bw's second version and pending
  // gradient, pipedream's stashes, pipemare's velocity and corrected weights.
  static void estimate(const EstimateInputs& in, MemoryEstimate& e) {
    const ParallelConfig& par = in.cfg.parallel;
    e.params *= stream_param_copies(par.schedule, int(par.pp), in.pp_rank);
    e.grads *= stream_grad_copies(par.schedule, int(par.pp));
  }
};

}  // namespace loom
