// The simulator's communication beside the pipeline: parameter-server rounds (Note
// [Simulated parameter server]) and Megatron-core's parameter-gather overlap (Note
// [Parameter-gather overlap]), with the arithmetic shown.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "loom/core/config.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

SimPlan plan_of(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.preset=gpt-22b", "model.vocab=256"};
  all.insert(all.end(), sets.begin(), sets.end());
  SimPlan p;
  p.cfg = load_config("", all);
  return p;
}

// Note [Simulated parameter server]: a sync round costs two directions, each the slower of a
// worker's link (P fp32 values) and a server's (W P / S), plus the servers' AdamW on P / S
// parameters; the workers hold no optimizer state and run no all-reduce. With as many
// servers as workers the round is worker-bound; with one server it carries W times the bytes.
TEST(Simulator, ParameterServerRoundIsTheBusiestLinkBothWaysPlusTheServersUpdate) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const LinkTier& link = c.inter;  // 16 ranks span two nodes
  for (int64_t S : {1, 2, 8}) {
    const int64_t W = 16 - S;  // the servers take device slots of the 16
    SimPlan p = plan_of({"model.preset=gpt2", "parallel.dp=" + std::to_string(W), "parallel.ps_servers=" +
                         std::to_string(S), "train.batch=" + std::to_string(W), "train.grad_accum=1"});
    const SimResult r = simulate(p, c);
    const RankReport& w = r.ranks[0];
    const double P = w.params, bytes = 4 * P;
    const double one_way = std::max(bytes, double(W) * bytes / double(S)) / (link.bw * link.efficiency) + link.latency_s;
    EXPECT_NEAR(w.ps_s, 2 * one_way + memory_time_s(c.device, P / double(S) * 32), 1e-12) << "S " << S;
    EXPECT_EQ(w.dp_exposed_s, 0.0);
    EXPECT_EQ(w.optimizer_s, 0.0);
    EXPECT_EQ(w.memory.optimizer, 0.0);
    EXPECT_NEAR(r.step_time_s, w.pipeline_end_s + w.ps_s, 1e-12) << "S " << S;
  }
}

// Note [Simulated parameter server] under ps.sparse_embedding: the table's V d floats of a
// direction become U (d + 1) with U = V (1 - (1 - 1/V)^n), n the worker's tokens per step,
// and the servers update the dense rest plus min(V, W U) rows.
TEST(Simulator, SparseEmbeddingPsMovesTheRowsABatchReads) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  const LinkTier& link = c.intra;
  const int64_t W = 4, S = 4;
  const std::vector<std::string> sets = {"model.preset=llama", "model.vocab=50257", "parallel.dp=4",
                                         "parallel.ps_servers=4", "train.batch=8", "train.grad_accum=1"};
  SimPlan dense = plan_of(sets), sparse = dense;
  sparse.cfg.ps.sparse_embedding = true;
  const RankReport d = simulate(dense, c).ranks[0], s = simulate(sparse, c).ranks[0];
  const ModelConfig& m = sparse.cfg.model;
  const double V = double(m.vocab), dm = double(m.d_model), n = double(2 * sparse.cfg.seq_len());
  const double U = V * (1 - std::pow(1 - 1 / V, n)), moved = d.params - V * dm + U * (dm + 1);
  const double one_way = std::max(4 * moved, double(W) * 4 * moved / double(S)) / (link.bw * link.efficiency) +
                         link.latency_s;
  const double update = (d.params - V * dm + std::min(V, double(W) * U) * dm) / double(S) * 32;
  EXPECT_NEAR(s.ps_s, 2 * one_way + memory_time_s(c.device, update), 1e-12);
  EXPECT_LT(s.ps_s, d.ps_s);
}

// Note [Parameter-gather overlap]: ZeRO-1's parameter all-gather, whole at the step's end
// without the flag; with it, max(t / buckets, t - window) where the window is micro-batch 0's
// forward: never below one bucket's share, below the whole gather when forward is long, and
// the step shorter by exactly what it hides.
TEST(Simulator, ParameterGatherOverlapHidesAllButTheFirstBucket) {
  const ClusterSpec c = load_cluster("dgx-a100", {"cluster.inter.gbps=2"}, 16, "");
  SimPlan p = plan_of({"model.preset=gpt2", "parallel.dp=16", "parallel.zero=1", "train.batch=64",
                       "train.grad_accum=1", "parallel.bucket_mb=25"});
  const SimResult off = simulate(p, c);
  p.param_gather_overlap = true;
  const SimResult on = simulate(p, c);
  const RankReport &a = off.ranks[0], &b = on.ranks[0];
  ASSERT_GT(a.param_gather_s, 0.0);
  const double buckets = std::ceil(a.params * 4 / (25.0 * (1 << 20)));
  EXPECT_GE(b.param_gather_s, a.param_gather_s / buckets - 1e-12);
  EXPECT_LT(b.param_gather_s, a.param_gather_s);
  EXPECT_NEAR(off.step_time_s - on.step_time_s, a.param_gather_s - b.param_gather_s, 1e-12);
  p.cfg.parallel.zero = 0;  // nothing to gather
  EXPECT_EQ(simulate(p, c).ranks[0].param_gather_s, 0.0);
}

}  // namespace
}  // namespace loom::sim
