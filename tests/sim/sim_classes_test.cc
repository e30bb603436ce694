// Memory-bound ops priced by their class's measured curves (Note [Memory-bound kernel
// classes] in sim/costs.cc), with the arithmetic shown.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"
#include "loom/sim/unit_cost.h"
#include "loom/sim/zero_cost.h"

namespace loom::sim {
namespace {

Curve flat(double y) {
  Curve c;
  c.points = {{1e3, y}, {1e9, y}};
  return c;
}

Op block_op(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& o : ops)
    if (o.name == name) return o;
  ADD_FAILURE() << "no op " << name;
  return {};
}

// A device at 100 GB/s whose averaged curve reads 0.8 and whose norm class reads 0.25 with
// a backward 1.5x its forward: a 2 MB norm costs 2e6 / (100e9 x 0.25) = 80 us (+ 1 us
// overhead) forward and 1.5 x 81 us backward; a generic op keeps 2e6 / 80e9 + 1 us forward
// and twice the bytes backward.
TEST(MemoryClasses, ClassCurvesPriceTheirOpsForwardAndBackward) {
  DeviceSpec d;
  d.memory_bw = 100e9, d.kernel_overhead_s = 1e-6;
  d.memory_efficiency = flat(0.8);
  d.class_efficiency[int(MemClass::kNorm)] = flat(0.25);
  d.class_backward[int(MemClass::kNorm)] = flat(1.5);
  Op norm;
  norm.kind = Op::Kind::kMemory, norm.bytes = 2e6, norm.mem_class = MemClass::kNorm;
  EXPECT_NEAR(kernel_time_s(d, norm), 80e-6 + 1e-6, 1e-12);
  EXPECT_NEAR(memory_class_time_s(d, norm, true), 1.5 * 81e-6, 1e-12);
  Op plain = norm;
  plain.mem_class = MemClass::kGeneric;
  EXPECT_NEAR(kernel_time_s(d, plain), 2e6 / 80e9 + 1e-6, 1e-12);
  EXPECT_NEAR(memory_class_time_s(d, plain, true), 4e6 / 80e9 + 1e-6, 1e-12);
  Op gelu = norm;  // a class without curves: the averaged curve
  gelu.mem_class = MemClass::kActivation;
  EXPECT_NEAR(kernel_time_s(d, gelu), 2e6 / 80e9 + 1e-6, 1e-12);
}

// The block's ops carry their classes; loom's residual adds have no backward kernel (the
// norms' backward adds their gradient), Megatron's do.
TEST(MemoryClasses, BlockOpsCarryClassesAndLoomsResidualHasNoBackward) {
  ModelConfig m;
  apply_model_preset(m, "gpt2");
  LayerShape x = LayerShape::of(m, 1, 128, 1, 1, false, 4);
  const std::vector<Op> megatron = block_forward_ops(x);
  EXPECT_EQ(block_op(megatron, "norm1").mem_class, MemClass::kNorm);
  EXPECT_EQ(block_op(megatron, "gelu").mem_class, MemClass::kActivation);
  EXPECT_EQ(block_op(megatron, "residual2").mem_class, MemClass::kResidual);
  EXPECT_TRUE(block_op(megatron, "residual1").backward);
  x.fused_residual_grad = true;
  EXPECT_FALSE(block_op(block_forward_ops(x), "residual1").backward);
}

// loom calibrate writes the class curves; the spec reads them back, and a one-thread rank
// (dp 2 on two threads) takes the _1t curve.
TEST(MemoryClasses, ClassCurvesRoundTripAndOneThreadRanksTakeTheirs) {
  ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  c.device.shared = true, c.device.threads = 2;
  c.device.gemm_efficiency_1t = c.device.attention_efficiency_1t = c.device.memory_efficiency_1t = flat(0.5);
  c.devices_per_node = 64, c.nodes = 1;
  c.device.class_efficiency[int(MemClass::kActivation)] = flat(0.3);
  c.device.class_efficiency_1t[int(MemClass::kActivation)] = flat(0.4);
  c.device.class_backward[int(MemClass::kActivation)] = flat(1.6);
  const std::string text = cluster_to_toml(c);
  EXPECT_NE(text.find("activation_efficiency_1t = "), std::string::npos) << text;
  const ClusterSpec back = cluster_from_toml(text, "test", {});
  EXPECT_DOUBLE_EQ(back.device.class_efficiency[int(MemClass::kActivation)].at(1e6), 0.3);
  EXPECT_DOUBLE_EQ(back.device.class_backward[int(MemClass::kActivation)].at(1e6), 1.6);
  EXPECT_TRUE(back.device.class_efficiency[int(MemClass::kNorm)].points.empty());
  const std::string path = ::testing::TempDir() + "/classes.toml";
  {
    std::ofstream f(path);
    f << text;
  }
  const ClusterSpec two = load_cluster(path, {}, 2, "");
  EXPECT_DOUBLE_EQ(two.device.class_efficiency[int(MemClass::kActivation)].at(1e6), 0.4);
  std::remove(path.c_str());
}

// Note [Recompute] (model/model.cc): loom's engine reruns a fully recomputed block only up to
// the MLP activation, Megatron's the whole block. GPT-2 at tp 2 on one DGX A100 node, 8
// sequences of 1024: the recomputed FLOPs (hardware - model) differ by exactly fc2's forward,
// 2 s F h a sequence and layer; the recompute time by fc2's GEMM, its all-reduce and the
// residual add.
// PyTorch's non-reentrant checkpoint stops there too from torch 2.1 on: --framework fsdp with
// --recompute-early-stop recomputes what loom's engine does; Megatron and DeepSpeed refuse the flag.
TEST(Simulator, LoomsFullRecomputeStopsBeforeTheMlpOutputProjection) {
  SimResult res[3];
  const Framework frameworks[3] = {Framework::kMegatron, Framework::kLoom, Framework::kFsdp};
  const ClusterSpec c = load_cluster("dgx-a100", {}, 2, "");
  SimPlan p;
  p.cfg = load_config("", {"model.preset=gpt2", "parallel.tp=2", "parallel.recompute=full", "train.batch=8",
                           "train.grad_accum=1"});
  for (int k = 0; k < 3; k++) {
    p.framework = frameworks[k];
    p.recompute_early_stop = k == 2;
    res[k] = simulate(p, c);
  }
  EXPECT_DOUBLE_EQ(res[2].hardware_flops, res[1].hardware_flops);
  for (Framework f : {Framework::kMegatron, Framework::kDeepSpeed2021}) {
    p.framework = f;
    try {
      simulate(p, c);
      ADD_FAILURE() << framework_name(f);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--recompute-early-stop"), std::string::npos) << e.what();
    }
  }
  const double s = 1024, h = 768, F = 3072, layers = 12, batch = 8;
  const double megatron = res[0].hardware_flops - res[0].model_flops, loom = res[1].hardware_flops - res[1].model_flops;
  EXPECT_NEAR(megatron - loom, batch * layers * 2 * s * F * h, 1e-9 * megatron);
  EXPECT_LT(res[1].breakdown.recompute, res[0].breakdown.recompute);
  const LayerShape x = LayerShape::of(load_config("", {"model.preset=gpt2"}).model, 8, 1024, 2, 1, false, 2);
  const std::vector<Op> ops = block_forward_ops(x);
  EXPECT_EQ(full_recompute_ops(ops, false).size(), ops.size());
  const std::vector<Op> rerun = full_recompute_ops(ops, true);
  ASSERT_LT(rerun.size(), ops.size());
  EXPECT_EQ(ops[rerun.size()].name, "fc2");
  EXPECT_EQ(rerun.back().name, "gelu");
}

}  // namespace
}  // namespace loom::sim
