// What a rank's engine will hold, per memory category, before anything is allocated.
//
// Note [Part memory estimates]
// The estimate is what the parts the engine would be made of hold (Note [Engine parts]),
// each part kind stating its own share as a pure function of the config, beside its code:
//   the update rule (engine.cc)  a plain replica: fp32 parameters and gradients whole, and
//                                the moments (ZeRO-1 and up: this rank's piece;
//                                Note [Model-state bytes]);
//   GatherPart (parts.cc)        ZeRO-3: the own parameter pieces and the gather pool;
//   SyncPart (parts.cc)          ZeRO-2/3: the gradient pieces (whole under a stateful
//                                compressor or Adasum, Note [Compressed ZeRO-2/3]); ZeRO-2
//                                also the others' share of the gradients not yet reduced
//                                (Note [Unreduced gradients]);
//   PsPart (modes/ps)            a parameter server's worker: no optimizer state;
//   OffloadPart (modes/offload)  the file's buffers in place of the state it holds, and
//                                what offloading the parameters would leave (for remedies);
//   StreamPart (modes/stream)    the streams' extra weight versions and gradients.
// The table in estimate_parts applies them in that order (each reads what came before: the
// streams multiply the offloaded sizes, offload reads the gather pool). A new mode that
// holds state adds its entry there.
#pragma once

#include <cstdint>

#include "loom/core/config.h"

namespace loom {

// Bytes this rank's layout needs per category before buffers (those are measured only).
struct MemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  int64_t optimizer_in_memory = 0;  // what the optimizer state would take without offload
  int64_t moment_floats = 0;        // floats of each moment on this rank
  int64_t params_offloaded = 0;     // what the parameters would take with offload.params = disk
  int64_t gather_pool = 0;          // ZeRO-3: the gathered units in flight, whole
  int64_t total() const { return params + grads + optimizer + activations; }
};

struct EstimateInputs {
  const Config& cfg;
  int zero = 0, dp = 1;
  int64_t params = 0;            // floats on this rank (its tp / pp part)
  int64_t activation_bytes = 0;  // the model's activation carve
  int64_t units_in_flight = 0;   // floats of its three largest units (Note [Chunk manager])
  int pp_rank = 0;
  // ZeRO-2 and 3 (dp > 1): the most floats of unreduced gradients resident at once (Note
  // [Unreduced gradients]); 0: the whole part.
  int64_t unreduced_floats = 0;
  int64_t shards() const { return dp > 1 ? dp : 1; }
  int64_t param_bytes() const { return params * int64_t(sizeof(float)); }  // fp32: params, grads, each moment
};

MemoryEstimate estimate_parts(const EstimateInputs& in);

}  // namespace loom
