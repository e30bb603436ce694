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
// order: Note [Global batch]).
//
// When the slots hold not one replica of the split (or no dp' divides batch / micro-batch),
// the split is re-planned: every tp' | tp, pp' | pp, cp' | cp whose ranks fit is tried with the
// engine's own config checks (heads, kv heads and the vocabulary divisible by tp', layers over
// pp' x vpp stages, the sequence over 2cp'; a vpp or a stage split that no longer divides is
// dropped, and with pp' = 1 the schedule is 1f1b), dp' chosen as above; the shape that uses the
// most slots wins, then the larger tp', then pp' (the least change). The newest checkpoint
// reshards into any of them (Note [Sharded checkpoints]). Whether its ranks fit their hosts'
// memory is the relaunched job's preflight (Note [Host memory preflight]): a shape that does
// not is refused before step 1, naming the host, and the job stops. Only a parameter-server
// job, or one whose batch is not whole micro-batches, does not re-form; it stops, resumable by
// hand, and says why.
struct ElasticShape {
  int64_t dp = 0, grad_accum = 0, micro_batch = 0;
  int64_t ranks = 0;    // dp' x the model's split: the slots used
  int64_t tp = 1, pp = 1, cp = 1, vpp = 1;  // the split (the config's unless `replanned`)
  bool replanned = false, sp = false;       // sp, schedule: set when replanned
  ScheduleKind schedule = ScheduleKind::k1F1B;
  std::string problem;  // non-empty: no shape fits, and why
  // The --set entries that give the config this shape (the split's keys only when replanned).
  std::vector<std::string> sets() const;
  std::string split_text() const;  // "tp 2 pp 1 cp 1"
};
ElasticShape elastic_shape(const Config& cfg, int64_t slots);
// cfg in that shape (its layout and accumulation; the model and the run unchanged).
Config with_shape(const Config& cfg, const ElasticShape& s);

// "--elastic MIN:MAX" (hosts; "N" alone is N:N). Throws ConfigError naming the value.
struct ElasticRange {
  int min_hosts = 0, max_hosts = 0;
};
ElasticRange parse_elastic(const std::string& spec);

}  // namespace loom
