// One library of collective cost formulas (Note [Collective cost formulas] in cost.cc),
// shared by comm's algorithm chooser and the simulator. What differs between them is data:
// comm prices loom's own algorithms with the alpha-beta table measured on this machine
// type (Note [Comm cost table]); the simulator prices NCCL-style collectives with a
// cluster preset's link specs and, where calibrated, bus-bandwidth tables.
// Depends on core only (library loom_comm_cost), so the simulator links it without comm.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/comm/types.h"

namespace loom::comm {

// Where a group lies: its size, the nodes it spans, the most members on one node, and
// whether its members share memory (one node, loom's shared segment attached).
struct GroupShape {
  int64_t ranks = 1;
  int64_t nodes = 1;
  int64_t per_node = 1;
  bool shared_memory = false;
};

// The shape of `ranks` members at global-rank `stride` on nodes of `devices_per_node`
// ranks each, ranks numbered node by node (Note [Mesh order]).
GroupShape place_group(int64_t devices_per_node, int64_t ranks, int64_t stride);

// Bytes each member moves per byte of the collective's full buffer in a bandwidth-optimal
// algorithm (nccl-tests' busbw factor): all-reduce 2 (n-1)/n, all-gather, reduce-scatter and
// all-to-all (n-1)/n (a member keeps its own block), a point-to-point message 1.
double bus_factor(OpKind op, int64_t n);

// --- comm: loom's own algorithms, alpha-beta per tier ---------------------------------

struct TierCost {
  double alpha_us = 0;  // per step (a message, or a shared-memory barrier)
  double gbps = 1;      // per-rank bandwidth of one step's payload, 1e9 bytes/s
};

struct CommCostTable {
  TierCost shm;    // shared-memory flags and copies inside a node
  TierCost intra;  // point-to-point messages inside a node
  TierCost inter;  // point-to-point messages between nodes
};

const CommCostTable& default_cost_table();

// Estimated time of one all_reduce of `bytes` per rank; a huge value when the algorithm
// cannot run on this shape.
double all_reduce_estimate_us(Algorithm a, size_t bytes, const GroupShape& g, const CommCostTable& t);
// The cheapest of shm, hierarchical, recursive and ring for this shape; its estimate in *us.
Algorithm cheapest_all_reduce(size_t bytes, const GroupShape& g, const CommCostTable& t, double* us);

// --- simulator: NCCL-style collectives over a cluster's links --------------------------

// A link tier as the simulator describes it: achievable bandwidth (bytes/s) and the
// latency of one step (s).
struct LinkCost {
  double bytes_per_s = 1;
  double latency_s = 0;
};

// Seconds for one collective whose full buffer is `bytes` per rank over `g`: ring inside a
// node, tree across nodes (NCCL's choice at scale), bandwidth of the slowest hop.
double nccl_collective_s(OpKind op, double bytes, const GroupShape& g, const LinkCost& intra, const LinkCost& inter);

}  // namespace loom::comm
