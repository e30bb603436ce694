// Note [Overlap contention] (sim/costs.cc): a collective overlapped with compute costs what
// the compute cannot hide and the compute it slows, with the arithmetic shown.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

SimPlan plan_of(const std::vector<std::string>& sets, Framework f = Framework::kMegatron) {
  std::vector<std::string> all = {"model.preset=gpt-22b", "model.vocab=256"};
  all.insert(all.end(), sets.begin(), sets.end());
  SimPlan p;
  p.cfg = load_config("", all);
  p.framework = f;
  return p;
}

// max(X - W, kappa x min(X, W)): under a long window the collective costs kappa of itself; past
// the window its uncovered part, or the slowed window where that is more. The cluster file
// refuses a negative cost (as every rate) and one above 4 (the bound the reader names).
TEST(OverlapCost, ACollectiveCostsWhatComputeCannotHideOrWhatItSlows) {
  DeviceSpec d;
  d.overlap_cost = 0.16;
  EXPECT_NEAR(overlapped_s(d, 1.0, 3.0), 0.16, 1e-15);        // 0.16 x 1
  EXPECT_NEAR(overlapped_s(d, 5.0, 3.0), 2.0, 1e-15);         // 5 - 3 > 0.16 x 3
  EXPECT_NEAR(overlapped_s(d, 3.3, 3.0), 0.48, 1e-15);        // 0.16 x 3 > 3.3 - 3
  EXPECT_EQ(overlapped_s(d, 0.0, 3.0), 0.0);
  EXPECT_NEAR(overlapped_s(d, 2.0, 0.0), 2.0, 1e-15);         // nothing to overlap
  d.overlap_cost = 0;
  EXPECT_EQ(overlapped_s(d, 1.0, 3.0), 0.0);                  // perfect hiding
  EXPECT_NEAR(overlapped_s(d, 5.0, 3.0), 2.0, 1e-15);
  d.overlap_cost = 1.5;                                         // a CPU rank: more than the collective's own time
  EXPECT_NEAR(overlapped_s(d, 1.0, 3.0), 1.5, 1e-15);
  EXPECT_NEAR(overlapped_s(d, 5.0, 3.0), 4.5, 1e-15);         // 1.5 x 3 > 5 - 3
}

TEST(OverlapCost, ClusterFilesCarryItAndRefuseWhatIsNotACost) {
  const ClusterSpec a100 = load_cluster("dgx-a100", {}, 8, "");
  EXPECT_NEAR(a100.device.overlap_cost, 0.189 / 1.189, 1e-3);  // Lee et al. 2025: 18.9% slower
  const ClusterSpec back = cluster_from_toml(cluster_to_toml(load_cluster("dgx-a100", {"cluster.device.overlap_cost=0.75"}, 8, "")), "rt");
  EXPECT_DOUBLE_EQ(back.device.overlap_cost, 0.75);
  for (const char* bad : {"cluster.device.overlap_cost=-0.1", "cluster.device.overlap_cost=5"}) {
    try {
      load_cluster("dgx-a100", {bad}, 8, "");
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("device.overlap_cost"), std::string::npos) << e.what();
      if (std::string(bad).back() == '5') {
        EXPECT_NE(std::string(e.what()).find("0 to 4"), std::string::npos) << e.what();
      }
    }
  }
}

// One GPT-2 block's fp16 all-gather and reduce-scatter over the plan's 16 dp ranks.
std::pair<double, double> gather_and_scatter_s(const SimPlan& p, const ClusterSpec& c) {
  const GroupShape g = place_group(c, 16, 1);
  const double unit = block_params(p.cfg.model, 1).per_tp_rank * 2;
  return {collective_time_s(c, OpKind::kAllGather, unit, g), collective_time_s(c, OpKind::kReduceScatter, unit, g)};
}

// FSDP's ZeRO-3 on GPT-2 at dp 16 (two DGX A100 nodes), 8 sequences of 1024 a rank: every
// layer's gathers and reduce-scatter hide under its compute, so at overlap cost 0 they cost
// nothing and at kappa each layer costs kappa x (AG + (RS + AG)): 12 layers x 0.159 x that.
TEST(OverlapCost, HiddenZero3CollectivesCostKappaOfThemselves) {
  std::vector<std::string> sets = {"parallel.dp=16", "parallel.zero=3", "train.batch=128", "train.grad_accum=1"};
  SimPlan p;
  p.cfg = load_config("", {"model.preset=gpt2", sets[0], sets[1], sets[2], sets[3]});
  p.framework = Framework::kFsdp;
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const ClusterSpec free_overlap = load_cluster("dgx-a100", {"cluster.device.overlap_cost=0"}, 16, "");
  const auto [ag, rs] = gather_and_scatter_s(p, c);
  EXPECT_NEAR(simulate(p, free_overlap).breakdown.zero_comm, 0.0, 1e-15);
  EXPECT_NEAR(simulate(p, c).breakdown.zero_comm, 12 * 0.159 * (ag + rs + ag), 1e-12);
}

// Note [Backward prefetch]: under BACKWARD_POST each layer's backward waits for its whole
// gather, which shares the links with the reduce-scatter until the shorter is through, and
// what is left of the reduce-scatter hides under the compute: with S = min(AG, RS),
// 12 x (0.159 AG (forward, hidden) + AG + S + 0.159 (RS - S)); at overlap cost 0,
// 12 x (AG + S). Frameworks other than fsdp refuse it.
TEST(OverlapCost, BackwardPostPrefetchExposesTheGather) {
  SimPlan p;
  p.cfg = load_config("", {"model.preset=gpt2", "parallel.dp=16", "parallel.zero=3", "train.batch=128",
                           "train.grad_accum=1"});
  p.framework = Framework::kFsdp;
  p.backward_prefetch_post = true;
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const auto [ag, rs] = gather_and_scatter_s(p, c);
  const double shared = std::min(ag, rs);
  EXPECT_NEAR(simulate(p, c).breakdown.zero_comm, 12 * (0.159 * ag + ag + shared + 0.159 * (rs - shared)), 1e-12);
  const ClusterSpec free_overlap = load_cluster("dgx-a100", {"cluster.device.overlap_cost=0"}, 16, "");
  EXPECT_NEAR(simulate(p, free_overlap).breakdown.zero_comm, 12 * (ag + shared), 1e-12);
  for (Framework f : {Framework::kMegatron, Framework::kLoom}) {
    SimPlan other = p;
    other.framework = f;
    other.cfg.parallel.zero = 1;
    try {
      simulate(other, c);
      ADD_FAILURE() << framework_name(f);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--backward-prefetch post"), std::string::npos) << e.what();
    }
  }
}

// Note [Backward prefetch]: the gather is through after AG + min(AG, RS) whichever of the two is
// shorter. Int8 gathers (qwZ) beside bf16 reduce-scatters: 2 AG a layer; bf16 gathers beside int8
// reduce-scatters (qgZ): AG + RS (overlap cost 0, so the rest of the reduce-scatter is free).
TEST(OverlapCost, BackwardPostGatherSharesTheLinksWithTheReduceScatter) {
  const ClusterSpec c = load_cluster("dgx-a100", {"cluster.device.overlap_cost=0"}, 16, "");
  const GroupShape g = place_group(c, 16, 1);
  const double int8 = 1 + 4.0 / 256;  // comm::kQuantBlock's fp32 scale per 256 values
  for (const bool qwz : {true, false}) {
    SimPlan p;
    p.cfg = load_config("", {"model.preset=gpt2", "parallel.dp=16", "parallel.zero=3", "train.batch=128",
                             "train.grad_accum=1", qwz ? "parallel.zeropp_qwz=true" : "parallel.zeropp_qgz=true"});
    p.framework = Framework::kFsdp;
    p.backward_prefetch_post = true;
    const double unit = block_params(p.cfg.model, 1).per_tp_rank;
    const double ag = collective_time_s(c, OpKind::kAllGather, unit * (qwz ? int8 : 2.0), g);
    const double rs = collective_time_s(c, OpKind::kReduceScatter, unit * (qwz ? 2.0 : int8), g);
    EXPECT_EQ(ag < rs, qwz);
    EXPECT_NEAR(simulate(p, c).breakdown.zero_comm, 12 * (ag + std::min(ag, rs)), 1e-12) << qwz;
  }
}

// Note [Tensor-parallel overlap]: with --tp-overlap a unit's tp collectives cost only what
// its GEMMs do not cover (and, Note [Overlap contention], the GEMM time it takes: off here,
// overlap_cost 0). One stage and one rank of data: the step shrinks by exactly the tp time
// hidden. On slow tp links (2 GB/s) most tp time stays exposed; on NVLink the 22B model's
// GEMMs cover nearly all of it, and at the preset's overlap cost 0.159 what is hidden costs
// 0.159 of itself.
TEST(Simulator, TensorParallelOverlapHidesTpCommunicationUnderTheGemms) {
  for (const char* gbps : {"2", "300"}) {
    const ClusterSpec c =
        load_cluster("dgx-a100", {std::string("cluster.intra.gbps=") + gbps, "cluster.device.overlap_cost=0"}, 8, "");
    SimPlan off = plan_of({"parallel.tp=8", "train.batch=4", "train.grad_accum=4"});
    SimPlan on = off;
    on.tp_overlap = true;
    const SimResult a = simulate(off, c), b = simulate(on, c);
    EXPECT_LT(b.breakdown.tp_comm, a.breakdown.tp_comm) << gbps;
    EXPECT_NEAR(a.step_time_s - b.step_time_s, a.breakdown.tp_comm - b.breakdown.tp_comm, 1e-9 * a.step_time_s)
        << gbps;
    // Seen: 2 GB/s 22.82 -> 22.13 s of tp time (the GEMMs cover 0.69 s of it); 300 GB/s 0.185
    // -> 0.002 s (what is left is the vocabulary-parallel head's, under its smaller GEMM).
    if (std::string(gbps) == "300") EXPECT_LT(b.breakdown.tp_comm, 0.02 * a.breakdown.tp_comm);
    else EXPECT_GT(b.breakdown.tp_comm, 0.9 * a.breakdown.tp_comm);
    const ClusterSpec k = load_cluster("dgx-a100", {std::string("cluster.intra.gbps=") + gbps}, 8, "");
    const double hidden = a.breakdown.tp_comm - b.breakdown.tp_comm;
    // 300 GB/s: a unit's tp time is under its GEMMs', so it costs 0.159 of itself; 2 GB/s: the
    // uncovered tp - gemm exceeds 0.159 x gemm in every unit, so nothing changes.
    const double contended = simulate(on, k).breakdown.tp_comm;
    if (std::string(gbps) == "300") EXPECT_NEAR(contended, b.breakdown.tp_comm + 0.159 * hidden, 0.02 * hidden);
    else EXPECT_NEAR(contended, b.breakdown.tp_comm, 1e-9 * contended);
  }
}

}  // namespace
}  // namespace loom::sim
