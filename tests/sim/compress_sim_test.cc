// Compressed gradients in the simulator and the planner (Note [Gradient compressors]):
// priced from the same traffic formula the engine reports, paying off only where the dp
// group's links are slow, and chosen by loom plan there with its accuracy caveat.
#include <gtest/gtest.h>

#include <algorithm>

#include "loom/plan/search.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

// GPT-2 small on two 8-GPU nodes; `inter_gbps` sets the link between them (GB/s per GPU).
ClusterSpec two_nodes(double inter_gbps) {
  return load_cluster("dgx-a100", {"cluster.inter.gbps=" + std::to_string(inter_gbps)}, 16, "");
}

SimPlan gpt2_dp16(CompressKind k) {
  SimPlan p;
  p.cfg = load_config("", {"model.preset=gpt2", "parallel.dp=16", "train.batch=64", "train.grad_accum=1",
                           "parallel.micro_batch=4"});
  p.cfg.parallel.compress = k;
  p.framework = Framework::kLoom;
  return p;
}

// loom plan for GPT-2 small at global batch 64 on the slow two-node cluster, keeping `top`.
plan::PlanRequest gpt2_request(int64_t top) {
  plan::PlanRequest req;
  req.like = gpt2_dp16(CompressKind::kNone);
  req.global_batch = 64;
  req.top = top;
  req.refine = false;
  req.cluster = two_nodes(0.125);
  return req;
}

// Bytes from the formula: PowerSGD rank 4 and top-k 1% send >= 20x less than the exact ring
// (the traffic target, on GPT-2 small's 768-wide matrices).
TEST(CompressedSync, PowerSgdAndTopKMoveTwentyTimesFewerBytes) {
  const ClusterSpec c = two_nodes(12.5);
  SimPlan p = gpt2_dp16(CompressKind::kPowerSgd);
  const GroupShape dp = place_group(c, 16, 1);
  const CompressedSync psgd = compressed_sync(c, p.cfg, 0, dp);
  EXPECT_GT(psgd.exact_wire_bytes / psgd.wire_bytes, 20.0);
  p.cfg.parallel.compress = CompressKind::kTopK;
  p.cfg.parallel.compress_ratio = 0.01;
  const CompressedSync topk = compressed_sync(c, p.cfg, 0, dp);
  // A ring all-gather of 16 ranks' pairs: 15 x 8 B x 1% against 2 x 15/16 x 4 B.
  EXPECT_NEAR(psgd.exact_wire_bytes / topk.wire_bytes, (2.0 * 15 / 16 * 4) / (15 * 8 * 0.01), 0.05);
}

// Across a slow link the compressed sync wins although it runs after backward (PowerSGD and
// top-k by the 2.5x; TernGrad's int8 sums at dp 16 are a quarter of the bytes); on
// fast links the exact ring, hidden behind backward, wins.
TEST(Simulator, CompressionPaysOnSlowLinksOnly) {
  for (auto [k, speedup] : {std::pair{CompressKind::kPowerSgd, 2.5}, std::pair{CompressKind::kTopK, 2.5},
                            std::pair{CompressKind::kTernGrad, 1.5}}) {
    const double slow_exact = simulate(gpt2_dp16(CompressKind::kNone), two_nodes(0.125)).step_time_s;
    const double slow = simulate(gpt2_dp16(k), two_nodes(0.125)).step_time_s;
    EXPECT_LT(slow * speedup, slow_exact) << compress_name(k);
    const double fast_exact = simulate(gpt2_dp16(CompressKind::kNone), two_nodes(1e4)).step_time_s;
    const double fast = simulate(gpt2_dp16(k), two_nodes(1e4)).step_time_s;
    EXPECT_GE(fast, fast_exact) << compress_name(k);
  }
}

// loom plan on the slow two-node cluster picks a compressor and says what that costs; on
// one node, or with compression not asked for, it never does.
TEST(Planner, ChoosesCompressionOnlyWhereDpCrossesSlowLinks) {
  plan::PlanRequest req = gpt2_request(3);
  req.compress = {CompressKind::kTopK, CompressKind::kPowerSgd};
  const plan::PlanReport slow = plan::search_plans(req);
  ASSERT_FALSE(slow.ranked.empty());
  EXPECT_NE(slow.ranked.front().plan.cfg.parallel.compress, CompressKind::kNone) << plan::layout_label(slow.ranked.front().plan);
  EXPECT_NE(plan::approximation_caveat(slow.ranked.front().plan).find("accuracy cost is not modelled"), std::string::npos);
  req.cluster = load_cluster("dgx-a100", {}, 8, "");
  req.global_batch = 32;
  for (const plan::PlanCandidate& c : plan::search_plans(req).ranked)
    EXPECT_EQ(c.plan.cfg.parallel.compress, CompressKind::kNone) << plan::layout_label(c.plan);
  req.cluster = two_nodes(0.125), req.global_batch = 64, req.compress.clear();
  for (const plan::PlanCandidate& c : plan::search_plans(req).ranked)
    EXPECT_EQ(c.plan.cfg.parallel.compress, CompressKind::kNone) << plan::layout_label(c.plan);
}

// Note [bf16 optimizer moments]: a plan with bf16 moments prices their memory (the optimizer
// state 12 -> 8 bytes a parameter in mixed precision) and says the accuracy cost is not
// modelled, beside any other approximation of the layout.
TEST(Planner, Bf16MomentsPriceTheirMemoryAndCarryACaveat) {
  plan::PlanRequest req = gpt2_request(3);
  sim::SimPlan exact = req.like;
  exact.cfg.parallel.dp = 16;
  sim::SimPlan bf = exact;
  bf.cfg.optim.moments = FloatFormat::kBf16;
  const ClusterSpec c = two_nodes(1e4);
  EXPECT_NEAR(simulate(bf, c).ranks[0].memory.optimizer, simulate(exact, c).ranks[0].memory.optimizer * 8 / 12, 1.0);
  EXPECT_EQ(plan::approximation_caveat(exact), "");
  EXPECT_NE(plan::approximation_caveat(bf).find("bf16 AdamW moments"), std::string::npos);
  bf.cfg.parallel.compress = CompressKind::kPowerSgd;
  const std::string both = plan::approximation_caveat(bf);
  EXPECT_NE(both.find("PowerSGD"), std::string::npos) << both;
  EXPECT_NE(both.find("bf16 AdamW moments"), std::string::npos) << both;
}

// Note [PipeDream-2BW] in loom plan: 2bw layouts are searched (one pipeline, or dp replicas
// of it without ZeRO: Note [Streams with data parallelism]), each priced at its steady step
// and carrying the caveat that the delayed updates change the optimisation; where 1F1B at
// the same layout also fits, 2bw is the faster of the two, with the vocabulary split over the
// stages too (no pass holds a 2bw step's end: Note [Vocabulary passes across a step's end]).
TEST(Planner, OffersTwoBwWithItsCaveat) {
  plan::PlanRequest req = gpt2_request(100000);
  req.cluster = load_cluster("dgx-a100", {}, 4, "");
  req.global_batch = 16;
  int two_bw = 0, replicated = 0;
  const plan::PlanReport rep = plan::search_plans(req);
  for (const plan::PlanCandidate& c : rep.ranked) {
    const ParallelConfig& q = c.plan.cfg.parallel;
    if (q.schedule != ScheduleKind::k2BW) continue;
    ++two_bw;
    replicated += q.dp > 1;
    EXPECT_TRUE(q.dp == 1 || q.zero == 0) << plan::layout_label(c.plan);
    EXPECT_NE(plan::approximation_caveat(c.plan).find("change the optimisation"), std::string::npos);
    for (const plan::PlanCandidate& o : rep.ranked)
      if (o.plan.cfg.parallel.schedule == ScheduleKind::k1F1B &&
          plan::layout_label(o.plan) ==
              plan::layout_label(c.plan).replace(plan::layout_label(c.plan).find(" 2bw "), 5, " 1f1b ")) {
        EXPECT_LT(c.result.step_time_s, o.result.step_time_s) << plan::layout_label(c.plan);
      }
  }
  EXPECT_GT(two_bw, 0);
  EXPECT_GT(replicated, 0);
}

// pipedream and pipemare in loom plan: searched where the run allows them (one micro-batch per
// step, no clipping), each with the caveat that its asynchronous updates change the
// optimisation; with clipping on, none is offered (validation_errors prunes them).
TEST(Planner, OffersAsynchronousPipelinesOnlyWhereTheyRun) {
  plan::PlanRequest req = gpt2_request(100000);
  req.cluster = load_cluster("dgx-a100", {}, 4, "");
  req.global_batch = 4;
  auto count = [](const plan::PlanReport& rep) {
    int n = 0;
    for (const plan::PlanCandidate& c : rep.ranked) {
      const ParallelConfig& q = c.plan.cfg.parallel;
      if (!updates_per_batch(q.schedule)) continue;
      ++n;
      EXPECT_EQ(c.plan.cfg.train.grad_accum, 1) << plan::layout_label(c.plan);
      EXPECT_NE(plan::approximation_caveat(c.plan).find("asynchronous updates"), std::string::npos);
    }
    return n;
  };
  EXPECT_EQ(count(plan::search_plans(req)), 0);  // grad_clip 1.0
  req.like.cfg.optim.grad_clip = 0;
  EXPECT_GT(count(plan::search_plans(req)), 0);
}

// Note [Synchronous warm-up] in loom plan: the asked-for warm-up changes the stream schedules
// only (the flushing ones, synchronous throughout, are offered as before), and the ranking is
// by the mean step over the run, in which the warm-up's flushing steps weigh: more than the
// stream's, except with the vocabulary split over the stages, whose 1F1B runs as far ahead of
// its passes as the stream (Note [Vocabulary passes ahead]) without 2bw's extra copies.
TEST(Planner, RanksStreamsWithTheirSynchronousWarmUp) {
  plan::PlanRequest req = gpt2_request(100000);
  req.cluster = load_cluster("dgx-a100", {}, 4, "");
  req.global_batch = 4;
  req.like.cfg.optim.grad_clip = 0;
  req.like.cfg.parallel.sync_warmup_steps = 50;
  req.like.cfg.train.steps = 100;
  const plan::PlanReport rep = plan::search_plans(req);
  int flushing = 0, warm = 0;
  for (const plan::PlanCandidate& c : rep.ranked) {
    const ParallelConfig& q = c.plan.cfg.parallel;
    if (streams(q.schedule) && q.pp > 1) {
      ++warm;
      EXPECT_EQ(q.sync_warmup_steps, 50) << plan::layout_label(c.plan);
      EXPECT_EQ(c.result.warmup_steps, 50);
      EXPECT_NEAR(plan::run_step_s(c), (c.result.warmup_step_time_s + c.result.step_time_s) / 2, 1e-12);
      if (!q.pp_vocab) EXPECT_GT(plan::run_step_s(c), c.result.step_time_s) << plan::layout_label(c.plan);
    } else {
      ++flushing;
      EXPECT_EQ(c.result.warmup_steps, 0) << plan::layout_label(c.plan);
      EXPECT_EQ(plan::run_step_s(c), c.result.step_time_s);
    }
  }
  EXPECT_GT(flushing, 0);
  EXPECT_GT(warm, 0);
  EXPECT_TRUE(std::is_sorted(rep.ranked.begin(), rep.ranked.end(), [](const auto& a, const auto& b) {
    return plan::run_step_s(a) < plan::run_step_s(b);
  }));
}

// Parameter-server layouts in loom plan (Note [Simulated parameter server]): only when asked,
// S servers per tp x pp shard and the rest workers on 4 GPUs ((W + S) x tp x pp = 4; Note
// [Parameter server with model parallelism]), each priced as loom simulate prices it; sparse rows
// (a Llama) carry lazy AdamW's caveat and move less than the dense rounds.
TEST(Planner, OffersParameterServersWhenAsked) {
  plan::PlanRequest req = gpt2_request(100000);
  req.cluster = load_cluster("dgx-a100", {}, 4, "");
  req.global_batch = 12;
  auto ps_layouts = [](const plan::PlanReport& rep) {
    std::vector<const plan::PlanCandidate*> out;
    for (const plan::PlanCandidate& c : rep.ranked)
      if (c.plan.cfg.parallel.ps_servers > 0) out.push_back(&c);
    return out;
  };
  EXPECT_TRUE(ps_layouts(plan::search_plans(req)).empty());
  req.ps = true;
  const plan::PlanReport dense = plan::search_plans(req);
  ASSERT_FALSE(ps_layouts(dense).empty());
  for (const plan::PlanCandidate* c : ps_layouts(dense)) {
    const ParallelConfig& q = c->plan.cfg.parallel;
    EXPECT_EQ((q.dp + q.ps_servers) * q.tp * q.pp, 4) << plan::layout_label(c->plan);
    EXPECT_NE(plan::layout_label(c->plan).find("parameter servers"), std::string::npos);
    EXPECT_DOUBLE_EQ(c->result.step_time_s, simulate(c->plan, req.cluster).step_time_s);
    EXPECT_GT(c->result.ranks[0].ps_s, 0.0);
  }
  req.like.cfg = load_config("", {"model.preset=llama", "model.vocab=50257", "train.batch=12"});
  req.ps_sparse = true;
  const plan::PlanReport sparse = plan::search_plans(req);
  ASSERT_FALSE(ps_layouts(sparse).empty());
  for (const plan::PlanCandidate* c : ps_layouts(sparse)) {
    EXPECT_NE(plan::approximation_caveat(c->plan).find("lazy AdamW"), std::string::npos);
    SimPlan as_dense = c->plan;
    as_dense.cfg.ps.sparse_embedding = false;
    EXPECT_LT(c->result.ranks[0].ps_s, simulate(as_dense, req.cluster).ranks[0].ps_s) << plan::layout_label(c->plan);
  }
}

// ZeRO++ in loom plan: across the slow link the fastest ZeRO-3 candidate whose dp group spans
// both nodes (dp 16) uses it; not asked for, or on one node, no candidate does; an
// approximate one carries the caveat, hpZ alone (exact) none.
TEST(Planner, TriesZeroPlusPlusWhereDpCrossesSlowLinks) {
  plan::PlanRequest req = gpt2_request(1000);
  req.zeropp = true;
  auto zeropp = [](const SimPlan& p) {
    return p.cfg.parallel.zeropp_qwz || p.cfg.parallel.zeropp_qgz || p.cfg.parallel.zeropp_hpz;
  };
  const plan::PlanReport slow = plan::search_plans(req);
  const auto z3 = std::find_if(slow.ranked.begin(), slow.ranked.end(),
                               [](const plan::PlanCandidate& c) {
                                 return c.plan.cfg.parallel.zero == 3 && c.plan.cfg.parallel.dp == 16;
                               });
  ASSERT_NE(z3, slow.ranked.end());
  EXPECT_TRUE(zeropp(z3->plan)) << plan::layout_label(z3->plan);
  bool caveat = false, exact_hpz = false;
  for (const plan::PlanCandidate& c : slow.ranked) {
    const ParallelConfig& q = c.plan.cfg.parallel;
    if (q.zeropp_qwz || q.zeropp_qgz) caveat |= plan::approximation_caveat(c.plan).find("ZeRO++ int8") != std::string::npos;
    if (q.zeropp_hpz && !q.zeropp_qwz && !q.zeropp_qgz) exact_hpz |= plan::approximation_caveat(c.plan).empty();
  }
  EXPECT_TRUE(caveat);
  EXPECT_TRUE(exact_hpz);
  req.zeropp = false;
  for (const plan::PlanCandidate& c : plan::search_plans(req).ranked) EXPECT_FALSE(zeropp(c.plan)) << plan::layout_label(c.plan);
  req.zeropp = true;
  req.cluster = load_cluster("dgx-a100", {}, 8, "");
  req.global_batch = 32;
  for (const plan::PlanCandidate& c : plan::search_plans(req).ranked) EXPECT_FALSE(zeropp(c.plan)) << plan::layout_label(c.plan);
}

}  // namespace
}  // namespace loom::sim
