// An elastic job's layout after it loses (or regains) hosts (Note [Elastic shapes]).
#pragma once

#include <cstdint>
#include <functional>
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
// When the slots hold not one replica of the split (or no dp' divides batch / micro-batch), or
// the ranks of that shape do not fit memory, the split is re-planned. The shapes are tried in
// tiers: (1) the split kept; (2) smaller splits, every tp' | tp, pp' | pp, cp' | cp; (3) those
// with a higher ZeRO stage; (4) any split the slots hold, at any ZeRO stage from the config's.
// Each is checked with the engine's own config checks (heads, kv heads and the vocabulary
// divisible by tp', layers over pp' x vpp stages, the sequence over 2cp'; a vpp or a stage
// split that no longer divides is dropped, and with pp' = 1 the schedule is 1f1b), dp' chosen
// as above; within a tier the shape that uses the most slots comes first, then (tiers 1-3) the
// larger tp', pp', cp', the least change, or (tier 4) the smallest split, then the larger tp',
// pp', cp'; then the lower ZeRO stage. The newest checkpoint reshards
// into any of them (Note [Sharded checkpoints]). The supervisor takes the first shape whose
// every rank fits memory by the engine's own estimate (layout_memory_problem: memory.limit_gib,
// and each host's ranks against its memory, every host taken to have what the supervisor's
// has: the planner's assumption of like nodes); the relaunched job's preflight still checks
// each host's own (Note [Host memory preflight]) and stops, naming the host, when one has
// less. `loom simulate --shrink-nodes` takes the first whose simulated peak fits the device.
// Only a parameter-server job, or one whose batch is not whole micro-batches, does not
// re-form; it stops, resumable by hand, and says why.
struct ElasticShape {
  int64_t dp = 0, grad_accum = 0, micro_batch = 0;
  int64_t ranks = 0;    // dp' x the model's split: the slots used
  int64_t tp = 1, pp = 1, cp = 1, vpp = 1, zero = 0;  // the split (the config's unless `replanned`)
  bool replanned = false, sp = false;       // sp, schedule: set when replanned
  bool zero_raised = false;                 // zero is above the config's
  ScheduleKind schedule = ScheduleKind::k1F1B;
  std::string problem;  // non-empty: no shape fits, and why
  // The --set entries that give the config this shape (the split's keys only when replanned).
  std::vector<std::string> sets() const;
  std::string split_text() const;  // "tp 2 pp 1 cp 1"
};
// The first shape for `slots`, in the order above, that `refuses` (when given) returns no reason
// against. None: `problem` says why (no shape passes the config checks, or the first that does
// and what `refuses` said of it).
ElasticShape elastic_shape(const Config& cfg, int64_t slots,
                           const std::function<std::string(const ElasticShape&)>& refuses = {});
// cfg in that shape (its layout and accumulation; the model and the run unchanged).
Config with_shape(const Config& cfg, const ElasticShape& s);

// "--elastic MIN:MAX" (hosts; "N" alone is N:N). Throws ConfigError naming the value.
struct ElasticRange {
  int min_hosts = 0, max_hosts = 0;
};
ElasticRange parse_elastic(const std::string& spec);

}  // namespace loom
