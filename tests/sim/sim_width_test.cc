// A linear layer's GEMM priced by its narrower feature count and FLOPs (Note [GEMM width] in
// sim/costs.cc), with the arithmetic shown.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/costs.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

Op named(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& o : ops)
    if (o.name == name) return o;
  ADD_FAILURE() << "no op " << name;
  return {};
}

// Widths 128 and 512, each read at 1e6 and 1e8 FLOPs.
WidthCurves two_widths() {
  WidthCurves w;
  w.by_width = {{128, Curve{{{1e6, 0.5}, {1e8, 0.8}}}}, {512, Curve{{{1e6, 0.6}, {1e8, 1.0}}}}};
  return w;
}

// Log-linear in both: width 256 is halfway (in log) from 128 to 512, 1e7 FLOPs halfway from
// 1e6 to 1e8, so width 128 reads 0.65 there, width 512 reads 0.8, and 256 reads 0.725.
// Outside the widths the nearest width's curve holds.
TEST(GemmWidth, InterpolatesInLogWidthAndLogFlops) {
  const WidthCurves w = two_widths();
  EXPECT_NEAR(w.at(128, 1e7), 0.65, 1e-12);
  EXPECT_NEAR(w.at(512, 1e7), 0.8, 1e-12);
  EXPECT_NEAR(w.at(256, 1e7), 0.725, 1e-12);
  EXPECT_NEAR(w.at(64, 1e8), 0.8, 1e-12);
  EXPECT_NEAR(w.at(4096, 1e5), 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(WidthCurves{}.at(256, 1e7), 1.0);
}

// A device at 1 TFLOP/s whose FLOPs curve reads 1.0 and whose width table is two_widths():
// a width-256 GEMM of 1e7 FLOPs costs 1e7 / (1e12 x 0.725) = 13.79 us (+ 2 us overhead);
// a GEMM without a width (attention's batched ones) keeps 1e7 / 1e12 + 2 us.
TEST(GemmWidth, ALinearLayersGemmIsPricedByItsWidth) {
  DeviceSpec d;
  d.peak_flops = 1e12, d.memory_bw = 1e12, d.kernel_overhead_s = 2e-6;
  d.gemm_efficiency = Curve{{{1e3, 1.0}, {1e12, 1.0}}};
  d.gemm_width_efficiency = two_widths();
  EXPECT_NEAR(gemm_time_s(d, 1e7, 0, 256), 1e7 / (1e12 * 0.725) + 2e-6, 1e-15);
  EXPECT_NEAR(gemm_time_s(d, 1e7, 0, 0), 1e7 / 1e12 + 2e-6, 1e-15);
  d.gemm_width_efficiency = {};
  EXPECT_NEAR(gemm_time_s(d, 1e7, 0, 256), 1e7 / 1e12 + 2e-6, 1e-15);
}

// The block's linear layers carry min(in, out): GPT-2 (h 768, ffn 3072) at tp 2 has qkv
// 768 -> 1152, proj 384 -> 768, fc1 768 -> 1536, fc2 1536 -> 768; the head 768 -> 50257.
// The attention kernels are batched GEMMs and carry none.
TEST(GemmWidth, LinearLayersCarryTheirNarrowerFeatureCount) {
  ModelConfig m;
  apply_model_preset(m, "gpt2");
  LayerShape x = LayerShape::of(m, 1, 128, 2, 1, false, 4);
  const std::vector<Op> ops = block_forward_ops(x);
  EXPECT_DOUBLE_EQ(named(ops, "qkv").width, 768);
  EXPECT_DOUBLE_EQ(named(ops, "proj").width, 384);
  EXPECT_DOUBLE_EQ(named(ops, "fc1").width, 768);
  EXPECT_DOUBLE_EQ(named(ops, "fc2").width, 768);
  EXPECT_DOUBLE_EQ(named(ops, "scores").width, 0);
  EXPECT_DOUBLE_EQ(named(head_forward_ops(LayerShape::of(m, 1, 128, 1, 1, false, 4)), "logits").width, 768);
  x.fused_attention = true;
  EXPECT_DOUBLE_EQ(named(block_forward_ops(x), "attention").width, 0);
}

// The table round-trips through the spec's TOML (flat [width, flops, value] triples), a
// one-thread rank takes the _1t table, and malformed tables are refused by name.
TEST(GemmWidth, TableRoundTripsAndBadTablesAreRefused) {
  ClusterSpec c = load_cluster("dgx-a100", {}, 8, "");
  c.device.gemm_width_efficiency = two_widths();
  const ClusterSpec back = cluster_from_toml(cluster_to_toml(c), "test", {});
  ASSERT_EQ(back.device.gemm_width_efficiency.by_width.size(), 2u);
  EXPECT_NEAR(back.device.gemm_width_efficiency.at(256, 1e7), 0.725, 1e-9);

  c.device.shared = true, c.device.threads = 2, c.devices_per_node = 64, c.nodes = 1;
  const Curve flat{{{1e3, 0.5}, {1e9, 0.5}}};
  c.device.gemm_efficiency_1t = c.device.attention_efficiency_1t = c.device.memory_efficiency_1t = flat;
  c.device.gemm_width_efficiency_1t.by_width = {{256, Curve{{{1e6, 1.5}, {1e8, 1.5}}}}};
  const std::string text = cluster_to_toml(c);
  EXPECT_NE(text.find("gemm_width_efficiency_1t = [[256, 1000000, 1.5]"), std::string::npos) << text;
  const std::string path = ::testing::TempDir() + "/width.toml";
  {
    std::ofstream f(path);
    f << text;
  }
  EXPECT_NEAR(load_cluster(path, {}, 1, "").device.gemm_width_efficiency.at(256, 1e7), 0.725, 1e-9);
  EXPECT_NEAR(load_cluster(path, {}, 2, "").device.gemm_width_efficiency.at(256, 1e7), 1.5, 1e-9);  // one thread a rank
  std::remove(path.c_str());

  const std::string head = "name = \"x\"\n[device]\nname = \"d\"\npeak_tflops = 1\nmemory_gib = 1\nmemory_gbps = 1\n"
                           "gemm_efficiency = [[1e6, 1.0]]\nmemory_efficiency = [[1e6, 1.0]]\n";
  auto refused = [&](const std::string& table, const std::string& piece) {
    try {
      cluster_from_toml(head + "gemm_width_efficiency = " + table + "\n", "bad.toml", {});
      ADD_FAILURE() << table << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
  };
  refused("[[256, 1e6]]", "[width, flops, value] triples");
  refused("[[512, 1e6, 0.5], [256, 1e6, 0.5]]", "widths must increase");
  refused("[[256, 1e7, 0.5], [256, 1e6, 0.5]]", "FLOPs must increase within width 256");
  refused("[[256, 1e6, 1.5]]", "0 < value <= 1");
}

}  // namespace
}  // namespace loom::sim
