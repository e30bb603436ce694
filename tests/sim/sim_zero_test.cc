// ZeRO-3 across nodes and by framework (Note [Sharding implementations] in sim/zero_cost.cc;
// the ring's hops in comm/cost.cc), with the arithmetic shown.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"
#include "loom/sim/zero_cost.h"

namespace loom::sim {
namespace {

SimPlan plan_of(const std::vector<std::string>& sets, Framework f) {
  SimPlan p;
  p.cfg = load_config("", sets);
  p.framework = f;
  return p;
}

// A ZeRO-3 gather of one 175B layer's fp16 parameters (12 h^2, h = 12288: 3.62 GB) over 512
// ranks on 64 DGX A100 nodes: the node's 8 NICs carry the ring (busbw min(0.75 x 300, 8 x 0.9
// x 25) = 180 GB/s), and a piece crosses 511 hops, 63 between nodes (6 us) and 448 inside one
// (3 us): 20.1 ms of bandwidth + 1.72 ms of latency.
TEST(ZeroCost, RingGatherAt512RanksOver64Nodes) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 512, "");
  const GroupShape g = place_group(c, 512, 1);
  ASSERT_EQ(g.nodes, 64);
  ASSERT_EQ(g.per_node, 8);
  const double bytes = 12.0 * 12288 * 12288 * 2;
  EXPECT_NEAR(collective_time_s(c, OpKind::kAllGather, bytes, g), 511.0 / 512 * bytes / 180e9 + 448 * 3e-6 + 63 * 6e-6,
              1e-12);
}

// (b): a list-form collective adds one copy kernel per rank (4 us each on the A100 preset)
// and the copies' 2 x bytes through HBM (2039 GB/s at 90% for large buffers, + 4 us).
TEST(ZeroCost, ListCollectiveAddsACopyPerRank) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const GroupShape g = place_group(c, 16, 1);
  const double bytes = 1.6e9;
  const double ring = 15.0 / 16 * bytes / 180e9 + 14 * 3e-6 + 6e-6;
  EXPECT_NEAR(list_collective_s(c, OpKind::kAllGather, bytes, g), ring + 16 * 4e-6 + 2 * bytes / (2039e9 * 0.9) + 4e-6,
              1e-12);
}

// DeepSpeed 2021 on GPT-2 (h 768, f 3072, 12 layers) over 16 ranks: each layer gathers its
// four weight matrices (the eight biases and norms are under the 1e5-element persistence
// threshold) in forward, again in backward and once more for a recomputed forward, and
// reduce-scatters all twelve tensors' gradients; nothing overlaps compute:
//   zero = 12 x ((2 + [full]) G + R),  G = sum_big L(AG, 2 t),  R = sum_all L(RS, 2 t).
TEST(ZeroCost, DeepSpeed2021PaysEveryTensorsCollectivesInFull) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const GroupShape g = place_group(c, 16, 1);
  const double h = 768, f = 3072;
  const std::vector<double> big = {3 * h * h, h * h, h * f, f * h}, small = {h, h, 3 * h, h, h, h, f, h};
  double G = 0, R = 0;
  for (double t : big) G += list_collective_s(c, OpKind::kAllGather, 2 * t, g), R += list_collective_s(c, OpKind::kReduceScatter, 2 * t, g);
  for (double t : small) R += list_collective_s(c, OpKind::kReduceScatter, 2 * t, g);
  for (const char* rc : {"none", "full"}) {
    const std::vector<std::string> sets = {"model.preset=gpt2", "parallel.dp=16", "parallel.zero=3", "train.batch=16",
                                           "train.grad_accum=1", std::string("parallel.recompute=") + rc};
    const SimResult ds = simulate(plan_of(sets, Framework::kDeepSpeed2021), c);
    const double passes = std::string(rc) == "full" ? 3 : 2;
    EXPECT_NEAR(ds.breakdown.zero_comm, 12 * (passes * G + R), 1e-9) << rc;
    // The coalesced implementation moves the same bytes in 3 collectives a layer, under
    // compute: what it costs is the compute they slow (Note [Overlap contention]).
    EXPECT_LT(simulate(plan_of(sets, Framework::kFsdp), c).breakdown.zero_comm, 0.2 * ds.breakdown.zero_comm) << rc;
  }
}

// Narayanan et al. (SC'21) Table 2's shape: 175B, ZeRO-3 without model parallelism, global
// batch 1536, micro-batch 1536 / n on n GPUs. Each doubling halves the compute per GPU while
// DeepSpeed 2021's per-tensor collectives stay (bandwidth) or grow (latency, copies), so
// its TFLOP/s per GPU fall by more than a quarter each time; the coalesced one stays
// compute-bound (within 1% with collectives that cost compute nothing). At the preset's overlap
// cost its loss is overlap_cost x its hidden gathers over the compute, which halves with each
// doubling under the same gathers: the loss about doubles (seen 3.5% at 768 GPUs, 7.4% at 1536).
TEST(ZeroCost, DeepSpeed2021ThroughputFallsAsGpusGrowAtAFixedBatch) {
  double prev_ds = 0, first_fsdp = 0, prev_loss = 0;
  for (int64_t n : {384, 768, 1536}) {
    const std::vector<std::string> sets = {
        "model.preset=gpt3-175b", "parallel.dp=" + std::to_string(n), "parallel.zero=3", "train.batch=1536",
        "parallel.micro_batch=" + std::to_string(1536 / n), "train.grad_accum=1", "parallel.recompute=full"};
    const ClusterSpec c = load_cluster("dgx-a100", {}, n, "");
    const ClusterSpec free_overlap = load_cluster("dgx-a100", {"cluster.device.overlap_cost=0"}, n, "");
    const double ds = simulate(plan_of(sets, Framework::kDeepSpeed2021), c).tflops_per_gpu;
    const double fsdp = simulate(plan_of(sets, Framework::kFsdp), free_overlap).tflops_per_gpu;
    const double contended = simulate(plan_of(sets, Framework::kFsdp), c).tflops_per_gpu;
    if (prev_ds > 0) {
      EXPECT_LT(ds, 0.75 * prev_ds) << n;
    }
    if (first_fsdp > 0) {
      EXPECT_NEAR(fsdp, first_fsdp, 0.01 * first_fsdp) << n;
    }
    const double loss = 1 - contended / fsdp;
    EXPECT_GT(loss, 0.0) << n;
    if (prev_loss > 0) {
      EXPECT_NEAR(loss / prev_loss, 2.0, 0.4) << n;
    }
    prev_loss = loss;
    if (first_fsdp == 0) first_fsdp = fsdp;
    prev_ds = ds;
  }
}

// An overlapped data-parallel reduction (Note [Simulated step]): GPT-2 at dp 16 over two
// DGX A100 nodes, 32 sequences of 1024 a rank, so backward (seconds) outlasts the fp16
// all-reduce of its 124M gradients (~2.6 ms at 180 GB/s): only the last bucket is exposed,
// t / ceil(bytes / bucket), and the rest costs the compute it slows, overlap_cost x (t - t /
// buckets) (Note [Overlap contention]); without overlap the whole t is.
TEST(ZeroCost, OverlappedReduceExposesOnlyTheLastBucket) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  SimPlan p = plan_of({"model.preset=gpt2", "parallel.dp=16", "train.batch=512", "train.grad_accum=1"},
                      Framework::kMegatron);
  const RankReport on = simulate(p, c).ranks[0];
  const double bytes = 2 * on.params;
  const double t = collective_time_s(c, OpKind::kAllReduce, bytes, place_group(c, 16, 1));
  const double buckets = std::ceil(bytes / (p.cfg.parallel.bucket_mb * double(1 << 20)));
  ASSERT_GT(buckets, 1.0);
  ASSERT_NEAR(c.device.overlap_cost, 0.159, 1e-12);
  EXPECT_NEAR(on.dp_exposed_s, t / buckets + 0.159 * (t - t / buckets), 1e-12);
  const ClusterSpec free_overlap = load_cluster("dgx-a100", {"cluster.device.overlap_cost=0"}, 16, "");
  EXPECT_NEAR(simulate(p, free_overlap).ranks[0].dp_exposed_s, t / buckets, 1e-12);
  p.dp_overlap = false;
  EXPECT_NEAR(simulate(p, c).ranks[0].dp_exposed_s, t, 1e-12);
}

// Note [Streams with data parallelism]: a 2bw / pipedream / pipemare stage all-reduces each
// update's gradient whole when it completes, with nothing to hide under: the whole t is
// exposed, where 1f1b's bucketed reduction hides all but its last bucket.
TEST(ZeroCost, AStreamsDataParallelReductionIsExposedWhole) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 4, "");
  const std::vector<std::string> layout = {"model.preset=gpt2", "parallel.dp=2", "parallel.pp=2", "train.batch=64",
                                           "train.grad_accum=8", "parallel.bucket_mb=25", "optim.grad_clip=0"};
  for (const char* kind : {"2bw", "pipedream", "pipemare"}) {
    std::vector<std::string> sets = layout;
    sets.push_back(std::string("parallel.schedule=") + kind);
    if (std::string(kind) != "2bw") sets[4] = "train.grad_accum=1", sets[3] = "train.batch=8";
    const SimResult rep = simulate(plan_of(sets, Framework::kLoom), c);
    for (const RankReport& r : rep.ranks) {
      const double t = collective_time_s(c, OpKind::kAllReduce, 2 * r.params, place_group(c, 2, 1));  // bf16
      EXPECT_NEAR(r.dp_exposed_s, t, 1e-12) << kind << " rank " << r.pp_rank;
    }
  }
  const SimResult flushing = simulate(plan_of(layout, Framework::kLoom), c);
  const double t = collective_time_s(c, OpKind::kAllReduce, 2 * flushing.ranks[0].params, place_group(c, 2, 1));
  EXPECT_LT(flushing.ranks[0].dp_exposed_s, 0.5 * t);
}

TEST(ZeroCost, FrameworksRefuseTheZeroTheyDoNotRun) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  const std::vector<std::string> z3 = {"model.preset=gpt2", "parallel.dp=16", "parallel.zero=3", "train.batch=16"};
  try {
    simulate(plan_of(z3, Framework::kMegatron), c);
    ADD_FAILURE() << "megatron ran ZeRO-3";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fsdp, deepspeed-2021"), std::string::npos) << e.what();
  }
  std::vector<std::string> kept = z3;
  kept.push_back("parallel.zero_keep=keep*12");
  EXPECT_THROW(simulate(plan_of(kept, Framework::kDeepSpeed2021), c), ConfigError);
  EXPECT_NO_THROW(simulate(plan_of(kept, Framework::kFsdp), c));
  EXPECT_EQ(framework_zero_stages(Framework::kMegatron), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(framework_zero_stages(Framework::kFsdp), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(parse_framework("deepspeed-2021"), Framework::kDeepSpeed2021);
  EXPECT_THROW(parse_framework("deepspeed"), ConfigError);
}

TEST(ZeroCost, BlockTensorsSumToTheBlocksParameters) {
  for (const char* preset : {"gpt2", "llama3-8b"})
    for (int64_t tp : {1, 4}) {
      ModelConfig m;
      apply_model_preset(m, preset);
      double sum = 0;
      for (double t : block_tensors(m, tp)) sum += t;
      EXPECT_DOUBLE_EQ(sum, block_params(m, tp).per_tp_rank) << preset << " tp " << tp;
    }
}

}  // namespace
}  // namespace loom::sim
