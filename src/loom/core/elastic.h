// An elastic job's layout after it loses (or regains) hosts (Note [Elastic shapes]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/config.h"

namespace loom {

// Note [Elastic shapes]
// When an elastic job (`loom train --hosts ... --elastic MIN:MAX`) loses hosts it goes on with
// the slots left. The model's split (tp, pp, cp, vpp, sp, the schedule) stays, so each rank's
// part is one the newest checkpoint reshards into (Note [Sharded checkpoints]), and data
// parallelism shrinks to the largest dp' whose ranks fit the slots and that keeps the step's
// math: train.batch, the global batch, = micro-batch x grad_accum' x dp' with the micro-batch
// unchanged, so every step trains the same global batch as the uninterrupted run, accumulated
// over more micro-batches (the loader deals a step's sequences by data rank from one global
// order: Note [Global batch]). When no dp' fits (the slots hold not one model replica, or no
// dp' divides batch / micro-batch), the job stops, resumable by hand, and says why.
struct ElasticShape {
  int64_t dp = 0, grad_accum = 0, micro_batch = 0;
  int64_t ranks = 0;    // dp' x the model's split: the slots used
  std::string problem;  // non-empty: no shape fits, and why
};
ElasticShape elastic_shape(const Config& cfg, int64_t slots);

// "--elastic MIN:MAX" (hosts; "N" alone is N:N). Throws ConfigError naming the value.
struct ElasticRange {
  int min_hosts = 0, max_hosts = 0;
};
ElasticRange parse_elastic(const std::string& spec);

}  // namespace loom
