// ZeRO-2/3's per-layer traffic as each framework spends it (Note [Sharding
// implementations] in zero_cost.cc), and which ZeRO stages each framework implements.
#pragma once

#include "loom/sim/replay.h"

namespace loom::sim {

// Per layer and micro-batch: the ZeRO-2/3 seconds the layer's compute does not hide, in
// its forward and in its backward (recompute included). keep: parallel.zero_keep holds the
// layer's parameters gathered for the step (its forward gather is spread over the m
// micro-batches and backward gathers nothing).
struct ZeroLayerCost {
  double fwd = 0, bwd = 0;
};
ZeroLayerCost zero_layer_cost(const Setup& s, const UnitCost& block, Recompute r, bool keep);

// One collective in torch.distributed's list form over group g (a list of g.ranks per-rank
// views of a `bytes` buffer): the NCCL collective, one copy kernel per rank and the copies'
// memory traffic (Note [Sharding implementations], (b)).
double list_collective_s(const ClusterSpec& c, OpKind op, double bytes, const GroupShape& g);

// A setting the framework does not run (a ZeRO stage, ZeRO++, BACKWARD_POST, an early-stopped
// recompute): ConfigError naming what does.
void check_framework_runs(const SimPlan& plan);

}  // namespace loom::sim
