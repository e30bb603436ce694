// Fused attention kernels (Note [Fused attention kernels]) and what the published-run reader
// takes from a row's framework (Note [Published frameworks]) and metric columns, with the
// arithmetic shown.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/published.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

// The flash op of one block, on a GPT layer of b = 2, s = 4096, h = 2048, a = 16 (head dim
// 128; 32 heads: 64).
Op flash_op(Attention k, int heads = 16) {
  ModelConfig m = load_config("", {"model.preset=gpt2", "model.d_model=2048", "model.heads=" + std::to_string(heads),
                                   "model.ctx=4096"}).model;
  LayerShape x = LayerShape::of(m, 2, 4096, 1, 1, false, 2);
  x.attention = k;
  for (const Op& o : block_forward_ops(x))
    if (o.kind == Op::Kind::kAttention) return o;
  ADD_FAILURE() << "no attention op";
  return {};
}

// A flash kernel costs its causal-half FLOPs at its curve's efficiency for the sequence:
// F = 2 x (b a) x s^2 hd (QK^T and PV, 2 s^2 hd each, halved by the causal mask)
//   = 2 x 32 x 4096^2 x 128 = 1.374e11 FLOP; at 0.5 of 989 TFLOP/s that is 0.2779 ms (+ 4 us).
TEST(FusedAttention, FlashKernelCostsItsCausalFlopsAtItsCurveForTheSequence) {
  ClusterSpec c = load_cluster("dgx-h100", {}, 8, "");
  c.device.flash_efficiency[2] = {{{1024, 0.25}, {4096, 0.5}, {16384, 0.6}}};
  c.device.flash_efficiency[1] = {}, c.device.flash_efficiency[3] = {};
  const Op o = flash_op(Attention::kFlash2);
  const double F = 2.0 * 32 * 4096.0 * 4096.0 * 128;
  EXPECT_NEAR(o.flops, F, 1e-6 * F);
  EXPECT_EQ(o.seq, 4096);
  const double want = F / (989e12 * 0.5) + c.device.kernel_overhead_s;
  EXPECT_NEAR(kernel_time_s(c.device, o), want, 1e-12);
  // flash3 without a curve of its own runs as flash2 (FlashAttention-3 is Hopper-only).
  EXPECT_NEAR(kernel_time_s(c.device, flash_op(Attention::kFlash3)), want, 1e-12);
  // flash1 without a curve, and nothing older: the GEMM roofline of the same op.
  const Op o1 = flash_op(Attention::kFlash1);
  EXPECT_NEAR(kernel_time_s(c.device, o1), gemm_time_s(c.device, o1.flops, o1.bytes), 1e-15);
}

// Note [Flash under context parallelism]: at cp 2 a rank holds s / 2 = 2048 queries and
// meets the 4096 keys in two ring steps of 2048, so the op keeps its FLOPs (half of cp 1's:
// 2 x 32 x 2048 x 4096 x 128 = 6.87e10) and is priced at the curve's 2048 point:
// 0.25 + (0.5 - 0.25) x log(2048/1024) / log(4096/1024) = 0.375, not 4096's 0.5.
TEST(FusedAttention, ContextParallelRingStepsRunAtTheirChunkLength) {
  ClusterSpec c = load_cluster("dgx-h100", {}, 8, "");
  c.device.flash_efficiency[2] = {{{1024, 0.25}, {4096, 0.5}, {16384, 0.6}}};
  c.device.flash_efficiency[1] = {}, c.device.flash_efficiency[3] = {};
  ModelConfig m = load_config("", {"model.preset=gpt2", "model.d_model=2048", "model.heads=16", "model.ctx=4096"}).model;
  LayerShape x = LayerShape::of(m, 2, 4096, 1, 2, false, 2);
  x.attention = Attention::kFlash2;
  Op o;
  for (const Op& op : block_forward_ops(x))
    if (op.kind == Op::Kind::kAttention) o = op;
  const double F = 2.0 * 32 * 2048.0 * 4096.0 * 128;
  EXPECT_NEAR(o.flops, F, 1e-6 * F);
  EXPECT_EQ(o.seq, 2048);
  EXPECT_NEAR(c.device.flash_efficiency[2].at(2048), 0.375, 1e-9) << "the curve interpolates in log length";
  EXPECT_NEAR(kernel_time_s(c.device, o), F / (989e12 * 0.375) + c.device.kernel_overhead_s, 1e-12);
}

// Note [Fused attention kernels], head size: FlashAttention-1/2 run the softmax's exponentials
// between the matmuls, r(hd) = peak e / (7 hd sfu) of the matmul time. On H100 at e = 0.35:
// r(128) = 989 x 0.35 / (7 x 128 x 3.9) = 0.0991, r(64) = 0.1981, so hd 64 takes
// 1.1981 / 1.0991 = 1.090x the time per FLOP. The Hopper kernels take their measured rate
// by head dim: the H100 preset's cuDNN ran hd 64 at 0.815 of hd 128's rate, 1 / 0.815 = 1.227x
// the time per FLOP; a device without that curve prices every head dim as 128's.
TEST(FusedAttention, SmallerHeadsPayForTheSoftmaxExponentialsInPreHopperKernels) {
  ClusterSpec c = load_cluster("dgx-h100", {}, 8, "");
  EXPECT_DOUBLE_EQ(c.device.special_function_rate, 3.9e12);
  c.device.kernel_overhead_s = 0;
  for (int g = 1; g <= 3; ++g) c.device.flash_efficiency[g] = {{{512, 0.35}, {65536, 0.35}}};
  auto per_flop = [&](Attention k, int heads) {
    const Op o = flash_op(k, heads);
    return kernel_time_s(c.device, o) / o.flops;
  };
  const double r128 = 989.0 * 0.35 / (7 * 128 * 3.9), r64 = 989.0 * 0.35 / (7 * 64 * 3.9);
  EXPECT_NEAR(per_flop(Attention::kFlash2, 32) / per_flop(Attention::kFlash2, 16), (1 + r64) / (1 + r128), 1e-12);
  EXPECT_NEAR(per_flop(Attention::kFlash2, 16), 1 / (989e12 * 0.35), 1e-27);  // hd 128: the curve itself
  EXPECT_NEAR(per_flop(Attention::kFlash3, 32) / per_flop(Attention::kFlash3, 16), 1 / 0.815, 1e-12);
  c.device.flash3_head_dim_rate = {};
  EXPECT_NEAR(per_flop(Attention::kFlash3, 32), per_flop(Attention::kFlash3, 16), 1e-27);
  c.device.special_function_rate = 0;  // a spec without the rate: every head dim as 128's
  EXPECT_NEAR(per_flop(Attention::kFlash2, 32), per_flop(Attention::kFlash2, 16), 1e-27);
}

// The presets order the generations as the papers do: on H100, FlashAttention-1 < -2 < the
// Hopper kernels at every length; on A100 flash3 runs as flash2.
TEST(FusedAttention, PresetsOrderTheKernelGenerations) {
  const ClusterSpec h = load_cluster("dgx-h100", {}, 8, ""), a = load_cluster("dgx-a100", {}, 8, "");
  for (double s : {512.0, 2048.0, 8192.0, 32768.0}) {
    EXPECT_LT(h.device.flash_efficiency[1].at(s), h.device.flash_efficiency[2].at(s)) << s;
    EXPECT_LT(h.device.flash_efficiency[2].at(s), h.device.flash_efficiency[3].at(s)) << s;
    EXPECT_LT(a.device.flash_efficiency[1].at(s), a.device.flash_efficiency[2].at(s)) << s;
  }
  EXPECT_TRUE(a.device.flash_efficiency[3].points.empty());
  EXPECT_NEAR(kernel_time_s(a.device, flash_op(Attention::kFlash3)), kernel_time_s(a.device, flash_op(Attention::kFlash2)),
              1e-15);
  // The curves survive the TOML round trip (`loom calibrate` writes clusters this way).
  const ClusterSpec back = cluster_from_toml(cluster_to_toml(h), "round trip");
  for (int g = 1; g <= 3; ++g) EXPECT_EQ(back.device.flash_efficiency[g].points, h.device.flash_efficiency[g].points);
  EXPECT_DOUBLE_EQ(back.device.special_function_rate, h.device.special_function_rate);
  EXPECT_EQ(back.device.flash3_head_dim_rate.points, h.device.flash3_head_dim_rate.points);
}

// A faster kernel generation makes the same long-sequence step faster, and only attention
// changes: the step's model FLOPs (causal half) stay the same.
TEST(FusedAttention, NewerKernelsShortenALongSequenceStep) {
  SimPlan p;
  p.cfg = load_config("", {"model.preset=llama3-8b", "model.ctx=16384", "train.batch=8", "parallel.tp=8"});
  const ClusterSpec c = load_cluster("dgx-h100", {}, 8, "");
  double last = 1e300, flops = -1;
  for (Attention k : {Attention::kFlash1, Attention::kFlash2, Attention::kFlash3}) {
    p.attention = k;
    const SimResult r = simulate(p, c);
    EXPECT_LT(r.step_time_s, last) << int(k);
    if (flops >= 0) {
      EXPECT_EQ(r.model_flops, flops);
    }
    last = r.step_time_s, flops = r.model_flops;
  }
}

PublishedRun row_of(const std::string& framework, const std::string& counts) {
  PublishedRun row;
  row.fields = {{"row_id", "1"}, {"gpu_type", "H100-80GB"}, {"num_gpus", "8"}, {"num_layers", "4"},
                {"hidden_size", "1024"}, {"num_attention_heads", "8"}, {"ffn_hidden", "4096"},
                {"vocab_size", "50368"}, {"seq_length", "2048"}, {"global_batch_size", "16"},
                {"micro_batch_size", "2"}, {"tensor_parallel", "1"}, {"pipeline_parallel", "1"},
                {"data_parallel", "8"}, {"tflops_per_gpu", "300"}, {"model", "GPT 1B"},
                {"framework", framework}, {"metric_counts_recompute", counts}};
  return row;
}

// Note [Published frameworks]: the attention kernel comes from the row's framework column.
TEST(Published, AttentionKernelFollowsTheRowsFramework) {
  EXPECT_EQ(published_case(row_of("Megatron-LM (2021)", "")).plan.attention, Attention::kUnfused);
  EXPECT_EQ(published_case(row_of("NeMo (NeMo Launcher / Megatron-Core), container 24.12", "")).plan.attention,
            Attention::kFlash3);
  EXPECT_EQ(published_case(row_of("Megatron-Core r0.8.0", "")).plan.attention, Attention::kFlash3);
  EXPECT_EQ(published_case(row_of("MaxText (JAX/XLA)", "")).plan.attention, Attention::kFlash3);
  EXPECT_EQ(published_case(row_of("llm-foundry / Composer (PyTorch FSDP, FlashAttention)", "")).plan.attention,
            Attention::kFlash1);
  EXPECT_EQ(published_case(row_of("somebody's trainer", "")).plan.attention, Attention::kUnfused);
}

// Issue 57: a row's precision picks its GEMM format (Note [fp8 GEMMs], Note [NVFP4 GEMMs]);
// one the simulator cannot price (another 4- or 6-bit format) is refused by name (and
// bench/sim_published lists it as skipped), never simulated as bf16; NVFP4 on a GPU without
// fp4 tensor cores is refused naming the device.
TEST(Published, ARowsPrecisionPicksItsGemmFormatAndUnpricedFormatsAreRefused) {
  for (const auto& [p, want] : std::vector<std::pair<std::string, GemmFormat>>{
           {"fp8", GemmFormat::kFp8}, {"amp_fp8", GemmFormat::kFp8}, {"fp8 (hybrid)", GemmFormat::kFp8},
           {"fp8 (current scaling)", GemmFormat::kFp8Current}, {"mxfp8", GemmFormat::kMxfp8},
           {"bf16", GemmFormat::kBf16}, {"amp_bf16", GemmFormat::kBf16}, {"fp16 (mixed)", GemmFormat::kBf16},
           {"", GemmFormat::kBf16}}) {
    PublishedRun row = row_of("Megatron-Core r0.8.0", "");
    row.fields["precision"] = p;
    EXPECT_EQ(published_case(row).plan.gemm_format, want) << p;
    EXPECT_GT(check_published(row).predicted, 0) << p;
  }
  for (const char* p : {"mxfp4", "fp6"}) {
    PublishedRun row = row_of("Megatron-Core r0.8.0", "");
    row.fields["precision"] = p;
    try {
      published_case(row);
      ADD_FAILURE() << p << " was simulated";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("precision '") + p + "' is not priced"), std::string::npos)
          << e.what();
    }
  }
  PublishedRun row = row_of("Megatron-Core r0.8.0", "");
  row.fields["precision"] = "nvfp4";
  EXPECT_EQ(published_case(row).plan.gemm_format, GemmFormat::kNvfp4);
  try {
    check_published(row);
    ADD_FAILURE() << "nvfp4 was simulated on an H100";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no fp4 tensor cores"), std::string::npos) << e.what();
  }
  row.fields["gpu_type"] = "B200 (DGX-B200)";
  EXPECT_GT(check_published(row).predicted, 0);
}

// Narayanan et al. (2021) eq. (3) counts the recomputed forward: 96 B s l h^2 (1 + s/6h +
// V/16lh) = 4 passes of the layers and 3 of the head; model FLOPs (MFU, llm-foundry's
// "model TFLOP/s") are 72 B s l h^2 (1 + s/6h + V/12lh) = 3 passes of both. Per sequence of
// s = 2048, l = 4, h = 1024, V = 50368:
//   72 s l h^2 = 6.185e11, 12 s^2 l h = 2.062e11, 6 s V h = 6.338e11 -> 1.4585e12 FLOP;
// with recompute the layers' 8.247e11 count 4/3 times: 1.0996e12 + 6.338e11 = 1.7335e12.
TEST(Published, TflopsCountTheRecomputeOnlyWhereTheRowSaysSo) {
  const double s = 2048, l = 4, h = 1024, V = 50368;
  const double layers = 72 * s * l * h * h + 12 * s * s * l * h, head = 6 * s * V * h;
  EXPECT_NEAR(megatron_flops_per_iteration(1, s, l, h, V, false), layers + head, 1e-9 * (layers + head));
  EXPECT_NEAR(megatron_flops_per_iteration(1, s, l, h, V, true), layers * 4 / 3 + head, 1e-9 * (layers + head));
  // The reader picks the count from metric_counts_recompute.
  const PublishedCheck yes = check_published(row_of("Megatron-LM (2021)", "yes (Megatron formula 96*B*s*l*h^2...)"));
  const PublishedCheck no = check_published(row_of("Megatron-LM (2021)", "both given: ...; tflops column = model TFLOP/s"));
  EXPECT_NEAR(yes.predicted / no.predicted, (layers * 4 / 3 + head) / (layers + head), 1e-9);
}

// Note [Unstated recompute]: a sharded row that leaves its recompute unstated takes the least
// that fits the device (a 70B-shaped GPT, 2 x 8,192 tokens a GPU, sharded over 64 H100s: none
// needs hundreds of GiB, full fits) and says so; over 8 GPUs nothing fits (the states alone
// need 140 GB a GPU) and none stays, said; a stated recompute, a row that fits without, and a
// row that shards nothing are left as they are.
TEST(Published, UnstatedRecomputeOfAShardedRowIsTheLeastThatFits) {
  PublishedRun big = row_of("MaxText (JAX/XLA)", "");
  for (auto [k, v] : {std::pair{"num_layers", "80"}, {"hidden_size", "8192"}, {"num_attention_heads", "64"},
                      {"ffn_hidden", "28672"}, {"seq_length", "8192"}, {"zero_or_sharding", "FSDP (ZeRO-3-like)"}})
    big.fields[k] = v;
  PublishedRun eight = big;
  const PublishedCase none_fits = published_case(eight);
  EXPECT_EQ(none_fits.plan.cfg.parallel.recompute, std::vector<Recompute>{Recompute::kNone});
  EXPECT_NE(none_fits.assumed.find("recompute unstated: none, though nothing fits (none needs "), std::string::npos)
      << none_fits.assumed;
  for (auto [k, v] : {std::pair{"num_gpus", "64"}, {"data_parallel", "64"}, {"global_batch_size", "128"}}) big.fields[k] = v;
  const PublishedCase c = published_case(big);
  EXPECT_EQ(c.plan.cfg.parallel.recompute, std::vector<Recompute>{Recompute::kFull});
  EXPECT_NE(c.assumed.find("recompute unstated: full (none needs "), std::string::npos) << c.assumed;
  EXPECT_LE(simulate(c.plan, c.cluster).peak_memory_bytes, c.cluster.device.memory_bytes);
  EXPECT_EQ(check_published(big).assumed, c.assumed);

  PublishedRun stated = big;
  stated.fields["recompute"] = "selective";
  EXPECT_EQ(published_case(stated).plan.cfg.parallel.recompute, std::vector<Recompute>{Recompute::kSelective});
  EXPECT_TRUE(published_case(stated).assumed.empty());
  PublishedRun unsharded = big;
  unsharded.fields["zero_or_sharding"] = "";
  EXPECT_EQ(published_case(unsharded).plan.cfg.parallel.recompute, std::vector<Recompute>{Recompute::kNone});
  PublishedRun small = row_of("MaxText (JAX/XLA)", "");
  small.fields["zero_or_sharding"] = "FSDP (ZeRO-3-like)";
  EXPECT_EQ(published_case(small).plan.cfg.parallel.recompute, std::vector<Recompute>{Recompute::kNone});
  EXPECT_TRUE(published_case(small).assumed.empty());
}

// Note [Unstated Megatron flags]: a Megatron-LM README row states the overlap flags and not the
// micro-batch, ffn, sharding or sp; --overlap-param-gather implies the distributed optimizer
// (ZeRO-1), --tp-comm-overlap sequence parallelism at tp > 1, and the rest take Megatron's
// defaults (micro-batch 1 from its examples, ffn 4 h), each said. Without the flags nothing is
// inferred.
TEST(Published, UnstatedMegatronFlagsTakeWhatMegatronImplies) {
  PublishedRun row = row_of("Megatron-Core r0.8.0", "no (MFU)");
  for (const char* k : {"micro_batch_size", "ffn_hidden"}) row.fields.erase(k);
  for (auto [k, v] : {std::pair{"tensor_parallel", "4"}, {"data_parallel", "2"},
                      {"notes", "Overlap enabled: --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap"}})
    row.fields[k] = v;
  const PublishedCase c = published_case(row);
  const ParallelConfig& par = c.plan.cfg.parallel;
  EXPECT_EQ(par.micro_batch, 1);
  EXPECT_EQ(c.plan.cfg.train.grad_accum, 8);  // 16 sequences over dp 2, one at a time
  EXPECT_EQ(c.plan.cfg.model.ffn, 4 * 1024);
  EXPECT_EQ(par.zero, 1);
  EXPECT_TRUE(par.sp);
  EXPECT_EQ(c.plan.framework, Framework::kMegatron);
  EXPECT_TRUE(c.plan.param_gather_overlap && c.plan.dp_overlap && c.plan.tp_overlap);
  for (const char* said : {"micro-batch unstated: 1", "ffn unstated: 4 h", "distributed optimizer (ZeRO-1)",
                           "--tp-comm-overlap: sequence parallel"})
    EXPECT_NE(c.assumed.find(said), std::string::npos) << said << " not in: " << c.assumed;
  PublishedRun plain = row;
  plain.fields["notes"] = "";
  const PublishedCase p = published_case(plain);
  EXPECT_EQ(p.plan.cfg.parallel.zero, 0);
  EXPECT_FALSE(p.plan.cfg.parallel.sp);
  EXPECT_EQ(p.assumed, "micro-batch unstated: 1; ffn unstated: 4 h");
  PublishedRun llama = plain;
  llama.fields["model"] = "Llama 3 8B";
  EXPECT_THROW(published_case(llama), loom::Error);  // a Llama row's MLP width has no Megatron default to take
}

// Note [NeMo launcher configs]: a NeMo launcher row runs its config's distributed optimizer
// (ZeRO-1) with the reduce and gather overlapped, sp and overlapped tp communication at tp > 1,
// no recompute; Nemotron-4 340B's config overlaps no tp communication and recomputes
// selectively. What the row states wins.
TEST(Published, NemoLauncherRowsTakeTheirConfigs) {
  PublishedRun row = row_of("NeMo (NeMo Launcher / Megatron-Core), container 24.12", "no (MFU)");
  row.fields["tensor_parallel"] = "4", row.fields["data_parallel"] = "2";
  const PublishedCase c = published_case(row);
  EXPECT_EQ(c.plan.cfg.parallel.zero, 1);
  EXPECT_TRUE(c.plan.cfg.parallel.sp);
  EXPECT_TRUE(c.plan.dp_overlap && c.plan.param_gather_overlap && c.plan.tp_overlap);
  EXPECT_EQ(c.plan.cfg.parallel.recompute_layers(4), std::vector<Recompute>(4, Recompute::kNone));
  EXPECT_NE(c.assumed.find("NeMo launcher config"), std::string::npos) << c.assumed;
  PublishedRun big = row;
  big.fields["model"] = "Nemotron-4 340B";
  big.fields["num_query_groups"] = "8", big.fields["ffn_hidden"] = "6144";
  const PublishedCase b = published_case(big);
  EXPECT_FALSE(b.plan.tp_overlap);
  EXPECT_TRUE(b.plan.cfg.parallel.sp && b.plan.dp_overlap);
  EXPECT_EQ(b.plan.cfg.parallel.recompute_layers(4), std::vector<Recompute>(4, Recompute::kSelective));
  PublishedRun stated = row;
  stated.fields["sequence_parallel"] = "no", stated.fields["zero_or_sharding"] = "none";
  const PublishedCase s = published_case(stated);
  EXPECT_FALSE(s.plan.cfg.parallel.sp);
  EXPECT_EQ(s.plan.cfg.parallel.zero, 0);
  // Another framework's row infers none of it.
  const PublishedCase m = published_case(row_of("Megatron-LM (2021)", ""));
  EXPECT_FALSE(m.plan.dp_overlap || m.plan.param_gather_overlap || m.plan.tp_overlap);
}

// Note [Stack efficiency]: llm-foundry's 2023 stack on H100 runs at 0.904 of the preset's
// compute rate, Megatron-core (NeMo 24.12's launcher, Megatron-LM's r0.8.0 README) at 0.864,
// on Blackwell too; the same stacks on A100, and Megatron-LM before core, at the preset's own.
TEST(Published, FoundryOnH100RunsAtItsStacksComputeRate) {
  const double h100 = load_cluster("dgx-h100", {}, 8, "").device.peak_flops;
  const std::string foundry = "llm-foundry / Composer (PyTorch FSDP, FlashAttention)";
  EXPECT_NEAR(published_case(row_of(foundry, "")).cluster.device.peak_flops, 0.904 * h100, 1e-6 * h100);
  EXPECT_NEAR(published_case(row_of("NeMo (NeMo Launcher / Megatron-Core), container 24.12", "")).cluster.device.peak_flops,
              0.864 * h100, 1e-6 * h100);
  EXPECT_NEAR(published_case(row_of("Megatron-Core r0.8.0", "")).cluster.device.peak_flops, 0.864 * h100, 1e-6 * h100);
  EXPECT_EQ(published_case(row_of("Megatron-LM (2021)", "")).cluster.device.peak_flops, h100);
  PublishedRun a100 = row_of(foundry, "");
  a100.fields["gpu_type"] = "A100-SXM4-80GB";
  EXPECT_EQ(published_case(a100).cluster.device.peak_flops, load_cluster("dgx-a100", {}, 8, "").device.peak_flops);
  // Megatron-core on Blackwell takes its H100 factor (the B200 preset's curves are the H100's).
  PublishedRun b200 = row_of("Megatron-Bridge / NeMo 25.11", "");
  b200.fields["gpu_type"] = "B200 (DGX-B200)";
  const double b200_peak = load_cluster("dgx-b200", {}, 8, "").device.peak_flops;
  EXPECT_NEAR(published_case(b200).cluster.device.peak_flops, 0.864 * b200_peak, 1e-6 * b200_peak);
  // A slower compute rate is a slower step, by less than the rate (memory-bound kernels and
  // collectives keep theirs).
  const PublishedCase c = published_case(row_of(foundry, ""));
  ClusterSpec full = c.cluster;
  full.device.peak_flops = h100;
  const double slow = simulate(c.plan, c.cluster).step_time_s, fast = simulate(c.plan, full).step_time_s;
  EXPECT_GT(slow, fast);
  EXPECT_LT(slow, fast / 0.904);
}

// Note [Stack efficiency]: llm-foundry's H100 factor is the one that prices its four
// compute-bound rows (232, 238, 241, 244 of the reference set, copied beside this test) with zero
// mean error, to the factor's three digits (a step of 0.001 moves that mean by ~0.1%).
TEST(Published, FoundryH100FactorZeroesItsFitRowsMeanError) {
  const auto rows = read_published_runs(LOOM_SOURCE_DIR "/tests/reference/foundry_h100_fit_rows.csv");
  ASSERT_EQ(rows.size(), 4u);
  double mean = 0;
  for (const auto& row : rows) mean += check_published(row).error() / 4;
  EXPECT_LT(std::fabs(mean), 0.0005) << mean;
}

// Note [Published checkpoint]: llm-foundry's H100 BF16 and 80 GB A100 tables ran a torch 2.1
// nightly with the non-reentrant checkpoint, so their full recompute stops before the MLP's
// output projection; the 40 GB A100 table (torch 1.13), the FP8 table and other stacks rerun
// the whole block.
TEST(Published, FoundryRowsOfTheTorch21ImageStopTheirRecomputeEarly) {
  const std::string readme = "mosaicml/llm-foundry scripts/train/benchmarking/README.md section ";
  auto early = [&](const std::string& framework, const std::string& section, const std::string& gpu) {
    PublishedRun row = row_of(framework, "");
    row.fields["source_detail"] = readme + section + " (commit 4952183768)";
    row.fields["gpu_type"] = gpu, row.fields["zero_or_sharding"] = "PyTorch FSDP FULL_SHARD (~ZeRO-3)";
    row.fields["recompute"] = "full (activation checkpointing)";
    const PublishedCase c = published_case(row);
    EXPECT_EQ(c.plan.framework, Framework::kFsdp);
    return c.plan.recompute_early_stop;
  };
  const std::string foundry = "llm-foundry / Composer (PyTorch FSDP, FlashAttention)";
  EXPECT_TRUE(early(foundry, "'H100 80GB BF16'", "H100-80GB"));
  EXPECT_TRUE(early(foundry, "'H100 80GB BF16 (Large Scale, >= 128 GPUs)'", "H100-80GB"));
  EXPECT_TRUE(early(foundry, "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'", "A100-80GB"));
  EXPECT_FALSE(early(foundry, "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'", "A100-40GB"));
  EXPECT_FALSE(early(foundry, "'H100 80GB FP8'", "H100-80GB"));
  EXPECT_FALSE(early("DeepSpeed (2023)", "'H100 80GB BF16'", "H100-80GB"));
}

// The 40 GB A100 rows run on the 40 GB part's HBM2 (1,555 GB/s, 40 GiB; datasheet), the rest
// of the dgx-a100 preset unchanged; 80 GB rows keep 2,039 GB/s.
TEST(Published, A100FortyGigabyteRowsRunOnTheirOwnMemory) {
  PublishedRun row = row_of("llm-foundry / Composer (PyTorch FSDP, FlashAttention)", "");
  row.fields["gpu_type"] = "A100-40GB";
  const ClusterSpec forty = published_case(row).cluster;
  EXPECT_DOUBLE_EQ(forty.device.memory_bw, 1555e9);
  EXPECT_DOUBLE_EQ(forty.device.memory_bytes, 40.0 * double(int64_t(1) << 30));
  row.fields["gpu_type"] = "A100-80GB";
  const ClusterSpec eighty = published_case(row).cluster;
  EXPECT_DOUBLE_EQ(eighty.device.memory_bw, load_cluster("dgx-a100", {}, 8, "").device.memory_bw);
  EXPECT_EQ(forty.device.peak_flops, eighty.device.peak_flops);
  EXPECT_GT(simulate(published_case(row).plan, forty).step_time_s, simulate(published_case(row).plan, eighty).step_time_s);
}

}  // namespace
}  // namespace loom::sim
