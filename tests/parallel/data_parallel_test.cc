// Data parallel and ZeRO-1/2 against the single-process run (threads backend).
#include <gtest/gtest.h>

#include <iostream>

#include <filesystem>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/parallel/grad_sync.h"
#include "loom/parallel/pipeline.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/train/verify.h"
#include "support/train_threads.h"

namespace loom {
namespace {

Config gpt_config(std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=256",
                                   "model.ctx=32",   "train.batch=12",   "train.steps=20", "train.val_batches=1",
                                   "train.val_every=0", "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

Config llama_config() {
  return gpt_config({"model.preset=llama", "model.layers=2", "model.d_model=64", "model.heads=4", "model.kv_heads=2",
                     "model.ffn=96", "model.ctx=32"});
}

TEST(DataParallelPlan, BucketsSplitEvenlyAndOwnedPiecesTileTheBuffer) {
  const Config c = gpt_config();
  for (int dp : {1, 2, 3, 4}) {
    parallel::BucketCaps caps;
    caps.first_cap_bytes = 8 << 10, caps.cap_bytes = 64 << 10;  // several buckets for this small model
    const parallel::DataParallelPlan plan = parallel::plan_data_parallel(c.model, dp, caps, true);
    const ParamLayout layout(c.model, plan.padding);
    ASSERT_GT(plan.buckets.size(), 2u) << dp;
    // Buckets tile [0, total) in reverse order, each a multiple of dp x 16 floats.
    int64_t end = layout.total_floats();
    for (const parallel::Bucket& b : plan.buckets) {
      EXPECT_EQ(b.offset + b.count, end) << "dp " << dp;
      EXPECT_EQ(b.count % (dp * ParamLayout::kAlignFloats), 0) << "dp " << dp;
      EXPECT_EQ(layout.specs()[b.first_tensor].offset, b.offset);
      end = b.offset;
    }
    EXPECT_EQ(end, 0);
    // Every float is owned by exactly one rank.
    std::vector<int> owners(size_t(layout.total_floats()), 0);
    for (int r = 0; r < dp; r++)
      for (const FlatRange& p : plan.owned(r))
        for (int64_t i = p.offset; i < p.offset + p.count; i++) owners[size_t(i)]++;
    EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; })) << "dp " << dp;
    // Same tensors, same sizes, as the unpadded layout.
    const ParamLayout base(c.model);
    ASSERT_EQ(base.specs().size(), layout.specs().size());
    for (size_t i = 0; i < base.specs().size(); i++) EXPECT_EQ(base.specs()[i].numel, layout.specs()[i].numel);
  }
}

TEST(DataParallelPlan, TiedEmbeddingGetsTheFirstBucketAlone) {
  const Config c = gpt_config();
  const parallel::DataParallelPlan plan = parallel::plan_data_parallel(c.model, 2, {}, false, {}, parallel::WteBucket::kTiedFirst);
  const ParamLayout layout(c.model, plan.padding);
  ASSERT_TRUE(plan.tied_first);
  ASSERT_GE(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].first_tensor, 0);
  EXPECT_EQ(plan.buckets[0].last_tensor, 0);
  EXPECT_EQ(plan.buckets[0].offset, 0);
  EXPECT_EQ(plan.buckets[0].count, layout.specs()[1].offset);  // wte and its padding
  // The rest still tile the buffer, last tensor first.
  EXPECT_EQ(plan.buckets[1].offset + plan.buckets[1].count, layout.total_floats());
  EXPECT_EQ(plan.buckets.back().first_tensor, 1);
}

// Note [Unreduced gradients]: wte 100 (tied: the head writes it first), blocks 1 (h.1: 30, 40)
// and 0 (h.0: 10, 20), normf 5; a bucket a tensor, launched last tensor first. With two
// reductions running at most, the peak is at block 0's hook: everything written (205) less
// the first bucket retired (5) = 200.
TEST(DataParallelPlan, UnreducedGradientsPeakWhenTwoReductionsStillRun) {
  ASSERT_EQ(parallel::GradSync::kShardsInFlight, 2u);
  std::vector<ParamSpec> specs;
  for (auto [name, layer, numel] : std::vector<std::tuple<const char*, int, int64_t>>{
           {"wte", -1, 100}, {"h.0.a", 0, 10}, {"h.0.b", 0, 20}, {"h.1.a", 1, 30}, {"h.1.b", 1, 40}, {"normf.w", -1, 5}}) {
    ParamSpec x;
    x.name = name, x.layer = layer, x.numel = numel, x.offset = specs.empty() ? 0 : specs.back().offset + specs.back().numel;
    specs.push_back(x);
  }
  parallel::DataParallelPlan plan;
  for (int t = 5; t >= 0; --t) plan.buckets.push_back({specs[size_t(t)].offset, specs[size_t(t)].numel, t, t});
  EXPECT_EQ(parallel::unreduced_peak_floats(plan, specs, true), 200);
  // Untied (a head of its own): wte is written only by the embedding, last: the peak is at the
  // last hook, 205 less the three buckets retired by then (5, 40, 30).
  EXPECT_EQ(parallel::unreduced_peak_floats(plan, specs, false), 130);
}

struct Case {
  const char* name;
  std::vector<std::string> sets;
};

void expect_matches(const Config& base, const std::vector<Case>& cases) {
  std::vector<std::vector<std::string>> layouts;
  for (const Case& c : cases) layouts.push_back(c.sets);
  const std::vector<VerifyRow> rows = verify_layouts(base, layouts);
  ASSERT_EQ(rows.size(), cases.size());
  for (size_t i = 0; i < rows.size(); i++) {
    std::cout << cases[i].name << ": loss rel " << rows[i].max_loss_rel << ", weight " << rows[i].max_weight_abs << "\n";
    EXPECT_TRUE(rows[i].ok) << cases[i].name << ": " << rows[i].error << " loss rel " << rows[i].max_loss_rel
                            << ", weight " << rows[i].max_weight_abs;
    EXPECT_TRUE(rows[i].error.empty()) << cases[i].name << ": " << rows[i].error;
  }
}

TEST(DataParallel, GptLayoutsMatchTheSingleProcessRun) {
  expect_matches(gpt_config(), {{"dp2", {"parallel.dp=2"}},
                                {"dp3", {"parallel.dp=3"}},
                                {"dp4", {"parallel.dp=4"}},
                                {"dp2 accum2", {"parallel.dp=2", "train.grad_accum=2"}},
                                {"dp2 small buckets", {"parallel.dp=2", "parallel.bucket_mb=0.01"}},
                                {"dp2 recompute full", {"parallel.dp=2", "parallel.recompute=full"}}});
}

TEST(DataParallel, ZeroStagesMatchTheSingleProcessRun) {
  expect_matches(gpt_config(), {{"zero1 dp2", {"parallel.dp=2", "parallel.zero=1"}},
                                {"zero2 dp2", {"parallel.dp=2", "parallel.zero=2", "parallel.bucket_mb=0.02"}},
                                {"zero1 dp4", {"parallel.dp=4", "parallel.zero=1"}},
                                {"zero2 dp4", {"parallel.dp=4", "parallel.zero=2"}},
                                {"zero2 dp3 accum2", {"parallel.dp=3", "parallel.zero=2", "train.grad_accum=2"}}});
}

// Note [bf16 optimizer moments]: the rounding bits follow the flat offset. dp and the ZeRO
// stages (the whole layout's offsets) draw the single process's bits, so they differ only
// where a reduction's last bits flip a rounding; a tp slice or a pipeline part draws other
// bits. All stay within bf16 training's bounds (Note [Verify tolerances]); observed after 20
// steps: weights 1.6-1.9e-5 apart for dp / ZeRO, 1.1e-4 for tp 2, 8.8e-5 for pp 2.
TEST(DataParallel, Bf16MomentLayoutsMatchTheSingleProcessRun) {
  expect_matches(gpt_config({"optim.moments=bf16"}), {{"dp2", {"parallel.dp=2"}},
                                                       {"zero1 dp2", {"parallel.dp=2", "parallel.zero=1"}},
                                                       {"zero2 dp2", {"parallel.dp=2", "parallel.zero=2", "parallel.bucket_mb=0.02"}},
                                                       {"zero3 dp2", {"parallel.dp=2", "parallel.zero=3"}},
                                                       {"tp2", {"parallel.tp=2"}},
                                                       {"pp2", {"parallel.pp=2", "train.grad_accum=2"}}});
}

TEST(DataParallel, LlamaLayoutsMatchTheSingleProcessRun) {
  expect_matches(llama_config(), {{"dp2", {"parallel.dp=2"}},
                                  {"dp3", {"parallel.dp=3"}},
                                  {"zero1 dp2", {"parallel.dp=2", "parallel.zero=1"}},
                                  {"zero2 dp4", {"parallel.dp=4", "parallel.zero=2", "parallel.bucket_mb=0.02"}}});
}

TEST(Pipeline, SchedulesMatchTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=4"}),
                 {{"pp2 1f1b", {"parallel.pp=2", "train.grad_accum=4"}},
                  {"pp2 gpipe", {"parallel.pp=2", "parallel.schedule=gpipe", "train.grad_accum=4"}},
                  {"pp2 x vpp2", {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=4"}},
                  {"pp2 one micro-batch", {"parallel.pp=2"}}});
}

TEST(Pipeline, OddAndUnevenSplitsMatchTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=7"}),
                 {{"pp3 over 7 layers", {"parallel.pp=3", "train.grad_accum=3"}},
                  {"pp3 split 3,1,3", {"parallel.pp=3", "parallel.pp_layers=3,1,3", "train.grad_accum=2"}}});
}

// Note [Stage split]: a first stage that only embeds and a last that only runs the final
// norm, head and loss; GPT's tied head on a rank without the embedding, and Llama's own.
TEST(Pipeline, StagesWithoutBlocksMatchTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=4"}),
                 {{"pp2 split 0,4", {"parallel.pp=2", "parallel.pp_layers=0,4", "train.grad_accum=2"}},
                  {"pp2 split 4,0", {"parallel.pp=2", "parallel.pp_layers=4,0", "train.grad_accum=2"}},
                  {"pp3 split 0,4,0", {"parallel.pp=3", "parallel.pp_layers=0,4,0", "train.grad_accum=3"}},
                  {"pp2 split 0,4 recompute full", {"parallel.pp=2", "parallel.pp_layers=0,4",
                                                    "parallel.recompute=full", "train.grad_accum=2"}},
                  {"pp2 x vpp2 split 0,2,2,0", {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved",
                                                "parallel.pp_layers=0,2,2,0", "train.grad_accum=4"}},
                  {"pp2 zb-v split 0,2,2,0", {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v",
                                              "parallel.pp_layers=0,2,2,0", "train.grad_accum=4"}},
                  {"pp3 x vpp2 accounted", {"parallel.pp=3", "parallel.vpp=2", "parallel.schedule=interleaved",
                                            "parallel.pp_account_embedding=true", "parallel.pp_account_loss=true",
                                            "train.grad_accum=3"}}});
  Config llama = llama_config();
  llama.model.layers = 4;
  expect_matches(llama, {{"llama pp2 split 0,4 zb-h1", {"parallel.pp=2", "parallel.pp_layers=0,4",
                                                        "parallel.schedule=zb-h1", "train.grad_accum=2"}},
                         {"llama dp2 x pp2 split 4,0 zero2", {"parallel.dp=2", "parallel.pp=2", "parallel.zero=2",
                                                             "parallel.pp_layers=4,0", "train.grad_accum=2"}}});
}

TEST(Pipeline, WithDataParallelAndZeroMatchesTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=4"}),
                 {{"dp2 x pp2", {"parallel.dp=2", "parallel.pp=2", "train.grad_accum=2"}},
                  {"dp2 x pp2 zero1", {"parallel.dp=2", "parallel.pp=2", "parallel.zero=1", "train.grad_accum=3"}},
                  {"dp2 x pp2 zero2", {"parallel.dp=2", "parallel.pp=2", "parallel.zero=2", "train.grad_accum=2",
                                       "parallel.bucket_mb=0.05"}}});
  Config llama = llama_config();
  llama.model.layers = 4;
  expect_matches(llama, {{"llama pp2 x vpp2", {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved",
                                               "train.grad_accum=4"}},
                         {"llama dp2 x pp2 zero2", {"parallel.dp=2", "parallel.pp=2", "parallel.zero=2",
                                                    "train.grad_accum=2"}}});
}

TEST(TensorParallel, GptLayoutsMatchTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=4"}),
                 {{"tp2", {"parallel.tp=2"}},
                  {"tp4", {"parallel.tp=4"}},
                  {"dp2 x tp2", {"parallel.dp=2", "parallel.tp=2"}},
                  {"tp2 x pp2", {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}},
                  {"dp2 x tp2 x pp2", {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}},
                  {"dp2 x tp2 zero2", {"parallel.dp=2", "parallel.tp=2", "parallel.zero=2"}},
                  {"tp2 recompute selective", {"parallel.tp=2", "parallel.recompute=selective"}},
                  {"tp2 x pp2 recompute full", {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2",
                                                "parallel.recompute=full"}},
                  // Embedding and head whole on every tp rank (parallel.vocab_parallel = false).
                  {"tp2 replicated vocab", {"parallel.tp=2", "parallel.vocab_parallel=false"}},
                  {"tp2 + sp replicated vocab", {"parallel.tp=2", "parallel.sp=true", "parallel.vocab_parallel=false"}},
                  {"dp2 x tp2 x pp2 replicated vocab", {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2",
                                                        "train.grad_accum=2", "parallel.vocab_parallel=false"}},
                  // A planner's per-layer policy over the 4 layers.
                  {"tp2 x pp2 recompute per layer", {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2",
                                                     "parallel.recompute=full,selective,none,full"}}});
}

TEST(SequenceParallel, MatchesTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=4"}),
                 {{"tp2 + sp", {"parallel.tp=2", "parallel.sp=true"}},
                  {"tp4 + sp", {"parallel.tp=4", "parallel.sp=true"}},
                  {"dp2 x tp2 + sp zero2", {"parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "parallel.zero=2"}},
                  {"tp2 + sp x pp2 recompute full", {"parallel.tp=2", "parallel.sp=true", "parallel.pp=2",
                                                     "train.grad_accum=2", "parallel.recompute=full"}}});
  Config llama = llama_config();
  llama.model.layers = 4;
  expect_matches(llama, {{"llama tp2 + sp", {"parallel.tp=2", "parallel.sp=true"}},
                         {"llama tp2 + sp x pp2 x vpp2", {"parallel.tp=2", "parallel.sp=true", "parallel.pp=2",
                                                          "parallel.vpp=2", "parallel.schedule=interleaved",
                                                          "train.grad_accum=4", "parallel.recompute=selective"}}});
}

TEST(TensorParallel, ThreeWaysWithPaddedVocabulary) {
  // heads 6 split three ways; the 256-token vocabulary pads to 258 rows (2 masked).
  expect_matches(gpt_config({"model.layers=2", "model.d_model=96", "model.heads=6", "model.ffn=192"}),
                 {{"tp3", {"parallel.tp=3"}}, {"tp3 x dp2 zero1", {"parallel.tp=3", "parallel.dp=2", "parallel.zero=1"}}});
}

TEST(TensorParallel, LlamaWithGroupedQueryAttention) {
  Config llama = llama_config();
  llama.model.layers = 4;
  expect_matches(llama, {{"tp2", {"parallel.tp=2"}},
                         {"tp2 x pp2 x vpp2", {"parallel.tp=2", "parallel.pp=2", "parallel.vpp=2",
                                               "parallel.schedule=interleaved", "train.grad_accum=4"}},
                         {"dp2 x tp2 x pp2", {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}}});
}

TEST(Pipeline, StageLayersAndParts) {
  EXPECT_EQ(parallel::stage_layers(7, 3), (std::vector<int>{2, 3, 2}));
  EXPECT_EQ(parallel::stage_layers(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(parallel::stage_layers(6, 4), (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(parallel::stage_layers(7, 2, {3, 4}), (std::vector<int>{3, 4}));
  EXPECT_THROW(parallel::stage_layers(3, 4), Error);
  EXPECT_THROW(parallel::stage_layers(7, 2, {3, 3}), Error);
  EXPECT_EQ(parallel::stage_layers(4, 3, {0, 4, 0}), (std::vector<int>{0, 4, 0}));  // Note [Stage split]
  EXPECT_THROW(parallel::stage_layers(4, 3, {2, 0, 2}), Error);
  // Interleaved: rank 1 of pp 2 x vpp 2 holds virtual stages 1 and 3.
  const ModelPart p = parallel::pipeline_part({1, 2, 2, 3}, 2, 2, 1);
  EXPECT_EQ(p.chunks, (std::vector<std::pair<int, int>>{{1, 3}, {5, 8}}));
  EXPECT_FALSE(p.embed);
  EXPECT_TRUE(p.head);
}

TEST(Zero, Stage3MatchesTheSingleProcessRun) {
  expect_matches(gpt_config({"model.layers=4"}),
                 {{"zero3 dp2", {"parallel.dp=2", "parallel.zero=3"}},
                  {"zero3 dp4 accum3", {"parallel.dp=4", "parallel.zero=3", "train.grad_accum=3"}},
                  {"zero3 dp2 x tp2 + sp", {"parallel.dp=2", "parallel.zero=3", "parallel.tp=2", "parallel.sp=true"}},
                  {"zero3 dp2 recompute full", {"parallel.dp=2", "parallel.zero=3", "parallel.recompute=full"}},
                  // A planner's per-layer ZeRO-3 choice: layers 0 and 2 stay gathered for the step.
                  {"zero3 dp2 keep 0, 2", {"parallel.dp=2", "parallel.zero=3", "parallel.zero_keep=keep,shard,keep,shard",
                                              "train.grad_accum=2"}},
                  {"zero2 dp2 accum2", {"parallel.dp=2", "parallel.zero=2", "train.grad_accum=2"}},
                  {"zero3 dp2 x pp2", {"parallel.dp=2", "parallel.pp=2", "parallel.zero=3", "train.grad_accum=2"}},
                  {"zero3 dp2 x pp2 x vpp2", {"parallel.dp=2", "parallel.pp=2", "parallel.vpp=2",
                                              "parallel.schedule=interleaved", "parallel.zero=3", "train.grad_accum=2"}}});
  Config llama = llama_config();
  expect_matches(llama, {{"llama zero3 dp2 x pp2", {"parallel.dp=2", "parallel.pp=2", "parallel.zero=3",
                                                    "train.grad_accum=2"}},
                         {"llama zero3 dp2", {"parallel.dp=2", "parallel.zero=3"}},
                         {"llama zero3 dp4", {"parallel.dp=4", "parallel.zero=3", "train.grad_accum=3"}}});
}

// Peak resident bytes per category on rank 0 (Note [Resident memory]).
std::map<std::string, int64_t> peak_memory(const Config& c) {
  const std::vector<TrainSummary> out = testing_support::train_as_threads(c);
  std::map<std::string, int64_t> m(out[0].memory_peak_bytes.begin(), out[0].memory_peak_bytes.end());
  m["formula"] = out[0].model_state_formula_bytes;
  return m;
}

TEST(Zero, ShardsWhatEachStageShardsInResidentMemory) {
  // ~6.4M parameters (25 MiB per fp32 copy) in 8 blocks: large next to a page, and a block
  // is 1/8 of the model, so ZeRO-3's gathered units are small next to the shards.
  const std::vector<std::string> model = {"model.layers=8", "model.d_model=256", "model.ffn=1024", "train.steps=2",
                                          "train.batch=8", "parallel.dp=4"};
  auto with = [&](const char* zero) {
    std::vector<std::string> s = model;
    s.push_back(zero);
    return gpt_config(s);
  };
  const auto z0 = peak_memory(with("parallel.zero=0")), z1 = peak_memory(with("parallel.zero=1"));
  const auto z3 = peak_memory(with("parallel.zero=3"));
  const double copy = double(z0.at("params"));  // one whole fp32 copy, resident
  EXPECT_NEAR(double(z0.at("optimizer")), 2 * copy, 0.01 * copy);
  EXPECT_NEAR(double(z1.at("optimizer")), 2 * copy / 4, 0.01 * copy);  // moments: own quarter
  EXPECT_NEAR(double(z3.at("optimizer")), 2 * copy / 4, 0.01 * copy);
  // Stage 3: the own quarter plus the gathered units (current and prefetched block, the
  // small embedding and head), and gradients: the own quarter plus blocks in flight.
  EXPECT_LT(double(z3.at("params")), 0.6 * copy);
  EXPECT_GT(double(z3.at("params")), 0.25 * copy);
  EXPECT_LT(double(z3.at("grads")), 0.6 * copy);
  EXPECT_EQ(z3.at("formula"), z0.at("formula") / 4);
}

TEST(Llama, EveryRequiredLayoutMatchesTheSingleProcessRun) {
  // The list on the Llama preset (GQA, SwiGLU, RoPE, untied head), beyond the
  // layouts the other tests already run on it.
  Config llama = llama_config();
  llama.model.layers = 4;
  expect_matches(llama, {{"dp4", {"parallel.dp=4"}},
                         {"zero1 dp4", {"parallel.dp=4", "parallel.zero=1"}},
                         {"zero2 dp2", {"parallel.dp=2", "parallel.zero=2"}},
                         {"pp2 gpipe", {"parallel.pp=2", "parallel.schedule=gpipe", "train.grad_accum=4"}},
                         {"pp2 1f1b", {"parallel.pp=2", "train.grad_accum=4"}},
                         {"dp2 x tp2", {"parallel.dp=2", "parallel.tp=2"}},
                         {"tp2 x pp2", {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}},
                         {"tp2 + sp replicated vocab", {"parallel.tp=2", "parallel.sp=true",
                                                        "parallel.vocab_parallel=false"}}});
  Config seven = llama_config();
  seven.model.layers = 7;
  expect_matches(seven, {{"pp3 over 7 layers", {"parallel.pp=3", "train.grad_accum=3"}}});
  // heads 6 and kv_heads 3 split three ways.
  expect_matches(gpt_config({"model.preset=llama", "model.layers=2", "model.d_model=96", "model.heads=6",
                             "model.kv_heads=3", "model.ffn=192", "model.ctx=32"}),
                 {{"tp3", {"parallel.tp=3"}}});
}

TEST(DataParallel, VerifyFlagsAWrongResult) {
  // A layout that changes the math (another seed) must be reported as a mismatch.
  const std::vector<VerifyRow> rows = verify_layouts(gpt_config({"train.steps=3"}), {{"parallel.dp=2", "train.seed=7"}});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_FALSE(rows[0].ok);
  EXPECT_GT(rows[0].max_loss_rel, 1e-4);
}

TEST(DataParallel, UnsupportedOrMislaunchedLayoutsAreRefusedByName) {
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  try {
    train(gpt_config({"parallel.dp=2"}), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 2 ranks but 1 process runs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--nproc 2"), std::string::npos) << e.what();
  }
  // A model that cannot fit is refused before anything is allocated.
  try {
    train(load_config("", {"model.preset=llama3-405b", "train.seq=32", "checkpoint.dir=", "train.threads=1"}), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("405853388800 parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("but this machine has"), std::string::npos) << e.what();
  }
  // A verify row whose ranks fail names the failing rank and its error.
  const std::vector<VerifyRow> rows = verify_layouts(gpt_config({"train.steps=1"}), {{"data.path=/nonexistent"}});
  EXPECT_FALSE(rows[0].ok);
  EXPECT_NE(rows[0].error.find("/nonexistent"), std::string::npos) << rows[0].error;
}

TEST(DataParallel, ReportsHowMuchCommunicationWasHidden) {
  const Config c = gpt_config({"parallel.dp=2", "train.steps=4", "parallel.bucket_mb=0.02"});
  std::vector<TrainSummary> out(2);
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  const auto errors = comm::run_threads(2, {}, [&](comm::World& w) { out[size_t(w.global_rank())] = train(c, o, w); });
  ASSERT_EQ(errors, std::vector<std::string>(2));
  for (const TrainSummary& s : out) {
    EXPECT_GE(s.comm_hidden_fraction, 0.0);
    EXPECT_LE(s.comm_hidden_fraction, 1.0);
    EXPECT_GE(s.comm_exposed_s, 0.0);
  }
  EXPECT_NE(sink.str().find("hidden behind backward"), std::string::npos) << sink.str();
}

TEST(Trace, OneFileWithATrackPerRank) {
  const std::string path = ::testing::TempDir() + "/loom_trace_test.json";
  const Config c = gpt_config({"parallel.dp=2", "parallel.pp=2", "train.grad_accum=2", "train.steps=2"});
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  o.trace_path = path;
  const auto errors = comm::run_threads(4, {}, [&](comm::World& w) { train(c, o, w); });
  ASSERT_EQ(errors, std::vector<std::string>(4));
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::map<std::pair<int, std::string>, int> count;  // (rank, category) -> events
  double last_step_end = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    count[{e.at("pid").get<int>(), e.at("cat").get<std::string>()}]++;
    if (e.at("cat") == "step") last_step_end = std::max(last_step_end, e.at("ts").get<double>() + e.at("dur").get<double>());
    if (e.at("ph") == "X") {
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
  }
  for (int r = 0; r < 4; r++) {
    EXPECT_EQ((count[{r, "step"}]), 2) << r;
    EXPECT_GT((count[{r, "compute"}]), 0) << r;      // forward/backward of each block, head, embedding
    EXPECT_EQ((count[{r, "pipeline"}]), 2 * 2 * 2) << r;  // 2 steps x (F, B) x 2 micro-batches
    EXPECT_GT((count[{r, "transfer"}]), 0) << r;     // activations and gradients between stages
    EXPECT_GT((count[{r, "collective"}]), 0) << r;   // data-parallel reduction, loss and norm sums
    EXPECT_GT((count[{r, "memory"}]), 0) << r;
  }
  EXPECT_GT(last_step_end, 0.0);
}

// Max |a - b| over two flat buffers of one layout.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); i++) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

TEST(Checkpoint, ParallelRunsSaveTheWholeModelAndItsMoments) {
  // Every rank writes its part of the run's final checkpoint (a sharded step); read back
  // as the whole model (parameters and AdamW moments) it must equal the single-process run's.
  const std::string dir = ::testing::TempDir() + "/loom_parallel_ckpt_";
  std::filesystem::remove_all(dir + "single");
  const Config single = gpt_config({"model.layers=4", "train.steps=5", "checkpoint.dir=" + dir + "single"});
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  train(single, o);
  const CheckpointData ref = load_checkpoint(dir + "single");
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"parallel.dp=2", "parallel.zero=3"},
        std::vector<std::string>{"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"},
        std::vector<std::string>{"parallel.dp=2", "parallel.zero=1", "parallel.pp=2", "train.grad_accum=2"}}) {
    std::vector<std::string> sets = {"model.layers=4", "train.steps=5", "checkpoint.dir=" + dir + "parallel"};
    sets.insert(sets.end(), layout.begin(), layout.end());
    const Config c = gpt_config(sets);
    std::filesystem::remove_all(dir + "parallel");  // each layout is a run of its own
    const auto errors = comm::run_threads(int(c.parallel.world()), {}, [&](comm::World& w) { train(c, o, w); });
    ASSERT_EQ(errors, std::vector<std::string>(errors.size())) << layout[0];
    const CheckpointData got = load_checkpoint(dir + "parallel");
    EXPECT_LE(max_abs_diff(got.params, ref.params), 1e-4) << layout[0] << " " << layout[1];
    ASSERT_TRUE(got.m && got.v && ref.m && ref.v);
    EXPECT_LE(max_abs_diff(*got.m, *ref.m), 1e-4) << layout[0] << " " << layout[1];
    EXPECT_LE(max_abs_diff(*got.v, *ref.v), 1e-6) << layout[0] << " " << layout[1];
    EXPECT_EQ(got.state.optimizer_steps, ref.state.optimizer_steps);
  }
}

TEST(LayoutList, ParsesShortAndFullKeys) {
  const auto l = parse_layout_list("dp=2,zero=1; dp=4 ;train.grad_accum=2;grad_accum=3");
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[3], (std::vector<std::string>{"train.grad_accum=3"}));
  EXPECT_EQ(l[0], (std::vector<std::string>{"parallel.dp=2", "parallel.zero=1"}));
  EXPECT_EQ(l[1], (std::vector<std::string>{"parallel.dp=4"}));
  EXPECT_EQ(l[2], (std::vector<std::string>{"train.grad_accum=2"}));
  EXPECT_EQ(parse_layout_list("pp=3,pp_layers=3,1,3,grad_accum=2")[0],
            (std::vector<std::string>{"parallel.pp=3", "parallel.pp_layers=3,1,3", "train.grad_accum=2"}));
  EXPECT_THROW(parse_layout_list("dp2"), ConfigError);
  EXPECT_THROW(parse_layout_list(" ; "), ConfigError);
}

}  // namespace
}  // namespace loom
