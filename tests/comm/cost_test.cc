// The collective cost models on hand-sized cases; each expected number shows its arithmetic.
#include "loom/comm/cost.h"

#include <gtest/gtest.h>

#include <cmath>

namespace loom::comm {
namespace {

const CommCostTable kTable{{1.0, 10.0}, {5.0, 6.0}, {60.0, 1.0}};  // round numbers for the arithmetic

TEST(CommCost, FormulasOnHandSizedCases) {
  const GroupShape two_local{2, 1, 2, true};
  // Ring, 2 ranks, 1 MiB, intra tier: 2 steps x (5 us + 524288 B / 6000 B/us).
  EXPECT_NEAR(all_reduce_estimate_us(Algorithm::kRing, 1 << 20, two_local, kTable), 2 * (5 + 524288 / 6000.0), 1e-9);
  // Shm, 1 MiB: 4 chunks of 256 KiB x 2 barriers x 1 us + 1048576 B / 10000 B/us.
  EXPECT_NEAR(all_reduce_estimate_us(Algorithm::kShm, 1 << 20, two_local, kTable), 8 + 104.8576, 1e-9);
  // Recursive, 4 ranks (a power of two), 4 KiB <= 32 KiB: 2 doubling steps of the whole buffer.
  const GroupShape four_local{4, 1, 4, false};
  EXPECT_NEAR(all_reduce_estimate_us(Algorithm::kRecursive, 4096, four_local, kTable), 2 * (5 + 4096 / 6000.0), 1e-9);
  // Recursive, 3 ranks, 1 MiB: fold + unfold of the whole buffer, then 2 x 1 halving steps
  // over q = 2: 2 (5 + 1048576/6000) + 2 x 5 + (2 x 1/2) x 1048576/6000.
  const GroupShape three_local{3, 1, 3, false};
  EXPECT_NEAR(all_reduce_estimate_us(Algorithm::kRecursive, 1 << 20, three_local, kTable),
              2 * (5 + 1048576 / 6000.0) + 10 + 1048576 / 6000.0, 1e-9);
  // Hierarchical, 2 nodes x 2 ranks, 64 MiB: shm (512 barriers + 67108864/10000) + leader
  // ring over the inter tier 2 x (60 + 33554432/1000) + 1 broadcast step 5 + 67108864/6000.
  const GroupShape two_by_two{4, 2, 2, false};
  const double mb64 = 64.0 * (1 << 20);
  EXPECT_NEAR(all_reduce_estimate_us(Algorithm::kHierarchical, 64 << 20, two_by_two, kTable),
              (512 + mb64 / 10000) + 2 * (60 + mb64 / 2 / 1000) + (5 + mb64 / 6000), 1e-6);
  EXPECT_TRUE(std::isinf(all_reduce_estimate_us(Algorithm::kShm, 4096, two_by_two, kTable)));
  EXPECT_TRUE(std::isinf(all_reduce_estimate_us(Algorithm::kHierarchical, 4096, two_local, kTable)));
}

// The simulator's NCCL prices (Note [Collective cost formulas]): 16 nodes x 8 GPUs, 64 MiB,
// intra 100 GB/s + 2 us a step, inter 10 GB/s + 10 us. The bus bandwidth term is the
// inter-node link's 8 x 10 GB/s (< 100) for every op. All-reduce (NCCL's tree across
// nodes): 2 passes x (7 intra + log2 16 = 4 inter steps); all-gather and reduce-scatter
// (rings only): a piece crosses all 127 hops, 15 between nodes and 128 - 16 = 112 inside one.
TEST(CommCost, NcclAllGatherIsARingAcrossNodes) {
  GroupShape g;
  g.ranks = 128, g.nodes = 16, g.per_node = 8;
  const LinkCost intra{100e9, 2e-6}, inter{10e9, 10e-6};
  const double bytes = 64.0 * (1 << 20), bw = 8 * 10e9;
  EXPECT_NEAR(nccl_collective_s(OpKind::kAllReduce, bytes, g, intra, inter),
              2 * 127.0 / 128 * bytes / bw + 2 * (7 * 2e-6 + 4 * 10e-6), 1e-12);
  for (OpKind op : {OpKind::kAllGather, OpKind::kReduceScatter})
    EXPECT_NEAR(nccl_collective_s(op, bytes, g, intra, inter), 127.0 / 128 * bytes / bw + 112 * 2e-6 + 15 * 10e-6,
                1e-12);
}

TEST(CommCost, ChoicesFollowTheShape) {
  double us = 0;
  const GroupShape two_local{2, 1, 2, true};
  EXPECT_EQ(cheapest_all_reduce(4096, two_local, kTable, &us), Algorithm::kShm);
  EXPECT_EQ(cheapest_all_reduce(size_t{256} << 20, two_local, kTable, &us), Algorithm::kShm);
  const GroupShape two_by_two{4, 2, 2, false};
  EXPECT_EQ(cheapest_all_reduce(size_t{64} << 20, two_by_two, kTable, &us), Algorithm::kHierarchical);
  EXPECT_EQ(cheapest_all_reduce(4096, two_by_two, kTable, &us), Algorithm::kRecursive);  // 2 steps beat 2 tiers
  const GroupShape eight_nodes{8, 8, 1, false};
  EXPECT_EQ(cheapest_all_reduce(size_t{64} << 20, eight_nodes, kTable, &us), Algorithm::kRecursive);  // fewer steps
  const GroupShape six_nodes{6, 6, 1, false};
  EXPECT_EQ(cheapest_all_reduce(size_t{64} << 20, six_nodes, kTable, &us), Algorithm::kRing);  // no fold copy
  EXPECT_GT(us, 0);
}

}  // namespace
}  // namespace loom::comm
