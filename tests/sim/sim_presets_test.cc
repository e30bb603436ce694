// The Blackwell and V100 presets (issue 57 item 2): each loads, the NVL72 racks keep a
// 72-GPU NVLink domain (a tp 16 group stays on NVLink, where a DGX B200 pair of nodes puts
// it across InfiniBand), and the published rows reach them by gpu_type.
#include <gtest/gtest.h>

#include "loom/comm/cost.h"
#include "loom/core/error.h"
#include "loom/sim/cluster.h"
#include "loom/sim/costs.h"
#include "loom/sim/published.h"

namespace loom::sim {
namespace {

TEST(ClusterPresets, BlackwellAndV100LoadWithTheirDatasheetFigures) {
  struct Want {
    const char* preset;
    double peak_tflops, memory_gbps;
    int64_t per_node;
  };
  for (const Want& w : {Want{"dgx-b200", 2250, 8000, 8}, Want{"gb200-nvl72", 2500, 8000, 72},
                        Want{"gb300-nvl72", 2500, 8000, 72}, Want{"dgx-v100", 125, 900, 16}}) {
    const ClusterSpec c = load_cluster(w.preset, {}, 0, "");
    EXPECT_DOUBLE_EQ(c.device.peak_flops, w.peak_tflops * 1e12) << w.preset;
    EXPECT_DOUBLE_EQ(c.device.memory_bw, w.memory_gbps * 1e9) << w.preset;
    EXPECT_EQ(c.devices_per_node, w.per_node) << w.preset;
  }
  EXPECT_GT(load_cluster("gb300-nvl72", {}, 0, "").device.memory_bytes,
            load_cluster("gb200-nvl72", {}, 0, "").device.memory_bytes);
}

// Note [Partial racks]: a job takes whole 4-GPU trays of NVL72 racks, spread evenly over the
// fewest racks that can hold it (256 GPUs: 4 racks of 64, so a tp 16 group still fits a
// rack's NVLink); whole racks stay whole; sizes no even tray split holds are refused naming
// the sizes around them, and whole-node
// presets keep their rule. tray_devices survives the written spec.
TEST(ClusterPresets, AJobTakesWholeTraysOfNvl72Racks) {
  for (const char* preset : {"gb200-nvl72", "gb300-nvl72"}) {
    const ClusterSpec c = load_cluster(preset, {}, 256, "");
    EXPECT_EQ(c.nodes, 4) << preset;
    EXPECT_EQ(c.devices_per_node, 64) << preset;
    EXPECT_EQ(c.tray_devices, 4) << preset;
  }
  const ClusterSpec whole = load_cluster("gb200-nvl72", {}, 144, "");
  EXPECT_EQ(whole.nodes, 2);
  EXPECT_EQ(whole.devices_per_node, 72);
  const ClusterSpec two = load_cluster("gb200-nvl72", {}, 104, "");  // 2 racks of 52 (13 trays)
  EXPECT_EQ(two.nodes, 2);
  EXPECT_EQ(two.devices_per_node, 52);
  try {
    load_cluster("gb200-nvl72", {}, 100, "");  // 2 racks of 50: not whole trays
    ADD_FAILURE() << "100 GPUs do not spread over 2 racks in whole trays";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("whole trays of 4 devices"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use 96 or 104"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_cluster("dgx-b200", {}, 12, ""), ConfigError);
  EXPECT_THROW(load_cluster("gb200-nvl72", {"cluster.tray_devices=5"}, 0, ""), ConfigError);  // 72 is not whole trays of 5
  const ClusterSpec back = cluster_from_toml(cluster_to_toml(load_cluster("gb300-nvl72", {}, 0, "")), "round trip");
  EXPECT_EQ(back.tray_devices, 4);
  const ClusterSpec six = load_cluster("gb300-nvl72", {}, 6, "");  // part of one rack, as on any preset
  EXPECT_EQ(six.devices_per_node, 6);
  EXPECT_EQ(cluster_from_toml(cluster_to_toml(six), "round trip").devices_per_node, 6);
}

// A tp 16 all-reduce of 256 MiB: in an NVL72 rack one node of 16 on NVLink 5 (900 GB/s x
// 0.75 per direction), on DGX B200 nodes two nodes of 8 whose traffic between them shares
// the node's eight 400 Gb/s NICs (8 x 50 GB/s x 0.9 = 360 GB/s against NVLink's 675) - the
// NVLink domain is the tier that keeps it fast.
TEST(ClusterPresets, ATp16GroupStaysOnNvlinkInAnNvl72Rack) {
  const ClusterSpec rack = load_cluster("gb200-nvl72", {}, 72, ""), dgx = load_cluster("dgx-b200", {}, 16, "");
  const comm::GroupShape in_rack = comm::place_group(rack.devices_per_node, 16, 1);
  const comm::GroupShape across = comm::place_group(dgx.devices_per_node, 16, 1);
  EXPECT_EQ(in_rack.nodes, 1);
  EXPECT_EQ(in_rack.per_node, 16);
  EXPECT_EQ(across.nodes, 2);
  const double bytes = 256.0 * (1 << 20);
  const double t_rack = collective_time_s(rack, OpKind::kAllReduce, bytes, in_rack);
  const double t_dgx = collective_time_s(dgx, OpKind::kAllReduce, bytes, across);
  // Bandwidth terms alone: 2 (n-1)/n x bytes over the slowest link's rate.
  const double bus = 2.0 * 15 / 16 * bytes;
  EXPECT_GT(t_rack, bus / (900e9 * 0.75));
  EXPECT_LT(t_rack, 1.2 * bus / (900e9 * 0.75));
  EXPECT_GT(t_dgx, 1.5 * t_rack);
}

TEST(ClusterPresets, PublishedRowsReachThePresetOfTheirGpu) {
  EXPECT_EQ(gpu_preset("B200 (DGX-B200)"), "dgx-b200");
  EXPECT_EQ(gpu_preset("GB200 (NVL72)"), "gb200-nvl72");
  EXPECT_EQ(gpu_preset("GB300 (NVL72)"), "gb300-nvl72");
  EXPECT_EQ(gpu_preset("V100-SXM3-32GB"), "dgx-v100");
  EXPECT_EQ(gpu_preset("H100-SXM5-80GB (DGX-H100)"), "dgx-h100");
  EXPECT_EQ(gpu_preset("MI300X"), "");
  // A bf16 row on B200 simulates on the preset; its fp8 twin at the B200's fp8 rate, faster.
  PublishedRun row;
  row.fields = {{"row_id", "1"}, {"gpu_type", "B200 (DGX-B200)"}, {"num_gpus", "8"}, {"num_layers", "4"},
                {"hidden_size", "1024"}, {"num_attention_heads", "8"}, {"ffn_hidden", "4096"},
                {"vocab_size", "50368"}, {"seq_length", "2048"}, {"global_batch_size", "16"},
                {"micro_batch_size", "2"}, {"tensor_parallel", "1"}, {"pipeline_parallel", "1"},
                {"data_parallel", "8"}, {"tflops_per_gpu", "600"}, {"model", "GPT 1B"},
                {"framework", "NeMo 25.04.rc2 (Megatron-Core)"}, {"precision", "bf16"}};
  const PublishedCase c = published_case(row);
  EXPECT_EQ(c.cluster.device.name, "B200");
  EXPECT_GT(check_published(row).predicted, 0);
  const double bf16 = check_published(row).predicted;  // TFLOP/s a GPU
  row.fields["precision"] = "fp8";
  EXPECT_EQ(published_case(row).plan.gemm_format, GemmFormat::kFp8);
  EXPECT_GT(check_published(row).predicted, bf16);
}

}  // namespace
}  // namespace loom::sim
