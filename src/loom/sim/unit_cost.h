// What one unit (a block, the embedding, the head) costs per micro-batch: its forward,
// backward and recompute passes priced op by op (Note [Cost model] in costs.h), and the
// per-virtual-stage sums the simulator's replay charges (Note [Simulated step]).
#pragma once

#include <vector>

#include "loom/core/config.h"
#include "loom/sim/cluster.h"
#include "loom/sim/costs.h"

namespace loom::sim {

// Where the collectives of a unit's ops run.
struct Places {
  GroupShape tp, cp, dp, p2p, tied;
};

struct Pass {
  double compute = 0, tp = 0, cp = 0, zero = 0;
  double vocab = 0;  // the vocabulary passes' collectives over the pipeline (Note [Vocabulary passes])
  double gemm = 0;   // the GEMM part of compute (not added to total)
  double total() const { return compute + tp + cp + zero + vocab; }
};

// a - b, term by term (a split backward's B is its bwd less its wgt).
Pass minus(Pass a, const Pass& b);
// to += times x p, term by term.
void add_to(Pass& to, const Pass& p, double times = 1);

// Per-micro-batch cost of one block / embedding / head: forward, backward and recompute;
// wgt: the part of bwd that is weight-gradient GEMMs (a block's W step).
struct UnitCost {
  Pass fwd, bwd, recompute, wgt;
  double act_bytes = 0, transient_bytes = 0;
};

// One virtual stage's units summed: what a pipeline step of its chunk costs.
struct ChunkCost {
  Pass fwd, bwd;        // bwd includes recompute
  Pass wgt;             // the part of bwd a split backward runs as W
  double recompute = 0; // seconds of bwd that are recompute
  double act_bytes = 0, transient_bytes = 0, params = 0;
  double w_bytes = 0;   // split backward: upstream gradients kept from B to W
  double fp8_weights = 0;  // Note [fp8 GEMMs]: weights of its fp8 linear layers (cast once a step)
  double offload_buffer = 0;  // Note [Activation offload]: one offloaded layer's activations in transit
};

// Adds a unit's passes `times` over to a virtual stage's sums.
void add_unit(ChunkCost& ch, const UnitCost& u, double times);
// The FLOPs of `ops` (with core_only, the attention core's only: selective recompute).
double flops_of(const std::vector<Op>& ops, bool core_only);
// What a full recompute reruns of a block's `ops`: all of them, or with stops_early (loom's
// engine, Note [Recompute] in model/model.cc) those before the MLP's output projection
// (fc2): the projection, its tp collective and the residual add are not rerun. Megatron's
// and the other frameworks' recompute reruns the whole block.
std::vector<Op> full_recompute_ops(const std::vector<Op>& ops, bool stops_early);
// The passes of the unit made of `ops` under recompute `r`, its tp collectives hidden
// behind its GEMMs with tp_overlap (Note [Tensor-parallel overlap]). weights: the ops are a
// block's, whose dW GEMMs a split backward defers to W (the head's weight gradient is made
// in forward, with the loss). stops_early: full_recompute_ops's.
UnitCost unit_cost(const ClusterSpec& c, const Places& pl, const std::vector<Op>& ops, Recompute r, bool tp_overlap,
                   bool weights = false, bool stops_early = false);

// Note [Fused loss backward]
// loom's engine makes the head's gradients in its forward: lm_head_loss (and the
// vocabulary-parallel loop) computes the loss, dlogits, the head's dW and dX in one pass,
// so the last chunk's F carries the head's whole backward and its B none of it
// (model/vocab_parallel.cc). Priced so for --framework loom: the unit's bwd moves into its
// fwd (the sum is unchanged; where a schedule puts F and B apart, e.g. the last chunk's F
// before another micro-batch's B, the F is the longer step). Megatron and the other
// frameworks run the head's backward in the backward pass, as priced by default.
void fuse_backward_into_forward(UnitCost& u);

}  // namespace loom::sim
