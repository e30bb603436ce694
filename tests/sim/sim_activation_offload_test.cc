// Note [Activation offload] (sim/offload_cost.cc): Megatron-core's CPU offloading of the first
// N layers' activations, priced on a GB200 rack (NVLink-C2C at 450 GB/s each way), and the
// published Grace-Blackwell rows that offload instead of recomputing (Note [NVIDIA recipes]).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/published.h"
#include "loom/sim/simulator.h"
#include "support/error_message.h"

namespace loom::sim {
namespace {

// Llama 3 8B, 8 GPUs of a GB200 rack, FSDP (ZeRO-3), 2 micro-batches of 8,192 tokens.
SimPlan llama_plan(int64_t offload, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"model.preset=llama3-8b", "model.ctx=8192", "train.batch=16", "train.grad_accum=2",
                                   "parallel.dp=8", "parallel.zero=3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  SimPlan p;
  p.framework = Framework::kFsdp;
  p.attention = Attention::kFlash3;
  p.cfg = load_config("", sets);
  p.activation_offload_layers = offload;
  return p;
}

// Offloading N layers leaves N - 1 layers' activations off the device (one stays in transit):
// the saving grows by one layer's activations per layer offloaded. Over NVLink-C2C a layer's
// copy hides under its passes, so the step is unchanged; over a link 1,000 times slower the
// copies outlast them, and the step grows by at most the copies' time and at least that less
// the offloaded layers' compute.
TEST(ActivationOffload, FreesALayerPerLayerAndCostsOnlyWhatTheLinkCannotHide) {
  const ClusterSpec c = load_cluster("gb200-nvl72", {}, 8, "");
  const SimResult none = simulate(llama_plan(0), c), one = simulate(llama_plan(2), c), ten = simulate(llama_plan(10), c);
  const double layer = none.ranks[0].memory.activations - one.ranks[0].memory.activations;
  ASSERT_GT(layer, 0);
  EXPECT_NEAR(none.ranks[0].memory.activations - ten.ranks[0].memory.activations, 9 * layer, 1e-6 * layer);
  EXPECT_DOUBLE_EQ(ten.step_time_s, none.step_time_s);
  const ClusterSpec slow = load_cluster("gb200-nvl72", {"cluster.device.host_gbps=0.45"}, 8, "");
  const SimResult fast_10 = simulate(llama_plan(10), slow), base = simulate(llama_plan(0), slow);
  const double copies = 2 /* micro-batches */ * 10 * 2 /* out and back */ * layer / 0.45e9;
  const double grew = fast_10.step_time_s - base.step_time_s, layers_compute = 10.0 / 32 * base.breakdown.compute;
  EXPECT_LE(grew, copies * (1 + 1e-9));
  EXPECT_GE(grew, copies - layers_compute);
}

// Refused where Megatron-core refuses it (pipeline parallelism, recompute, every layer) and
// where it cannot be priced (loom's engine, a cluster without a host link); `loom plan` does not
// search it.
TEST(ActivationOffload, RefusedWhereMegatronOrTheClusterCannotRunIt) {
  const ClusterSpec c = load_cluster("gb200-nvl72", {}, 8, "");
  auto error = [&](const SimPlan& p, const ClusterSpec& on) {
    return testing_support::error_message([&] { simulate(p, on); });
  };
  EXPECT_NE(error(llama_plan(4, {"parallel.pp=2", "parallel.dp=4"}), c).find("without pipeline parallelism"),
            std::string::npos);
  EXPECT_NE(error(llama_plan(4, {"parallel.recompute=full"}), c).find("in place of recomputing"), std::string::npos);
  EXPECT_NE(error(llama_plan(32), c).find("expected 0 to model.layers - 1 (31"), std::string::npos);
  SimPlan loom = llama_plan(4);
  loom.framework = Framework::kLoom, loom.attention = Attention::kUnfused;
  EXPECT_NE(error(loom, c).find("loom's engine does not offload activations"), std::string::npos);
  EXPECT_NE(error(llama_plan(4), load_cluster("dgx-h100", {}, 8, "")).find("states no host link"), std::string::npos);
}

// Note [NVIDIA recipes]: Megatron-Bridge's Llama 3 70B on 64 GB200s under Megatron-FSDP (row
// 101) fits neither without recompute nor by recompute alone cheaply; its recipe offloads, so
// the row is priced with no recompute and the least offloaded layers that fit (40, as the 25.11
// recipe the row ran), and one layer fewer does not fit.
TEST(ActivationOffload, GraceBlackwellRecipeRowsOffloadBeforeRecomputing) {
  PublishedRun row;
  row.fields = {{"row_id", "101"}, {"source_id", "S08"}, {"gpu_type", "GB200 (NVL72)"}, {"num_gpus", "64"},
                {"model", "LLAMA3_70B"}, {"num_layers", "80"}, {"hidden_size", "8192"}, {"num_attention_heads", "64"},
                {"num_query_groups", "8"}, {"ffn_hidden", "28672"}, {"seq_length", "8192"}, {"vocab_size", "128256"},
                {"global_batch_size", "256"}, {"micro_batch_size", "2"}, {"tensor_parallel", "1"},
                {"pipeline_parallel", "1"}, {"data_parallel", "64"}, {"context_parallel", "1"},
                {"zero_or_sharding", "Megatron-FSDP (sharding group 64)"}, {"precision", "fp8 (current scaling)"},
                {"framework", "Megatron-Bridge / NeMo 25.11"}, {"tokens_per_sec_per_gpu", "4312"}};
  PublishedCase c = published_case(row);
  EXPECT_NE(c.assumed.find("the first 40 layers' activations offloaded"), std::string::npos) << c.assumed;
  EXPECT_EQ(c.plan.activation_offload_layers, 40);
  EXPECT_EQ(c.plan.cfg.parallel.recompute_layers(80), std::vector<Recompute>(80, Recompute::kNone));
  EXPECT_LE(simulate(c.plan, c.cluster).peak_memory_bytes, c.cluster.device.memory_bytes);
  c.plan.activation_offload_layers = 39;
  EXPECT_GT(simulate(c.plan, c.cluster).peak_memory_bytes, c.cluster.device.memory_bytes);
}

}  // namespace
}  // namespace loom::sim
