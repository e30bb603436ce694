// What the published-run reader takes from NVIDIA's performance tables (Note [NVIDIA recipes]),
// the metric a row is compared in (Note [Published metrics]), Megatron's block recompute where
// a row's recompute is unstated (Note [Unstated recompute]), a layout short of its GPUs (Note
// [A layout short of its GPUs]), and the fp8 inputs a layer saves
// (Note [fp8 saved inputs]), with the arithmetic shown.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/parallel/schedule.h"
#include "loom/sim/costs.h"
#include "loom/sim/memory_model.h"
#include "loom/sim/published.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

// A small Llama row on 8 GPUs of `gpu` (GQA 8 heads over 2 groups, SwiGLU width 2,816).
PublishedRun llama_row(const std::string& framework, const std::string& gpu = "H100-SXM5-80GB (DGX-H100)") {
  PublishedRun row;
  row.fields = {{"row_id", "7"}, {"gpu_type", gpu}, {"num_gpus", "8"}, {"num_layers", "4"},
                {"hidden_size", "1024"}, {"num_attention_heads", "8"}, {"num_query_groups", "2"},
                {"ffn_hidden", "2816"}, {"vocab_size", "32000"}, {"seq_length", "2048"},
                {"global_batch_size", "16"}, {"micro_batch_size", "1"}, {"tensor_parallel", "1"},
                {"pipeline_parallel", "1"}, {"data_parallel", "8"}, {"tflops_per_gpu", "300"},
                {"tokens_per_sec_per_gpu", "20000"}, {"model", "Llama 3 1B"}, {"framework", framework},
                {"precision", "fp8"}};
  return row;
}

// Note [Published metrics]: a Llama row is compared by its tokens/s (its source's TFLOP/s
// count is not Megatron's), by its step time where it states one; a GPT row keeps Megatron's
// TFLOP/s. A rate's step-time error is published / predicted - 1.
TEST(Published, LlamaRowsCompareByTokensPerSecond) {
  const PublishedRun row = llama_row("NeMo 24.07 (Megatron-Core)");
  const PublishedCheck c = check_published(row);
  EXPECT_EQ(c.metric, "tokens_per_sec_per_gpu");
  EXPECT_EQ(c.published, 20000);
  EXPECT_DOUBLE_EQ(c.predicted, c.result.tokens_per_s / 8);
  EXPECT_DOUBLE_EQ(c.result.tokens_per_s, 16 * 2048 / c.result.step_time_s);
  EXPECT_DOUBLE_EQ(c.step_time_error(), 20000 / c.predicted - 1);
  PublishedRun timed = row;
  timed.fields["iteration_time_s"] = "2.5";
  EXPECT_EQ(published_case(timed).metric, "iteration_time_s");
  PublishedRun gpt = row;
  gpt.fields["model"] = "GPT 1B", gpt.fields["num_query_groups"] = "", gpt.fields["ffn_hidden"] = "4096";
  EXPECT_EQ(published_case(gpt).metric, "tflops_per_gpu");
  PublishedRun rate_only = row;
  rate_only.fields["tokens_per_sec_per_gpu"] = "";
  EXPECT_EQ(published_case(rate_only).metric, "tflops_per_gpu");
}

// Note [A layout short of its GPUs]: a row scored per GPU whose tp x pp x dp x cp covers a
// whole fraction of its GPUs runs on the GPUs the layout covers, with the same per-GPU result
// as the consistent row, and says so; a layout over the GPUs, one that does not divide them, or
// a row scored by its step time is refused.
TEST(Published, ALayoutShortOfItsGpusRunsOnTheGpusItCovers) {
  const PublishedCheck whole = check_published(llama_row("NeMo 24.07 (Megatron-Core)"));
  PublishedRun row = llama_row("NeMo 24.07 (Megatron-Core)");
  row.fields["num_gpus"] = "32";  // dp 8 x tp 1 x pp 1 = a quarter of it
  const PublishedCheck quarter = check_published(row);
  EXPECT_EQ(quarter.plan.gpus(), 8);
  EXPECT_DOUBLE_EQ(quarter.predicted, whole.predicted);
  EXPECT_NE(quarter.assumed.find("tp x pp x dp x cp covers 8 of the 32 GPUs listed: simulated on 8"),
            std::string::npos)
      << quarter.assumed;
  EXPECT_EQ(whole.assumed.find("GPUs listed"), std::string::npos) << whole.assumed;
  row.fields["num_gpus"] = "12";  // 8 does not divide it
  EXPECT_THROW(check_published(row), loom::Error);
  row.fields["num_gpus"] = "4";  // the layout needs more than listed
  EXPECT_THROW(check_published(row), loom::Error);
  row.fields["num_gpus"] = "32", row.fields["iteration_time_s"] = "2.5";  // a step time is the job's
  EXPECT_THROW(check_published(row), loom::Error);
}

// A Nemotron row that leaves its vocabulary unstated runs Nemotron's 256,000-token tokenizer
// (and says so); any other, the padded GPT-2 vocabulary of 51,200; a stated one wins.
TEST(Published, UnstatedVocabularyIsTheModelFamilys) {
  PublishedRun row = llama_row("NeMo 24.07 (Megatron-Core)");
  row.fields["model"] = "Nemotron-8B", row.fields["vocab_size"] = "", row.fields["ffn_hidden"] = "4224";
  const PublishedCase n = published_case(row);
  EXPECT_EQ(n.plan.cfg.model.vocab, 256000);
  EXPECT_NE(n.assumed.find("vocabulary unstated: Nemotron's 256,000"), std::string::npos) << n.assumed;
  PublishedRun gpt = llama_row("NeMo 24.07 (Megatron-Core)");
  gpt.fields["model"] = "GPT3-20B", gpt.fields["vocab_size"] = "", gpt.fields["ffn_hidden"] = "4096";
  gpt.fields["num_query_groups"] = "";
  EXPECT_EQ(published_case(gpt).plan.cfg.model.vocab, 51200);
  row.fields["vocab_size"] = "32000";
  EXPECT_EQ(published_case(row).plan.cfg.model.vocab, 32000);
}

// Note [NVIDIA recipes]: NeMo's and Megatron-Bridge's performance rows run the distributed
// optimizer with the reduce and the gather overlapped, and sp with overlapped tp
// communication at tp > 1 (not for NVFP4); Megatron-FSDP is ZeRO-3; a stated value wins.
TEST(Published, NvidiaRecipeRowsTakeTheRecipesSettings) {
  PublishedRun row = llama_row("NeMo 24.07 (Megatron-Core)");
  row.fields["tensor_parallel"] = "2", row.fields["data_parallel"] = "4";
  const PublishedCase c = published_case(row);
  EXPECT_EQ(c.plan.cfg.parallel.zero, 1);
  EXPECT_TRUE(c.plan.cfg.parallel.sp);
  EXPECT_TRUE(c.plan.dp_overlap && c.plan.param_gather_overlap && c.plan.tp_overlap);
  EXPECT_NE(c.assumed.find("NVIDIA recipe: distributed optimizer (ZeRO-1), overlapped"), std::string::npos)
      << c.assumed;
  EXPECT_NE(c.assumed.find("tp communication overlapped"), std::string::npos) << c.assumed;

  PublishedRun bridge = llama_row("Megatron-Bridge / NeMo 26.04.01", "B200 (DGX-B200)");
  bridge.fields["tensor_parallel"] = "2", bridge.fields["data_parallel"] = "4";
  bridge.fields["zero_or_sharding"] = "DDP (distributed optimizer setting not stated)";
  bridge.fields["precision"] = "nvfp4";
  const PublishedCase b = published_case(bridge);
  EXPECT_EQ(b.plan.cfg.parallel.zero, 1);
  EXPECT_TRUE(b.plan.cfg.parallel.sp);
  EXPECT_FALSE(b.plan.tp_overlap);  // Megatron-Bridge's NVFP4 recipes turn it off

  PublishedRun fsdp = bridge;
  fsdp.fields["zero_or_sharding"] = "Megatron-FSDP (sharding group 8)", fsdp.fields["precision"] = "fp8";
  const PublishedCase f = published_case(fsdp);
  EXPECT_EQ(f.plan.cfg.parallel.zero, 3);
  EXPECT_EQ(f.plan.framework, Framework::kFsdp);

  PublishedRun stated = row;
  stated.fields["zero_or_sharding"] = "none", stated.fields["sequence_parallel"] = "no";
  const PublishedCase s = published_case(stated);
  EXPECT_EQ(s.plan.cfg.parallel.zero, 0);
  EXPECT_FALSE(s.plan.cfg.parallel.sp || s.plan.dp_overlap || s.plan.param_gather_overlap);
  // A stack that is not NVIDIA's infers none of it.
  const PublishedCase other = published_case(llama_row("somebody's trainer"));
  EXPECT_EQ(other.plan.cfg.parallel.zero, 0);
  EXPECT_FALSE(other.plan.dp_overlap || other.plan.tp_overlap);
}

// Note [NVIDIA recipes]: NeMo 1.x ran Llama 2 7B with the launcher's llama2_7b.yaml, which
// sets neither sequence parallelism nor the userbuffer tp overlap; other models and NeMo 2's
// recipes keep both, and a row that states sp keeps it.
TEST(Published, NemoOneLlama2SevenBRowsRunTheirConfigsPlainTensorParallelism) {
  PublishedRun row = llama_row("NeMo 24.03.01 (Megatron-Core)");
  row.fields["model"] = "LLAMA2-7B", row.fields["tensor_parallel"] = "2", row.fields["data_parallel"] = "4";
  const PublishedCase c = published_case(row);
  EXPECT_FALSE(c.plan.cfg.parallel.sp || c.plan.tp_overlap);
  EXPECT_TRUE(c.plan.dp_overlap && c.plan.param_gather_overlap);  // the config's distributed_fused_adam
  EXPECT_NE(c.assumed.find("llama2_7b config: no sequence parallelism, no tp overlap"), std::string::npos)
      << c.assumed;
  EXPECT_EQ(c.assumed.find("sequence parallel;"), std::string::npos) << c.assumed;
  PublishedRun spelled = row;
  spelled.fields["model"] = "Llama 2 7B";
  EXPECT_FALSE(published_case(spelled).plan.tp_overlap);
  PublishedRun stated = row;
  stated.fields["sequence_parallel"] = "yes";
  const PublishedCase s = published_case(stated);
  EXPECT_TRUE(s.plan.cfg.parallel.sp);
  EXPECT_FALSE(s.plan.tp_overlap);
  PublishedRun llama3 = row;
  llama3.fields["model"] = "LLAMA3-8B";
  const PublishedCase l = published_case(llama3);
  EXPECT_TRUE(l.plan.cfg.parallel.sp && l.plan.tp_overlap);
  PublishedRun nemo2 = row;
  nemo2.fields["framework"] = "NeMo 25.04.rc2 (Megatron-Core)";
  EXPECT_TRUE(published_case(nemo2).plan.tp_overlap);
}

// Note [Unstated recompute]: a Megatron row that fits neither without recompute nor with
// selective takes the least N whose block recompute (the first N layers of every virtual
// stage whole) fits; N - 1 does not fit. Another stack's row goes to full recompute.
TEST(Published, MegatronRowsTakeTheLeastBlockRecomputeThatFits) {
  PublishedRun row = llama_row("NeMo 24.07 (Megatron-Core)");
  for (auto [k, v] : {std::pair{"num_layers", "16"}, {"hidden_size", "8192"}, {"num_attention_heads", "64"},
                      {"num_query_groups", "8"}, {"ffn_hidden", "28672"}, {"seq_length", "8192"},
                      {"micro_batch_size", "2"}, {"global_batch_size", "32"}, {"pipeline_parallel", "2"},
                      {"data_parallel", "4"}})
    row.fields[k] = v;
  PublishedCase c = published_case(row);
  ASSERT_NE(c.assumed.find("full on the first"), std::string::npos) << c.assumed;
  const std::vector<int> stages = parallel::stage_layers(16, 2);
  auto blocks = [&](int k) {
    std::vector<Recompute> out;
    for (int count : stages)
      for (int i = 0; i < count; ++i) out.push_back(i < k ? Recompute::kFull : Recompute::kNone);
    return out;
  };
  const std::vector<Recompute> r = c.plan.cfg.parallel.recompute_layers(16);
  int n = 0;
  while (r[size_t(n)] == Recompute::kFull) ++n;
  ASSERT_GT(n, 0);
  ASSERT_LT(n, stages[0]);
  EXPECT_EQ(r, blocks(n));
  const double device = c.cluster.device.memory_bytes;
  EXPECT_LE(simulate(c.plan, c.cluster).peak_memory_bytes, device);
  c.plan.cfg.parallel.recompute = blocks(n - 1);
  EXPECT_GT(simulate(c.plan, c.cluster).peak_memory_bytes, device);
  PublishedRun other = row;
  other.fields["framework"] = "somebody's trainer", other.fields["zero_or_sharding"] = "ZeRO-2";
  const PublishedCase o = published_case(other);
  EXPECT_NE(o.assumed.find("recompute unstated: full ("), std::string::npos) << o.assumed;
}

// Note [fp8 saved inputs]: in fp8 the QKV, projection, MLP and fc2 inputs are kept in one
// byte: a GPT layer of n = 2048 rows, h = 1024, f = 4096 keeps n (2h (2 - 1) + h (2 - 1) +
// f (2 - 1)) = n (3h + f) bytes less; NVFP4 keeps 0.5625 a value; full recompute keeps the
// bf16 layer input either way.
TEST(Fp8, ALayerKeepsItsLinearInputsInFp8) {
  const ModelConfig m = load_config("", {"model.preset=gpt2", "model.d_model=1024", "model.heads=16",
                                         "model.ffn=4096", "model.ctx=2048"}).model;
  LayerShape x = LayerShape::of(m, 1, 2048, 1, 1, false, 2);
  const double bf16 = layer_activation_bytes(x, Recompute::kNone), full = layer_activation_bytes(x, Recompute::kFull);
  x.gemm_format = GemmFormat::kFp8;
  const double n = 2048, h = 1024, f = 4096;
  EXPECT_DOUBLE_EQ(bf16 - layer_activation_bytes(x, Recompute::kNone), n * (3 * h + f));
  EXPECT_DOUBLE_EQ(layer_activation_bytes(x, Recompute::kFull), full);
  x.gemm_format = GemmFormat::kNvfp4;
  EXPECT_DOUBLE_EQ(bf16 - layer_activation_bytes(x, Recompute::kNone), n * (3 * h + f) * (2 - 0.5625));
  // At tp 2 the projection and fc2 inputs split, the QKV and MLP inputs do not (no sp).
  LayerShape t = LayerShape::of(m, 1, 2048, 2, 1, false, 2);
  const double t16 = layer_activation_bytes(t, Recompute::kNone);
  t.gemm_format = GemmFormat::kFp8;
  EXPECT_DOUBLE_EQ(t16 - layer_activation_bytes(t, Recompute::kNone), n * 2 * h + n * (h + f) / 2);
}

}  // namespace
}  // namespace loom::sim
