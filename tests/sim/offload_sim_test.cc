// Optimizer offload in the simulator and the planner (Note [Optimizer offload]): the
// moments priced on the cluster's offload tier, and loom plan offering offload where a
// model does not fit otherwise.
#include <gtest/gtest.h>

#include <set>

#include "loom/core/error.h"
#include "loom/plan/search.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

SimPlan gpt(const std::string& preset, int64_t gpus, bool offload) {
  SimPlan p;
  p.cfg = load_config("", {"model.preset=" + preset, "parallel.dp=" + std::to_string(gpus), "train.batch=8",
                           "train.grad_accum=" + std::to_string(8 / gpus), "parallel.recompute=full"});
  if (offload) p.cfg.offload.optimizer = loom::OffloadTier::kDisk, p.cfg.offload.dir = "/var/tmp";
  p.framework = Framework::kLoom;
  return p;
}

// GPT 7.5B, global batch 8, on one A100 (`cluster` overrides its spec): the 3 best plans.
plan::PlanRequest gpt_7_5b_on_one_a100(const std::vector<std::string>& cluster) {
  plan::PlanRequest req;
  req.like = gpt("gpt-7.5b", 1, false);
  req.global_batch = 8;
  req.top = 3;
  req.refine = false;
  req.cluster = load_cluster("dgx-a100", cluster, 1, "");
  return req;
}

// Every plan found offloads what `label` names and fits the device; the best emits `toml`.
void expect_offloading(const plan::PlanRequest& req, const std::string& label, const std::string& toml) {
  const plan::PlanReport found = plan::search_plans(req);
  ASSERT_FALSE(found.ranked.empty());
  for (const plan::PlanCandidate& c : found.ranked) {
    EXPECT_NE(plan::layout_label(c.plan).find(label), std::string::npos) << plan::layout_label(c.plan);
    EXPECT_LE(c.result.peak_memory_bytes, req.cluster.device.memory_bytes);
  }
  EXPECT_NE(plan::emit_loom_toml(found.ranked[0].plan).find(toml), std::string::npos);
}

// GPT 1.7B on 8 A100s, ZeRO-1: the moments (8 bytes a parameter, sharded over dp 8) leave
// device memory for 3 x 2 x 16 MiB of buffers, and the optimizer phase lasts as long as
// reading them at 3.5 GB/s and writing them at 1.9 GB/s (dgx-a100's [offload] tier).
TEST(Simulator, OptimizerOffloadPricesTheMomentsOnTheTier) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  SimPlan in_memory = gpt("gpt-1.7b", 8, false), offload = gpt("gpt-1.7b", 8, true);
  in_memory.cfg.parallel.zero = offload.cfg.parallel.zero = 1;
  const SimResult a = simulate(in_memory, c), b = simulate(offload, c);
  const double params = a.ranks[0].params, moment_bytes = 8 * params / 8;
  EXPECT_NEAR(a.ranks[0].memory.optimizer - b.ranks[0].memory.optimizer, moment_bytes - 3 * 2 * 16 * double(1 << 20), 1);
  EXPECT_NEAR(b.ranks[0].offload_io_s, moment_bytes / 3.5e9 + moment_bytes / 1.9e9, 1e-9);
  EXPECT_DOUBLE_EQ(b.ranks[0].optimizer_s, std::max(a.ranks[0].optimizer_s, b.ranks[0].offload_io_s));
  EXPECT_NEAR(b.step_time_s - a.step_time_s, b.ranks[0].optimizer_s - a.ranks[0].optimizer_s, 1e-9);
  EXPECT_EQ(a.ranks[0].offload_io_s, 0.0);
}

TEST(Simulator, OptimizerOffloadNeedsATier) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  ClusterSpec none = c;
  none.offload = OffloadTier{};
  try {
    simulate(gpt("gpt-1.7b", 8, true), none);
    FAIL() << "priced offload on a cluster without a tier";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no offload tier; give it one (--set cluster.offload.read_gbps=R"),
              std::string::npos)
        << e.what();
  }
  // The tier round-trips through the spec's TOML; a partial [offload] table is refused.
  const ClusterSpec back = cluster_from_toml(cluster_to_toml(c), "round trip");
  EXPECT_DOUBLE_EQ(back.offload.write_bw, 1.9e9);
  EXPECT_DOUBLE_EQ(back.offload.capacity_bytes, c.offload.capacity_bytes);
  EXPECT_THROW(load_cluster("dgx-a100", {"cluster.offload.capacity_gib=0"}, 8, ""), ConfigError);
}

// GPT 7.5B on one A100 80GB: 16 bytes a parameter (120 GB) cannot fit; with the moments
// offloaded (8 bytes a parameter left, 60 GB) it can, and loom plan says so.
TEST(Planner, OffersOptimizerOffloadWhereNothingElseFits) {
  plan::PlanRequest req = gpt_7_5b_on_one_a100({});
  expect_offloading(req, "optimizer-offload", "optimizer = 'disk'");
  req.offload = false;
  EXPECT_TRUE(plan::search_plans(req).ranked.empty());
}

// Note [Chunk manager]: GPT 1.7B on one A100, ZeRO-0, 8 micro-batches. With the parameters
// offloaded as well, a budget that holds them all reads nothing per step (the update
// refreshes the resident chunks) and the update streams p with m and v (1.5x the moments'
// traffic); a budget that leaves room for half of them reads the other half in each of the
// 16 sweeps (forward and backward of 8 micro-batches), and the step pays what compute does
// not hide.
TEST(Simulator, ParameterOffloadReadsWhatTheBudgetCannotHold) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 1, "");
  SimPlan moments = gpt("gpt-1.7b", 1, true), params = moments;
  params.cfg.offload.params = loom::OffloadTier::kDisk;
  SimPlan unbudgeted = params;
  params.cfg.memory.limit_gib = 80;  // the device's memory
  const SimResult a = simulate(moments, c), b = simulate(params, c);
  const RankReport& all = b.ranks[0];
  EXPECT_DOUBLE_EQ(all.memory.params, a.ranks[0].memory.params);
  EXPECT_EQ(all.param_read_bytes, 0.0);
  EXPECT_NEAR(all.offload_io_s, 1.5 * a.ranks[0].offload_io_s, 1e-9);
  const double P = all.memory.params, rest = all.memory.total() - P;
  params.cfg.memory.limit_gib = (rest + P / 2) / 0.99 / double(int64_t(1) << 30);  // less the engine's 1% slack
  const SimResult h = simulate(params, c);
  const RankReport& half = h.ranks[0];
  EXPECT_NEAR(half.memory.params, P / 2, 1);
  EXPECT_NEAR(half.param_read_bytes, 2 * 8 * P / 2, 16 * 8192);
  EXPECT_NEAR(half.param_read_s, half.param_read_bytes / 3.5e9, 1e-9);
  EXPECT_GT(half.param_fetch_exposed_s, 0.0);  // 55 GB at 3.5 GB/s outlasts the compute
  EXPECT_NEAR(half.param_fetch_exposed_s, half.param_read_s - half.busy_s, 1e-9);
  EXPECT_NEAR(h.step_time_s - b.step_time_s, half.param_fetch_exposed_s, 1e-9);
  EXPECT_NEAR(h.breakdown.param_fetch, half.param_fetch_exposed_s, 1e-12);
  // No budget keeps nothing beyond the units in flight (as the engine): every sweep reads it all.
  const RankReport none = simulate(unbudgeted, c).ranks[0];
  EXPECT_NEAR(none.param_read_bytes, 2 * 8 * P, 1);
  SimPlan megatron = params;
  megatron.framework = Framework::kMegatron;
  EXPECT_THROW(simulate(megatron, c), ConfigError);
}

// Note [Gradient chunks]: with the gradients offloaded too they share the chunk budget, and
// the parameters (next needed a step later) give way first: a budget short by half the
// gradients' size takes it all from the parameters; one short of everything the parameters
// can give spills gradients, each byte written once per micro-batch and read back m + 1
// times, all of it on the step.
TEST(Simulator, GradientChunksShareTheBudgetAndParametersGiveWayFirst) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 1, "");
  SimPlan plan = gpt("gpt-1.7b", 1, true);
  plan.cfg.offload.params = plan.cfg.offload.grads = loom::OffloadTier::kDisk;
  plan.cfg.offload.chunk_mb = 16;
  plan.cfg.memory.limit_gib = 80;  // the device's memory
  const RankReport all = simulate(plan, c).ranks[0];
  const double P = all.memory.params, G = all.memory.grads, rest = all.memory.total() - P - G;
  EXPECT_EQ(all.grad_spill_bytes, 0.0);
  const double gib = double(int64_t(1) << 30);
  plan.cfg.memory.limit_gib = (rest + P + G / 2) / 0.99 / gib;  // less the engine's 1% slack
  const RankReport half = simulate(plan, c).ranks[0];
  EXPECT_NEAR(half.memory.grads, G, 1);
  EXPECT_NEAR(half.memory.params, P - G / 2, 1);
  EXPECT_EQ(half.grad_spill_bytes, 0.0);
  plan.cfg.memory.limit_gib = (rest + 0.2 * (P + G)) / gib;  // below what the parameters alone can give
  const SimResult tight = simulate(plan, c);
  const RankReport& t = tight.ranks[0];
  const double short_g = G - t.memory.grads;
  EXPECT_GT(short_g, 0.0);
  EXPECT_LT(t.memory.params, 0.2 * P);  // at its least: the units in flight
  EXPECT_NEAR(t.grad_spill_bytes, 8 * short_g, 1);
  EXPECT_NEAR(t.param_fetch_exposed_s,
              std::max(0.0, t.param_read_s - t.busy_s) + 8 * short_g / 1.9e9 + 9 * short_g / 3.5e9, 1e-9);
  EXPECT_LE(t.memory.total(), plan.cfg.memory.limit_gib * gib);
}

// Note [ZeRO-3 offload]: with ZeRO-3 the chunks are each rank's own pieces (1/dp of the
// parameters); the gather pool stays beside them. Room for all reads nothing and holds what
// in-memory ZeRO-3 holds; no budget keeps only the own pieces of the units in flight and reads
// every own piece twice per micro-batch (forward and backward).
TEST(Simulator, ZeroThreeParameterOffloadReadsOwnPieces) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  SimPlan moments = gpt("gpt-7.5b", 8, true);
  moments.cfg.parallel.zero = 3;
  moments.cfg.train.grad_accum = 2;  // 8 rows over dp 8, as two micro-batches
  moments.cfg.train.batch = 16;
  SimPlan none = moments;
  none.cfg.offload.params = loom::OffloadTier::kDisk;
  SimPlan roomy = none;
  roomy.cfg.memory.limit_gib = 80;
  const RankReport in_memory = simulate(moments, c).ranks[0], all = simulate(roomy, c).ranks[0],
                   least = simulate(none, c).ranks[0];
  const double own = in_memory.params * 2 / 8;  // fp16 weights on the A100 preset (s.wbytes)
  EXPECT_EQ(all.param_read_bytes, 0.0);
  EXPECT_DOUBLE_EQ(all.memory.params, in_memory.memory.params);
  EXPECT_NEAR(least.param_read_bytes, 2 * 2 * own, 1);
  EXPECT_LT(least.memory.params, in_memory.memory.params - 0.9 * own);
  EXPECT_GT(least.memory.params, in_memory.memory.params - own);  // the pool stays
  EXPECT_GT(least.param_read_s, 0.0);
}

// Note [Replicated-parameter offload]: ZeRO-1/2 read their chunks as ZeRO 0 does and write
// the gathered whole parameters (fp32) back into their file after each update, at the tier's
// write rate, on the step.
TEST(Simulator, ReplicatedParameterOffloadWritesTheGatheredWhole) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  SimPlan zero0 = gpt("gpt-7.5b", 8, true);
  zero0.cfg.offload.params = loom::OffloadTier::kDisk;
  zero0.cfg.train.grad_accum = 2;
  zero0.cfg.train.batch = 16;
  SimPlan zero1 = zero0;
  zero1.cfg.parallel.zero = 1;
  const RankReport a = simulate(zero0, c).ranks[0], b = simulate(zero1, c).ranks[0];
  EXPECT_DOUBLE_EQ(b.param_read_bytes, a.param_read_bytes);
  EXPECT_NEAR(b.param_fetch_exposed_s - a.param_fetch_exposed_s, 4 * b.params / c.offload.write_bw, 1e-9);
}

// Note [Page-cached offload]: on a shared (CPU) device whose memory holds the offload file
// beside everything else, the file's transfers are the page cache's copies (at memory speed,
// or at the cluster's measured cached rates), added to the step on the cores compute uses,
// and parameter reads fault their pages in (nothing hidden); with too little memory for the
// file the tier's rates apply, as on GPUs.
TEST(Simulator, PageCachedOffloadOnACpuCopiesAndFaults) {
  ClusterSpec cpu = load_cluster("dgx-a100", {}, 1, "");
  cpu.device.shared = true;
  cpu.device.page_fault_bw = 1e9;
  cpu.device.memory_bytes = 1e12;
  SimPlan plan = gpt("gpt-1.7b", 1, true);
  plan.cfg.offload.params = loom::OffloadTier::kDisk;  // no budget: every sweep reads the parameters
  const RankReport cached = simulate(plan, cpu).ranks[0];
  const double reads = cached.param_read_bytes, moments = 4 * 2 * cached.params * 1.5;
  ASSERT_GT(reads, 0);
  EXPECT_NEAR(cached.param_read_s, memory_time_s(cpu.device, reads) + reads / 1e9, 1e-9);
  EXPECT_NEAR(cached.param_fetch_exposed_s, cached.param_read_s, 1e-9);
  EXPECT_NEAR(cached.offload_io_s, 2 * memory_time_s(cpu.device, moments), 1e-9);
  // With the page cache's measured copy rates: reads at 12 GB/s, writes at 8; the copies run
  // on the update's cores, so the update's own time (optimizer - io) is unchanged beside them.
  ClusterSpec measured = cpu;
  measured.offload.cached_read_bw = 12e9, measured.offload.cached_write_bw = 8e9;
  const RankReport copied = simulate(plan, measured).ranks[0];
  EXPECT_NEAR(copied.param_read_s, reads / 12e9 + reads / 1e9, 1e-9);
  EXPECT_NEAR(copied.offload_io_s, moments / 12e9 + moments / 8e9, 1e-9);
  EXPECT_NEAR(copied.optimizer_s - copied.offload_io_s, cached.optimizer_s - cached.offload_io_s, 1e-9);
  EXPECT_GT(cached.optimizer_s - cached.offload_io_s, 0.0);
  cpu.device.memory_bytes = cached.memory.total();  // no room for the file
  const RankReport disk = simulate(plan, cpu).ranks[0];
  EXPECT_NEAR(disk.param_read_s, reads / 3.5e9, 1e-9);
  EXPECT_NEAR(disk.offload_io_s, moments / 3.5e9 + moments / 1.9e9, 1e-9);
}

// Refining two uniform candidates can produce one layout ("recompute none" and a per-layer
// "none*40"); the ranking lists it once. Llama 2.2B on one A100 cut to 24 GiB.
TEST(Planner, RanksEachLayoutOnce) {
  plan::PlanRequest req;
  req.like.framework = Framework::kLoom;
  req.like.cfg = load_config("", {"model.arch=llama", "model.layers=40", "model.d_model=2048", "model.heads=16",
                                  "model.kv_heads=16", "model.ffn=5632", "model.vocab=32000", "model.ctx=128",
                                  "train.seq=128", "train.batch=1"});
  req.global_batch = 1;
  req.top = 3;
  req.cluster = load_cluster("dgx-a100", {"cluster.device.memory_gib=24"}, 1, "");
  const plan::PlanReport found = plan::search_plans(req);
  ASSERT_FALSE(found.ranked.empty());
  std::set<std::string> keys;
  for (const plan::PlanCandidate& c : found.ranked)
    EXPECT_TRUE(keys.insert(plan::layout_key(c.plan)).second) << plan::layout_label(c.plan) << " listed twice";
}

// GPT 7.5B on one A100 cut to 48 GiB (mixed precision): with the moments offloaded the fp32
// masters stay (4 bytes a parameter beside 2 + 2 of weights and gradients: 60 GB); with the
// parameters offloaded too the file's p is the master, and loom plan offers that.
TEST(Planner, OffersParameterOffloadWhereOptimizerOffloadIsNotEnough) {
  expect_offloading(gpt_7_5b_on_one_a100({"cluster.device.memory_gib=48"}), "optimizer-offload param-offload",
                    "params = 'disk'");
  // Eight 6 GiB devices: even ZeRO-3's own pieces with the moments offloaded do not fit;
  // ZeRO-3 with the own pieces offloaded does (Note [ZeRO-3 offload]).
  plan::PlanRequest eight = gpt_7_5b_on_one_a100({"cluster.device.memory_gib=6"});
  eight.cluster = load_cluster("dgx-a100", {"cluster.device.memory_gib=6"}, 8, "");
  eight.like = gpt("gpt-7.5b", 8, false);
  expect_offloading(eight, "zero 3", "params = 'disk'");
  expect_offloading(eight, "optimizer-offload param-offload", "zero = 3");
}

}  // namespace
}  // namespace loom::sim
