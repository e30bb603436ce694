// The small cost model that picks an all-reduce algorithm (and that the simulator can
// price collectives with): per tier one latency and one bandwidth, and one formula per
// algorithm. Note [Comm cost table] in cost.cc says where each number comes from.
#pragma once

#include <cstddef>
#include <string>

#include "loom/comm/types.h"

namespace loom::comm {

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

// What a group offers: its size, how many nodes it spans, largest members-per-node, and
// whether its members share memory (one node).
struct GroupShape {
  int ranks = 1;
  int nodes = 1;
  int per_node = 1;
  bool shared_memory = false;
};

// Estimated time of one all_reduce of `bytes` per rank; a huge value when the algorithm
// cannot run on this shape.
double all_reduce_estimate_us(Algorithm a, size_t bytes, const GroupShape& g, const CommCostTable& t);
// The cheapest of shm, hierarchical, recursive and ring for this shape; its estimate in *us.
Algorithm cheapest_all_reduce(size_t bytes, const GroupShape& g, const CommCostTable& t, double* us);

}  // namespace loom::comm
