// The simulator's communication beside the pipeline: parameter-server rounds (Note
// [Simulated parameter server]), Megatron-core's parameter-gather overlap (Note
// [Parameter-gather overlap]) and ranks beyond a CPU's cores (Note [Oversubscribed cores]),
// with the arithmetic shown.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"
#include "loom/sim/unit_cost.h"

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

// Note [Context-parallel pricing]: each layer's K|V all-gather over cp costs the same
// forward under every framework and its backward reduce-scatter as much again; loom's engine
// gathers again in backward, so its cp time is three such collectives a layer to the GPU
// stack's two (a ring all-gather and reduce-scatter of one size cost the same).
TEST(Simulator, LoomsContextParallelBackwardGathersAgain) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  SimPlan p = plan_of({"model.preset=gpt2", "parallel.dp=4", "train.batch=8", "train.seq=1024"});
  p.cp = 2;
  SimPlan loom = p;
  loom.framework = Framework::kLoom;
  const double mega = simulate(p, c).breakdown.cp_comm, mine = simulate(loom, c).breakdown.cp_comm;
  ASSERT_GT(mega, 0.0);
  EXPECT_NEAR(mine / mega, 1.5, 1e-9);
}

// Note [Ulysses attention] priced: a layer sends its q, k, v rows to heads and its output
// back (two all-to-alls of the rank's n (h + 2 kv) and n h values, attention over all s rows
// for a / cp heads: the all-gather scheme's FLOPs); backward sends dout and dqkv, and loom's
// engine q, k, v again first, so loom's cp time is (3 A + 2 B) / (2 A + 2 B) of Megatron's
// with A, B the two all-to-alls' times.
TEST(Simulator, UlyssesSendsRowsToHeadsAndBack) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  SimPlan p = plan_of({"model.preset=gpt2", "parallel.dp=4", "train.batch=8", "train.seq=1024",
                       "parallel.cp_mode=ulysses"});
  p.cp = 2;
  const ModelConfig& m = p.cfg.model;
  LayerShape x = LayerShape::of(m, p.cfg.micro_batch(), 1024, 1, 2, false, 2);
  x.fused_attention = true;  // loom's one attention op
  LayerShape gather = x;
  x.cp_ulysses = true;
  const double n = double(p.cfg.micro_batch()) * 1024 / 2, h = double(m.d_model);
  std::vector<double> a2a, attention;
  for (const LayerShape& s : {x, gather})
    for (const Op& o : block_forward_ops(s)) {
      if (o.kind == Op::Kind::kComm && o.coll == OpKind::kAllToAll) a2a.push_back(o.bytes);
      if (o.kind == Op::Kind::kAttention) attention.push_back(o.flops);
    }
  ASSERT_EQ(a2a.size(), 2u) << "the all-gather scheme has none";
  EXPECT_DOUBLE_EQ(a2a[0], n * 3 * h * 2);
  EXPECT_DOUBLE_EQ(a2a[1], n * h * 2);
  ASSERT_EQ(attention.size(), 2u);
  EXPECT_NEAR(attention[0], attention[1], 1e-9 * attention[1]);
  SimPlan loom = p;
  loom.framework = Framework::kLoom;
  const GroupShape g = place_group(c, 2, 1);
  const double A = collective_time_s(c, OpKind::kAllToAll, a2a[0], g), B = collective_time_s(c, OpKind::kAllToAll, a2a[1], g);
  const double mega = simulate(p, c).breakdown.cp_comm, mine = simulate(loom, c).breakdown.cp_comm;
  ASSERT_GT(mega, 0.0);
  EXPECT_NEAR(mine / mega, (3 * A + 2 * B) / (2 * A + 2 * B), 1e-9);
}

// Note [Ring attention pricing]: with T one K|V block's shift over the cp ring and A the
// attention kernel's forward time, a layer's exposed cp time is max(0, (cp - 1) T - A)
// forward and max(0, (cp - 1) T - 2.5 A) + cp T backward (the backward kernel recomputes the
// scores from the log-sum-exp; the gradients' shifts wait for their step); at 16K tokens the
// kernel covers the K|V shifts.
TEST(Simulator, RingShiftsHideUnderTheAttentionKernel) {
  ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  c.device.overlap_cost = 0;  // a device whose transfers take no compute (the contention: the test below)
  const ModelConfig m = load_config("", {"model.preset=gpt2"}).model;
  for (const double seq : {512.0, 16384.0}) {
    const int64_t cp = 4;
    LayerShape x = LayerShape::of(m, 1, int64_t(seq), 1, cp, false, 2);
    x.fused_attention = true, x.cp_ring = true;
    const std::vector<Op> ops = block_forward_ops(x);
    double A = 0, bytes = 0;
    for (const Op& o : ops) {
      if (o.kind == Op::Kind::kAttention) A = kernel_time_s(c.device, o);
      if (o.kind == Op::Kind::kComm && o.axis == Axis::kCp) {
        EXPECT_EQ(o.ring_steps, cp);
        bytes = o.bytes;
      }
    }
    EXPECT_DOUBLE_EQ(bytes, 2 * seq / double(cp) * double(m.d_model) * 2);  // n 2 kv dt: one block of K and V
    Places pl;
    pl.cp = place_group(c, cp, 1);
    const double T = collective_time_s(c, OpKind::kSend, bytes, pl.cp);
    const UnitCost u = unit_cost(c, pl, ops, Recompute::kNone, false, false);
    EXPECT_NEAR(u.fwd.cp, std::max(0.0, 3 * T - A), 1e-15) << "seq " << seq;
    EXPECT_NEAR(u.bwd.cp, std::max(0.0, 3 * T - 2.5 * A) + 4 * T, 1e-15) << "seq " << seq;
    if (seq > 1000) EXPECT_EQ(u.fwd.cp, 0.0) << "16K tokens: the kernel covers the shifts";
  }
}

// Note [Ring attention pricing]: on a calibrated attention curve the ring's kernel is cp calls
// over s / cp keys each, priced at the curve's efficiency for one call's FLOPs; the all-gather
// mode's kernel is one call of the same FLOPs. With the curve rising with size, the ring's
// calls run slower.
TEST(Simulator, RingKernelIsCpCallsAtTheirOwnEfficiency) {
  const sim::ClusterSpec c = sim::cluster_from_toml(
      "name = \"cpu\"\nnodes = 1\ndevices_per_node = 4\n[device]\npeak_tflops = 0.1\nmemory_gib = 16\n"
      "memory_gbps = 10\ndtype_bytes = 4\nmixed_precision = false\ngemm_efficiency = [[1, 1.0]]\n"
      "memory_efficiency = [[1, 1.0]]\nattention_efficiency = [[1e6, 0.1], [1e10, 0.8]]\n[intra]\ngbps = 5\n"
      "[inter]\ngbps = 1\n",
      "test");
  const ModelConfig m = load_config("", {"model.preset=gpt2"}).model;
  const int64_t cp = 4;
  auto attention = [&](bool ring) {
    LayerShape x = LayerShape::of(m, 1, 4096, 1, cp, false, 4);
    x.fused_attention = true, x.cp_ring = ring;
    for (const Op& o : block_forward_ops(x))
      if (o.kind == Op::Kind::kAttention) return o;
    return Op{};
  };
  const Op ring = attention(true), gather = attention(false);
  EXPECT_EQ(ring.calls, cp);
  EXPECT_EQ(gather.calls, 1);
  EXPECT_DOUBLE_EQ(ring.flops, gather.flops);
  const double per = ring.flops / double(cp), d = c.device.peak_flops;
  EXPECT_NEAR(kernel_time_s(c.device, ring),
              double(cp) * (per / (d * c.device.attention_efficiency.at(per)) + c.device.kernel_overhead_s), 1e-15);
  EXPECT_GT(kernel_time_s(c.device, ring), kernel_time_s(c.device, gather));
}

// Note [Ring attention pricing] on a device with an overlap cost (a CPU, where the group's
// worker drives the shift beside the kernel): shifts the kernel covers cost overlap_cost of
// their time, not zero; those it does not cover cost their uncovered part as before.
TEST(Simulator, RingShiftsUnderTheKernelCostTheirContention) {
  ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  c.device.overlap_cost = 0.5;
  const ModelConfig m = load_config("", {"model.preset=gpt2"}).model;
  const int64_t cp = 4;
  LayerShape x = LayerShape::of(m, 1, 16384, 1, cp, false, 2);
  x.fused_attention = true, x.cp_ring = true;
  const std::vector<Op> ops = block_forward_ops(x);
  double A = 0, bytes = 0;
  for (const Op& o : ops) {
    if (o.kind == Op::Kind::kAttention) A = kernel_time_s(c.device, o);
    if (o.kind == Op::Kind::kComm && o.axis == Axis::kCp) bytes = o.bytes;
  }
  Places pl;
  pl.cp = place_group(c, cp, 1);
  const double T = collective_time_s(c, OpKind::kSend, bytes, pl.cp);
  ASSERT_LT(3 * T, A) << "16K tokens: the kernel covers the shifts";
  const UnitCost u = unit_cost(c, pl, ops, Recompute::kNone, false, false);
  EXPECT_NEAR(u.fwd.cp, 0.5 * 3 * T, 1e-15);
  EXPECT_NEAR(u.bwd.cp, 0.5 * 3 * T + 4 * T, 1e-15);
}

// Note [Context-parallel copies]: loom's engine (cp_regather) moves rows around each cp
// collective; the op's bytes are the note's counts, in units of a rank's n rows of one
// column (n dt / t): GPT-2 (h 768, 12 heads, no GQA: w2 = 1536, w3 = 2304) at cp 4, 1,024
// tokens a rank, fp32. The GPU stacks' pricing (no regather) has no such op.
TEST(Simulator, ContextParallelCopiesArePricedAsTheEngineMovesThem) {
  const ModelConfig m = load_config("", {"model.preset=gpt2"}).model;
  const double unit = 1024 * 4, h = 768, w2 = 1536, w3 = 2304;
  auto copies = [&](bool ring, bool ulysses, bool loom) {
    LayerShape x = LayerShape::of(m, 1, 4096, 1, 4, false, 4);
    x.fused_attention = true, x.cp_ring = ring, x.cp_ulysses = ulysses, x.cp_regather = loom;
    for (const Op& o : block_forward_ops(x))
      if (o.name == "cp_copies") return std::pair{o.bytes, o.backward_bytes};
    return std::pair{-1.0, -1.0};
  };
  EXPECT_EQ(copies(false, false, true), std::pair(2 * 5 * w2 * unit, 5 * 5 * w2 * unit));  // all-gather, cp 4
  EXPECT_EQ(copies(true, false, true), std::pair((2 * w2 + 3 * h) * unit, (7 * w2 + 2 * h) * unit));
  EXPECT_EQ(copies(false, true, true), std::pair((4 * w3 + 4 * h) * unit, (10 * w3 + 4 * h) * unit));
  EXPECT_EQ(copies(false, false, false).first, -1.0);
}

// Note [Parameter server with model parallelism] priced: with tp 2 x pp 2 workers each rank
// pushes and pulls its own shard (its stage's tp slice) to that shard's S servers, so every
// rank's round is the formula above over its own parameters, the shards' parameters add up
// to the whole model's (replicated tensors once per tp rank), and the job's ranks are
// (W + S) x tp x pp.
TEST(Simulator, ParameterServerWithModelParallelWorkersPricesEachShard) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const int64_t W = 2, S = 2;
  SimPlan p = plan_of({"model.preset=gpt2", "parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "parallel.pp=2",
                       "parallel.ps_servers=2", "train.batch=4", "train.grad_accum=2"});
  EXPECT_EQ(p.cfg.parallel.ranks(), 16);
  const SimResult r = simulate(p, c);
  ASSERT_EQ(r.ranks.size(), 2u);  // one report per stage
  for (const RankReport& w : r.ranks) {
    const double bytes = 4 * w.params;
    const double one_way = std::max(bytes, double(W) * bytes / double(S)) / (c.inter.bw * c.inter.efficiency) + c.inter.latency_s;
    EXPECT_NEAR(w.ps_s, 2 * one_way + memory_time_s(c.device, w.params / double(S) * 32), 1e-12);
    EXPECT_EQ(w.optimizer_s, 0.0);
    EXPECT_EQ(w.memory.optimizer, 0.0);
  }
  SimPlan whole = plan_of({"model.preset=gpt2", "parallel.dp=2", "parallel.ps_servers=2", "train.batch=4",
                           "train.grad_accum=2"});
  const double all = simulate(whole, load_cluster("dgx-a100", {}, 4, "")).ranks[0].params;
  EXPECT_GT(r.ranks[0].params + r.ranks[1].params, all / 2);  // each stage's tp slice
  EXPECT_LT(r.ranks[0].params + r.ranks[1].params, all);
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

// Note [Oversubscribed cores]: a calibrated CPU of 2 threads, kept 0.9 at two ranks a core and
// 0.8 at four, a 300 us wait. 2 ranks: peak / 2, no wait. 4 ranks: peak / 4 x 0.9 and every
// collective 300 us longer (a 2-rank all-reduce of 1 MB at a table's 1 GB/s: 2 x 1/2 x 1e6 /
// 1e9 = 1 ms -> 1.3 ms). 3 ranks: x = 1.5, log-interpolated 1 - 0.1 x log 1.5 / log 2 = 0.9415.
// 8 ranks: 0.8. The two keys round-trip through the TOML.
TEST(Cluster, OversubscribedRanksKeepTheMeasuredThroughputAndWaitAtEveryCollective) {
  ClusterSpec cpu = load_cluster("dgx-a100", {}, 8, "");
  cpu.name = "cpu", cpu.nodes = 1, cpu.devices_per_node = 64;
  cpu.device.shared = true, cpu.device.threads = 2, cpu.device.peak_flops = 1e11;
  cpu.device.oversubscription = {{{1, 1}, {2, 0.9}, {4, 0.8}}};
  cpu.device.oversubscribed_sync_s = 300e-6;
  cpu.busbw = {{"all_reduce", 2, {{{1e3, 1.0}, {1e8, 1.0}}}}};
  const std::string path = ::testing::TempDir() + "/oversubscribed.toml";
  std::ofstream(path) << cluster_to_toml(cpu);
  const ClusterSpec back = cluster_from_toml(cluster_to_toml(cpu), "roundtrip");
  EXPECT_EQ(back.device.oversubscription.points, cpu.device.oversubscription.points);
  EXPECT_NEAR(back.device.oversubscribed_sync_s, 300e-6, 1e-12);
  const GroupShape pair{.ranks = 2, .nodes = 1, .per_node = 2, .shared_memory = true};
  const ClusterSpec two = load_cluster(path, {}, 2, ""), four = load_cluster(path, {}, 4, "");
  EXPECT_DOUBLE_EQ(two.device.peak_flops, 1e11 / 2);
  EXPECT_EQ(two.device.oversubscribed_sync_s, 0.0);
  EXPECT_NEAR(collective_time_s(two, OpKind::kAllReduce, 1e6, pair), 1e-3, 1e-12);
  EXPECT_DOUBLE_EQ(four.device.peak_flops, 1e11 / 4 * 0.9);
  EXPECT_NEAR(collective_time_s(four, OpKind::kAllReduce, 1e6, pair), 1.3e-3, 1e-12);
  EXPECT_NEAR(load_cluster(path, {}, 3, "").device.peak_flops, 1e11 / 3 * 0.9415, 1e11 / 3 * 1e-4);
  EXPECT_DOUBLE_EQ(load_cluster(path, {}, 8, "").device.peak_flops, 1e11 / 8 * 0.8);
  // A wait above 10 ms is refused naming the key and its range.
  try {
    cluster_from_toml(cluster_to_toml(cpu), "bad", {"cluster.device.oversubscribed_sync_us=20000"});
    ADD_FAILURE() << "a 20 ms wait was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.oversubscribed_sync_us = 20000: expected 0 to 10000"),
              std::string::npos)
        << e.what();
  }
  // On a device that is not shared the keys price nothing: refused, naming the fix.
  try {
    cluster_from_toml(cluster_to_toml(cpu), "gpu", {"cluster.device.shared=false"});
    ADD_FAILURE() << "oversubscription on an unshared device was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("set device.shared = true or remove them"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::sim
