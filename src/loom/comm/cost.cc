#include "loom/comm/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::comm {

// Note [Collective cost formulas]
// Every estimate is alpha-beta: steps x per-step latency + bytes on the busiest link /
// its bandwidth. The bandwidth term of a bandwidth-optimal collective over n members is
// bus_factor x bytes (each member sends and receives (n-1)/n of the buffer per pass; an
// all-reduce is two passes, reduce-scatter then all-gather). Algorithms differ in their
// step counts: a ring takes n-1 steps per pass, recursive doubling log2 n, a tree across
// nodes ceil(log2 nodes) (NCCL's all-reduce at scale; its all-gather and reduce-scatter
// stay rings, nodes - 1 inter-node steps). comm prices each of its own algorithms step by step (below) to
// choose one; the simulator prices the algorithm NCCL picks at scale (nccl_collective_s).

GroupShape place_group(int64_t devices_per_node, int64_t ranks, int64_t stride) {
  GroupShape g;
  g.ranks = ranks;
  const int64_t dpn = devices_per_node;
  g.per_node = stride >= dpn ? 1 : std::max<int64_t>(1, std::min(ranks, dpn / std::max<int64_t>(1, stride)));
  g.nodes = (ranks + g.per_node - 1) / g.per_node;
  return g;
}

double bus_factor(OpKind op, int64_t ranks) {
  const double n = double(ranks);
  if (op == OpKind::kAllReduce) return 2 * (n - 1) / n;
  if (op == OpKind::kAllGather || op == OpKind::kReduceScatter || op == OpKind::kAllToAll) return (n - 1) / n;
  return 1;
}

double nccl_collective_s(OpKind op, double bytes, const GroupShape& g, const LinkCost& intra, const LinkCost& inter) {
  if (g.ranks <= 1 || bytes <= 0) return 0;
  const bool p2p = op == OpKind::kSend || op == OpKind::kRecv;
  double bw = intra.bytes_per_s;
  if (g.nodes > 1) bw = p2p ? inter.bytes_per_s : std::min(intra.bytes_per_s, double(g.per_node) * inter.bytes_per_s);
  const double passes = op == OpKind::kAllReduce ? 2 : 1;
  double latency = 0;
  if (p2p) {
    latency = g.nodes > 1 ? inter.latency_s : intra.latency_s;
  } else if (op == OpKind::kAllGather || op == OpKind::kReduceScatter) {
    // NCCL runs all-gather and reduce-scatter as rings only (its tree algorithm is for
    // all-reduce): a piece travels ranks - 1 hops, nodes - 1 of them between nodes and the
    // rest inside one (NCCL's own tuning model counts its ring steps so: src/graph/tuning.cc).
    latency = double(g.ranks - g.nodes) * intra.latency_s + double(g.nodes - 1) * inter.latency_s;
  } else {
    latency = passes * (double(g.per_node - 1) * intra.latency_s + std::ceil(std::log2(double(g.nodes))) * inter.latency_s);
  }
  return bus_factor(op, g.ranks) * bytes / bw + latency;
}

// Note [Comm cost table]
// Measured on this machine type (2-core AMD EPYC VM, OpenMPI 4.1.4), 2026-11-22, with
// `mpirun -np 2 loom bench comm --algorithm all` (docs/log/benchmarks.md):
//   shm:   alpha 1.2 us  - 4 KiB shm all-reduce takes 2.8 us for 2 barriers + copies;
//          10 GB/s       - shm busbw 9.5-10.9 GB/s from 256 KiB to 16 MiB.
//   intra: alpha 5 us    - ring at 4 KiB: 10.4 us for 2 steps (OpenMPI vader);
//          6 GB/s        - ring busbw 6.2-6.4 GB/s at 16 MiB.
//   inter: alpha 60 us   - recursive 4 KiB across two veth namespaces: ~113 us for 2 steps;
//          1.0 GB/s      - ring across the unshaped veth pair, 64 MiB: 0.78 GB/s busbw
//                          with 4 ranks on 2 cores (CPU-bound; a real 10 GbE link is 1.25).
const CommCostTable& default_cost_table() {
  static const CommCostTable table{{1.2, 10.0}, {5.0, 6.0}, {60.0, 1.0}};
  return table;
}

namespace {

constexpr double kImpossible = std::numeric_limits<double>::infinity();
constexpr size_t kShmSlotBytes = size_t{256} << 10;  // SharedSegment::kSlotBytes
constexpr size_t kDoublingMaxBytes = 32 << 10;      // recursive_all_reduce's switch

double us_for(double bytes, const TierCost& t) { return bytes / (t.gbps * 1e3); }  // GB/s -> bytes/us

// Ring all-reduce: 2 (p-1) steps, each moving bytes / p.
double ring_us(double bytes, int64_t p, const TierCost& t) {
  if (p <= 1) return 0;
  return 2.0 * double(p - 1) * t.alpha_us + us_for(bus_factor(OpKind::kAllReduce, p) * bytes, t);
}

// Recursive: fold to a power of two q (one whole-buffer step each way when p != q), then
// whole-vector doubling (log2 q steps of `bytes`) below 32 KiB, else halving + doubling.
double recursive_us(double bytes, int64_t p, const TierCost& t) {
  if (p <= 1) return 0;
  int64_t q = 1, lg = 0;
  while (q * 2 <= p) {
    q *= 2;
    ++lg;
  }
  double us = p != q ? 2 * (t.alpha_us + us_for(bytes, t)) : 0;
  if (bytes <= kDoublingMaxBytes) return us + double(lg) * (t.alpha_us + us_for(bytes, t));
  return us + 2.0 * double(lg) * t.alpha_us + us_for(bus_factor(OpKind::kAllReduce, q) * bytes, t);
}

// Shared memory: two barriers per 256 KiB chunk, and the copies at shm bandwidth.
double shm_us(double bytes, const TierCost& t) {
  const double chunks = std::max(1.0, std::ceil(bytes / kShmSlotBytes));
  return 2 * chunks * t.alpha_us + us_for(bytes, t);
}

}  // namespace

double all_reduce_estimate_us(Algorithm a, size_t bytes_in, const GroupShape& g, const CommCostTable& t) {
  const double bytes = static_cast<double>(bytes_in);
  const TierCost& p2p = g.nodes > 1 ? t.inter : t.intra;  // the slowest link sets a flat algorithm's pace
  switch (a) {
    case Algorithm::kShm: return g.shared_memory ? shm_us(bytes, t.shm) : kImpossible;
    case Algorithm::kRing: return ring_us(bytes, g.ranks, p2p);
    case Algorithm::kRecursive: return recursive_us(bytes, g.ranks, p2p);
    case Algorithm::kHierarchical: {
      if (g.nodes <= 1 || g.per_node <= 1) return kImpossible;  // one member per node: it is the ring
      // Node all-reduce (shm), ring among leaders, binomial broadcast inside the node.
      const double local = g.per_node > 1 ? shm_us(bytes, t.shm) : 0;
      const double bcast = std::ceil(std::log2(double(std::max<int64_t>(1, g.per_node)))) * (t.intra.alpha_us + us_for(bytes, t.intra));
      return local + ring_us(bytes, g.nodes, t.inter) + bcast;
    }
    default: return kImpossible;
  }
}

Algorithm cheapest_all_reduce(size_t bytes, const GroupShape& g, const CommCostTable& t, double* us) {
  Algorithm best = Algorithm::kRing;
  double best_us = kImpossible;
  for (Algorithm a : {Algorithm::kShm, Algorithm::kHierarchical, Algorithm::kRecursive, Algorithm::kRing}) {
    const double e = all_reduce_estimate_us(a, bytes, g, t);
    if (e < best_us) {
      best_us = e;
      best = a;
    }
  }
  if (us) *us = best_us;
  return best;
}

}  // namespace loom::comm
