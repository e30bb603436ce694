// A rank's model-state bytes: the one formula the engine's memory report, the memory budget
// and the simulator use (issue 52: it existed three times and had drifted).
//
// Note [Model-state bytes]
// Rajbhandari et al., "ZeRO", SC'20, section 3.1 and figure 1: with Psi parameters, K bytes
// of optimizer state per parameter and N_d data-parallel ranks, a rank holds
//   params  Psi x w / (N_d if stage >= 3)
//   grads   Psi x g / (N_d if stage >= 2)
//   states  Psi x K / (N_d if stage >= 1),
// w and g the bytes of a compute copy of a parameter and of its gradient. K counts each
// stored moment at its width, plus the fp32 master weights where the compute copy is
// narrower (mixed precision: the paper's K = 12 for Adam is 4 + 2 x 4). loom's CPU engine
// keeps fp32 parameters and gradients that are their own masters, and AdamW's m and v (SGD
// runs in AdamW's state, v kept at zero: Note [SGD with momentum]): 16 bytes a parameter,
// 12 with bf16 moments.
#pragma once

#include <cstdint>

#include "loom/core/config.h"

namespace loom::rank {

// Bytes per parameter of each kind of model state.
struct StateWidths {
  double param = 4, grad = 4;
  double master = 0;  // fp32 masters beside a narrower compute copy (mixed precision)
  double moment = 4;
  int moments = 2;
  double optimizer() const { return master + double(moments) * moment; }  // K
};

struct StateBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

// The CPU engine's widths: fp32 parameters and gradients, two moments of optim.moments.
StateWidths engine_widths(const OptimConfig& o);

// One rank's share of `params` parameters' state under ZeRO stage `zero` over `dp` ranks.
StateBytes model_state_bytes(double params, int64_t dp, int zero, const StateWidths& w);

}  // namespace loom::rank
