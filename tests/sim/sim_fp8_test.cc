// Note [fp8 GEMMs] (sim/costs.cc): the blocks' linear layers at the device's fp8 rate, the
// casts they add, the weights' step cast and copies, and what is refused. Arithmetic on the
// dgx-h100 preset (fp8 peak 1,979 TFLOP/s; its fp8 GEMM curve 0.73 of the bf16 curve's
// fraction, 0.707 at 1e12).
#include <gtest/gtest.h>

#include <cmath>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

TEST(Fp8, AGemmRunsAtTheFp8PeakTimesItsCurve) {
  const ClusterSpec c = load_cluster("dgx-h100", {}, 8, "");
  const double flops = 1e12, overhead = c.device.kernel_overhead_s;
  const double e8 = c.device.fp8_gemm_efficiency.at(flops);
  EXPECT_NEAR(e8, 0.73 * 0.707, 1e-4);  // the preset's four digits
  EXPECT_NEAR(gemm_time_s(c.device, flops, 0, 0, true), flops / (1979e12 * e8) + overhead, 1e-12);
  EXPECT_NEAR(gemm_time_s(c.device, flops, 0, 0, false), flops / (989e12 * 0.707) + overhead, 1e-12);
  // The cast of 1e6 values: read bf16, write fp8 and its transpose (4 bytes); current scaling
  // reads once more for the amax (6); MXFP8 adds a scale byte per 32 values to both copies.
  EXPECT_EQ(fp8_cast_bytes(GemmFormat::kFp8, 1e6), 4e6);
  EXPECT_EQ(fp8_cast_bytes(GemmFormat::kFp8Current, 1e6), 6e6);
  EXPECT_EQ(fp8_cast_bytes(GemmFormat::kMxfp8, 1e6), 4.0625e6);
  EXPECT_EQ(fp8_cast_bytes(GemmFormat::kBf16, 1e6), 0);
}

// A GPT block of h = 1024, f = 4096 over n = 2048 token rows: four linear layers, each with
// a cast of its input forward (n x in x 4 bytes) and of its output gradient backward
// (n x out x 4); the GEMMs keep their FLOPs, and attention stays bf16.
TEST(Fp8, ABlocksLinearLayersCastTheirInputsAndOutputGradients) {
  const ModelConfig m = load_config("", {"model.preset=gpt2", "model.d_model=1024", "model.heads=16",
                                         "model.ffn=4096", "model.ctx=2048"}).model;
  LayerShape x = LayerShape::of(m, 1, 2048, 1, 1, false, 2);
  const std::vector<Op> bf16 = block_forward_ops(x);
  x.gemm_format = GemmFormat::kFp8;
  const std::vector<Op> fp8 = block_forward_ops(x);
  const double n = 2048;
  struct Want {
    const char* name;
    double in, out;
  };
  for (const Want& w : {Want{"qkv", 1024, 3072}, Want{"proj", 1024, 1024}, Want{"fc1", 1024, 4096},
                        Want{"fc2", 4096, 1024}}) {
    const std::string cast = std::string(w.name) + "_fp8_cast";
    int found = 0;
    for (size_t i = 0; i + 1 < fp8.size(); i++)
      if (fp8[i].name == cast) {
        found++;
        EXPECT_EQ(fp8[i].bytes, n * w.in * 4) << cast;
        EXPECT_EQ(fp8[i].backward_bytes, n * w.out * 4) << cast;
        EXPECT_EQ(fp8[i + 1].name, w.name);
        EXPECT_TRUE(fp8[i + 1].fp8);
        EXPECT_EQ(fp8[i + 1].flops, 2 * n * w.in * w.out);
        EXPECT_EQ(fp8[i + 1].bytes, n * w.in + w.in * w.out + n * w.out * 2);  // one-byte operands
      }
    EXPECT_EQ(found, 1) << cast;
  }
  EXPECT_EQ(fp8.size(), bf16.size() + 4);
  for (const Op& o : fp8)
    if (o.kind == Op::Kind::kAttention || o.attention_core) EXPECT_FALSE(o.fp8) << o.name;
}

// Llama 3 8B at tp 2: 32 blocks of qkv (4096 x 6144 / 2), proj (4096 x 4096 / 2) and the
// SwiGLU MLP (3 x 4096 x 14336 / 2) weights.
constexpr double kLlamaBlockWeights = (4096.0 * 6144 + 4096.0 * 4096 + 3 * 4096.0 * 14336) / 2;

SimPlan llama_plan() {
  SimPlan p;
  p.cfg = load_config("", {"model.preset=llama3-8b", "model.ctx=8192", "train.batch=64", "parallel.tp=2", "parallel.dp=8"});
  p.attention = Attention::kFlash3;
  return p;
}

// On an H100 the fp8 step is faster than bf16's but not twice (attention, norms, the head,
// communication and the casts stay); each rank holds 2 more bytes per fp8 weight.
TEST(Fp8, AStepIsFasterThanBf16ButNotTwiceAndHoldsTheFp8Copies) {
  const ClusterSpec c = load_cluster("dgx-h100", {}, 16, "");
  SimPlan p = llama_plan();
  const SimResult bf16 = simulate(p, c);
  p.gemm_format = GemmFormat::kFp8;
  const SimResult fp8 = simulate(p, c);
  p.gemm_format = GemmFormat::kFp8Current;
  const SimResult current = simulate(p, c);
  EXPECT_LT(fp8.step_time_s, bf16.step_time_s);
  EXPECT_GT(fp8.step_time_s, bf16.step_time_s / 2);
  EXPECT_GT(current.step_time_s, fp8.step_time_s);  // the amax pass
  EXPECT_EQ(fp8.model_flops, bf16.model_flops);
  // 2 bytes each of the 32 blocks' linear weights
  EXPECT_NEAR(fp8.ranks[0].memory.params - bf16.ranks[0].memory.params, 32 * kLlamaBlockWeights * 2, 1.0);
}

// Note [fp8 weights under ZeRO-3]: sharded (FSDP's ZeRO-3), a rank holds the fp8 copies of the
// two units its gather pool holds (2 x 2 bytes of one block's linear weights), not its 32
// blocks', and casts the blocks' weights in each forward and backward (2 m = 8 casts in the
// passes, m = 4) instead of once a step; unsharded (ZeRO-2) it casts once and holds them all.
TEST(Fp8, ShardedWeightsAreCastAtEachGatherAndHeldOnlyThere) {
  const ClusterSpec c = load_cluster("dgx-h100", {}, 16, "");
  auto run = [&](int zero, GemmFormat f) {
    SimPlan p = llama_plan();
    p.framework = Framework::kFsdp;
    p.cfg = load_config("", {"model.preset=llama3-8b", "model.ctx=8192", "train.batch=64", "train.grad_accum=4",
                             "parallel.tp=2", "parallel.dp=8", "parallel.zero=" + std::to_string(zero)});
    p.gemm_format = f;
    return simulate(p, c);
  };
  const SimResult sharded = run(3, GemmFormat::kFp8), whole = run(2, GemmFormat::kFp8);
  EXPECT_NEAR(sharded.ranks[0].memory.params - run(3, GemmFormat::kBf16).ranks[0].memory.params,
              2 * kLlamaBlockWeights * 2, 1.0);
  EXPECT_NEAR(whole.ranks[0].memory.params - run(2, GemmFormat::kBf16).ranks[0].memory.params,
              32 * kLlamaBlockWeights * 2, 1.0);
  const double cast = memory_time_s(c.device, fp8_cast_bytes(GemmFormat::kFp8, 32 * kLlamaBlockWeights));
  EXPECT_NEAR(sharded.breakdown.compute - whole.breakdown.compute, 8 * cast, 1e-6);
  EXPECT_LT(sharded.breakdown.optimizer, whole.breakdown.optimizer);  // no step cast
}

// With fp8 gathers the all-gather moves 1 byte a weight instead of 2 (half the ZeRO time where it
// is exposed), the forward casts nothing and the backward only transposes the fp8 values (2
// bytes a weight); refused without fp8 GEMMs or ZeRO-3.
TEST(Fp8, Fp8GathersMoveOneByteAWeightAndOnlyTransposeInBackward) {
  const ClusterSpec c = load_cluster("dgx-h100", {}, 16, "");
  auto plan = [&](int zero, GemmFormat f, bool fp8_gather) {
    SimPlan p = llama_plan();
    p.framework = Framework::kFsdp;
    p.cfg = load_config("", {"model.preset=llama3-8b", "model.ctx=8192", "train.batch=64", "train.grad_accum=4",
                             "parallel.tp=2", "parallel.dp=8", "parallel.zero=" + std::to_string(zero)});
    p.gemm_format = f;
    p.fp8_param_gather = fp8_gather;
    return p;
  };
  const SimResult bf16_gather = simulate(plan(3, GemmFormat::kFp8, false), c);
  const SimResult fp8_gather = simulate(plan(3, GemmFormat::kFp8, true), c);
  const double w = 32 * kLlamaBlockWeights;
  const double saved = 8 * memory_time_s(c.device, fp8_cast_bytes(GemmFormat::kFp8, w)) -
                       4 * memory_time_s(c.device, 2 * w);  // 4 forwards' and 4 backwards' casts, 4 transposes
  EXPECT_NEAR(bf16_gather.breakdown.compute - fp8_gather.breakdown.compute, saved, 1e-6);
  EXPECT_LT(fp8_gather.breakdown.zero_comm, bf16_gather.breakdown.zero_comm);
  EXPECT_THROW(simulate(plan(3, GemmFormat::kBf16, true), c), ConfigError);
  EXPECT_THROW(simulate(plan(2, GemmFormat::kFp8, true), c), ConfigError);
}

TEST(Fp8, RefusedWhereThereAreNoFp8TensorCoresAndOnLoomsEngine) {
  SimPlan p = llama_plan();
  p.gemm_format = GemmFormat::kFp8;
  try {
    simulate(p, load_cluster("dgx-a100", {}, 16, ""));
    FAIL() << "fp8 on an A100 was priced";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no fp8 tensor cores"), std::string::npos) << e.what();
  }
  p.framework = Framework::kLoom;
  EXPECT_THROW(simulate(p, load_cluster("dgx-h100", {}, 16, "")), ConfigError);
  EXPECT_THROW(parse_gemm_format("fp4"), ConfigError);
  EXPECT_EQ(parse_gemm_format("mxfp8"), GemmFormat::kMxfp8);
}

// Note [NVFP4 GEMMs]: on a B200 (fp4 peak 9,000 TFLOP/s dense) a GEMM runs at the fp4 peak
// times the curve; a cast of n values moves 2 (amax) + 2 (read) + 2 x (0.5 + 1/16) bytes a
// value; operands take half a byte plus a scale byte per 16; a weight's two copies 2 x (0.5 +
// 1/256) bytes.
TEST(Nvfp4, AGemmRunsAtTheFp4PeakAndItsCastsAndCopiesAreBlockScaled) {
  const ClusterSpec c = load_cluster("dgx-b200", {}, 8, "");
  const double flops = 1e12, overhead = c.device.kernel_overhead_s, e = c.device.fp8_gemm_efficiency.at(flops);
  EXPECT_NEAR(gemm_time_s(c.device, flops, 0, 0, true, true), flops / (9000e12 * e) + overhead, 1e-12);
  EXPECT_NEAR(gemm_time_s(c.device, flops, 0, 0, true, false), flops / (4500e12 * e) + overhead, 1e-12);
  EXPECT_DOUBLE_EQ(fp8_cast_bytes(GemmFormat::kNvfp4, 1e6), 5.125e6);
  EXPECT_DOUBLE_EQ(operand_bytes(GemmFormat::kNvfp4, 2), 0.5625);
  EXPECT_DOUBLE_EQ(operand_bytes(GemmFormat::kMxfp8, 2), 1);
  EXPECT_DOUBLE_EQ(operand_bytes(GemmFormat::kBf16, 2), 2);
  EXPECT_DOUBLE_EQ(weight_copy_bytes(GemmFormat::kNvfp4), 2 * (0.5 + 1.0 / 256));
  EXPECT_DOUBLE_EQ(weight_copy_bytes(GemmFormat::kFp8), 2);
  EXPECT_EQ(parse_gemm_format("nvfp4"), GemmFormat::kNvfp4);
  const ModelConfig m = load_config("", {"model.preset=gpt2", "model.d_model=1024", "model.heads=16",
                                         "model.ffn=4096", "model.ctx=2048"}).model;
  LayerShape x = LayerShape::of(m, 1, 2048, 1, 1, false, 2);
  x.gemm_format = GemmFormat::kNvfp4;
  int linears = 0;
  for (const Op& o : block_forward_ops(x))
    if (o.name == "fc1") {
      linears++;
      EXPECT_TRUE(o.fp8 && o.fp4);
      EXPECT_DOUBLE_EQ(o.bytes, 0.5625 * (2048.0 * 1024 + 1024.0 * 4096) + 2048.0 * 4096 * 2);
    }
  EXPECT_EQ(linears, 1);
}

// On a B200 an NVFP4 step is faster than fp8's but not twice, holds 2 x (0.5 + 1/256) bytes
// per weight where fp8 holds 2, and NVFP4 is refused on an H100 (no fp4 tensor cores).
TEST(Nvfp4, AStepIsFasterThanFp8ButNotTwiceAndRefusedWithoutFp4TensorCores) {
  const ClusterSpec c = load_cluster("dgx-b200", {}, 16, "");
  SimPlan p = llama_plan();
  p.gemm_format = GemmFormat::kFp8Current;
  const SimResult fp8 = simulate(p, c);
  p.gemm_format = GemmFormat::kNvfp4;
  const SimResult fp4 = simulate(p, c);
  EXPECT_LT(fp4.step_time_s, fp8.step_time_s);
  EXPECT_GT(fp4.step_time_s, fp8.step_time_s / 2);
  EXPECT_NEAR(fp8.ranks[0].memory.params - fp4.ranks[0].memory.params,
              32 * kLlamaBlockWeights * (2 - 2 * (0.5 + 1.0 / 256)), 1.0);
  try {
    simulate(p, load_cluster("dgx-h100", {}, 16, ""));
    FAIL() << "nvfp4 on an H100 was priced";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no fp4 tensor cores"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::sim
