// Parallel training under real mpirun: every layout of this world size against the
// single-process run (which each rank also trains, locally, on the same seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "loom/comm/mpi_backend.h"
#include "loom/comm/world.h"
#include "loom/train/trainer.h"
#include "loom/train/verify.h"
#include "support/fortune_shards.h"
#include "support/mpi_gtest_main.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

comm::World* g_world = nullptr;  // owned by main()

Config base_config(const std::string& preset) {
  std::vector<std::string> sets = {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ctx=32",
                                   "train.batch=12",  "train.steps=20",   "train.val_batches=1", "train.val_every=0",
                                   "train.threads=1", "checkpoint.dir=",  "comm.timeout_s=60"};
  if (preset == "llama") sets.insert(sets.begin(), {"model.preset=llama", "model.kv_heads=2", "model.ffn=96"});
  else sets.push_back("model.ffn=256");
  // Re-apply the shape after the preset (the preset sets every model key first anyway).
  return load_config("", sets);
}

TrainSummary run(const Config& c, comm::World* w) {
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink, o.keep_params = true;
  return w ? train(c, o, *w) : train(c, o);
}

void check_layouts(const std::string& preset, const std::vector<std::vector<std::string>>& layouts,
                   const std::vector<std::string>& extra = {}, const VerifyTolerance& tol = {}) {
  const Config base = config_from_toml_string(to_toml(base_config(preset)), extra);
  const TrainSummary ref = run(base, nullptr);
  int ran = 0;
  for (const auto& sets : layouts) {
    Config c = config_from_toml_string(to_toml(base), sets);
    if (c.parallel.world() != g_world->world_size()) continue;
    std::string name = preset;
    for (const auto& s : sets) name += " " + s;
    const VerifyRow row = compare_runs(name, ref, run(c, g_world), tol);
    ran++;
    EXPECT_TRUE(row.ok) << name << " on rank " << g_world->global_rank() << ": " << row.error << " loss rel "
                        << row.max_loss_rel << ", weight " << row.max_weight_abs;
  }
  EXPECT_GT(ran, 0) << "no layout for " << g_world->world_size() << " ranks";
}

const std::vector<std::vector<std::string>> kLayouts = {
    {"parallel.dp=2"},
    {"parallel.dp=2", "parallel.zero=1"},
    {"parallel.dp=2", "parallel.zero=2", "train.grad_accum=2"},
    {"parallel.dp=3"},
    {"parallel.dp=3", "parallel.zero=2"},
    {"parallel.dp=4"},
    {"parallel.dp=4", "parallel.zero=1"},
    {"parallel.dp=4", "parallel.zero=2", "parallel.bucket_mb=0.02"},
    {"parallel.pp=2", "train.grad_accum=4"},
    {"parallel.pp=2", "parallel.schedule=gpipe", "train.grad_accum=4"},
    {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=4"},
    {"parallel.pp=3", "train.grad_accum=3"},
    {"parallel.pp=3", "parallel.pp_layers=0,4,0", "train.grad_accum=3"},  // Note [Stage split]
    {"parallel.dp=2", "parallel.pp=2", "parallel.pp_layers=4,0", "train.grad_accum=2"},
    {"parallel.dp=2", "parallel.pp=2", "train.grad_accum=2"},
    {"parallel.dp=2", "parallel.pp=2", "parallel.zero=2", "train.grad_accum=2", "parallel.bucket_mb=0.05"},
    {"parallel.tp=2"},
    {"parallel.dp=2", "parallel.zero=3", "train.grad_accum=2"},
    {"parallel.dp=4", "parallel.zero=3"},
    {"parallel.dp=2", "parallel.tp=2", "parallel.zero=3", "parallel.sp=true"},
    {"parallel.tp=2", "parallel.dp=2"},
    {"parallel.tp=2", "parallel.sp=true"},
    {"parallel.tp=2", "parallel.sp=true", "parallel.pp=2", "train.grad_accum=2", "parallel.recompute=full"},
    {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"},
    {"parallel.tp=4"},
    {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"},
    {"parallel.dp=2", "parallel.pp=2", "parallel.zero=3", "train.grad_accum=2"},
    // Note [Vocabulary passes]: the vocabulary over the pipeline's ranks (broadcasts and reduces over MPI)
    {"parallel.pp=2", "parallel.pp_vocab=true", "train.grad_accum=4"},
    {"parallel.pp=3", "parallel.pp_vocab=true", "parallel.schedule=zb-h1", "train.grad_accum=3"},
    {"parallel.tp=2", "parallel.pp=2", "parallel.pp_vocab=true", "train.grad_accum=2"},
    {"parallel.tp=2", "parallel.sp=true", "parallel.pp=2", "parallel.pp_vocab=true", "train.grad_accum=2"},
    {"parallel.dp=2", "parallel.pp=2", "parallel.zero=3", "parallel.pp_vocab=true", "train.grad_accum=2"},
};

TEST(MpiTrain, GptLayoutsMatchTheSingleProcessRun) { check_layouts("gpt", kLayouts); }
TEST(MpiTrain, OddDegreesMatchTheSingleProcessRun) {
  // 7 layers and 6 heads: tp 3 splits heads (and the 256-token vocabulary, padded to 258),
  // pp 3 splits the layers unevenly (2, 3, 2).
  if (g_world->world_size() != 3) GTEST_SKIP() << "runs at 3 ranks";
  const std::vector<std::string> shape = {"model.layers=7", "model.d_model=96", "model.heads=6", "model.ffn=192"};
  for (const char* preset : {"gpt", "llama"}) {
    Config base = base_config(preset);
    std::vector<std::string> sets = shape;
    sets.push_back(std::string(preset) == "llama" ? "model.kv_heads=3" : "model.kv_heads=6");
    base = config_from_toml_string(to_toml(base), sets);
    const TrainSummary ref = run(base, nullptr);
    for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
             {"parallel.tp=3"}, {"parallel.pp=3", "train.grad_accum=3"}, {"parallel.dp=3", "parallel.zero=3"}}) {
      const Config c = config_from_toml_string(to_toml(base), layout);
      const VerifyRow row = compare_runs(layout[0], ref, run(c, g_world));
      EXPECT_TRUE(row.ok) << preset << " " << layout[0] << ": " << row.error << " loss rel " << row.max_loss_rel
                          << ", weight " << row.max_weight_abs;
    }
  }
}

TEST(MpiTrain, LlamaLayoutsMatchTheSingleProcessRun) {
  // kv_heads = 2: tp 4 is not a valid split of this model.
  std::vector<std::vector<std::string>> layouts;
  for (const auto& l : kLayouts)
    if (std::find(l.begin(), l.end(), "parallel.tp=4") == l.end()) layouts.push_back(l);
  check_layouts("llama", layouts);
}

// train.precision = bf16 with the loss tolerance of
// Precision.Bf16LayoutsMatchTheSingleProcessBf16Run; the weights over 20 steps instead of 6.
// A bf16 rounding that flips between two runs moves a weight's AdamW update by at most
// about 2 lr_k per step (the normalised update changes sign), 2 sum_k lr_k = 1.05e-2 over
// these 20 warm-up steps (lr 1e-3 x k / 40): the hard ceiling. Observed <= 5.4e-4 since the
// softmax probabilities round too (Note [bf16 attention probabilities]); bound 1.5e-3.
TEST(MpiTrain, Bf16LayoutsMatchTheSingleProcessBf16Run) {
  VerifyTolerance tol;
  tol.loss_rel = 1e-4;
  tol.weight_abs = 1.5e-3;
  check_layouts("gpt",
                {{"parallel.dp=2", "parallel.zero=2", "train.grad_accum=2"}, {"parallel.tp=3"},
                 {"parallel.dp=2", "parallel.tp=2", "parallel.zero=3", "parallel.sp=true"},
                 {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}},
                {"train.precision=bf16", "model.heads=6", "model.kv_heads=6", "model.d_model=96", "model.ffn=384"},
                tol);
}

// comm.grad_dtype = bf16 against the single-process fp32 run, with the bounds of
// Precision.Bf16GradientAllReduceStaysNearTheFp32One.
TEST(MpiTrain, Bf16GradientAllReduceStaysNearTheExactRun) {
  VerifyTolerance tol;
  tol.loss_rel = 1e-5;
  tol.weight_abs = 5e-4;
  check_layouts("gpt",
                {{"parallel.dp=2", "comm.grad_dtype=bf16"}, {"parallel.dp=3", "comm.grad_dtype=bf16"},
                 {"parallel.dp=4", "parallel.zero=1", "comm.grad_dtype=bf16"},
                 {"parallel.dp=4", "parallel.tp=2", "comm.grad_dtype=bf16"},
                 {"parallel.dp=3", "parallel.zero=2", "comm.grad_dtype=bf16"},  // Note [Ring codecs]
                 {"parallel.dp=2", "parallel.zero=3", "comm.grad_dtype=bf16"}},
                {}, tol);
}

// parallel.compress (Note [Gradient compressors]) and parallel.reduce = adasum (Note
// [Adasum]) against the single-process run, each held to its loss bound (Note [Verify
// tolerances]); every rank ends with the same weights.
TEST(MpiTrain, CompressedGradientsStayNearTheExactRun) {
  const Config base = base_config("gpt");
  const TrainSummary ref = run(base, nullptr);
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.dp=2", "parallel.compress=topk", "parallel.compress_ratio=0.01"},
      {"parallel.dp=2", "parallel.compress=terngrad"},
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.zero=1"},
      {"parallel.dp=3", "parallel.compress=powersgd"},
      {"parallel.dp=3", "parallel.compress=int8"},
      {"parallel.dp=3", "parallel.compress=int8", "parallel.zero=2"},
      {"parallel.dp=2", "parallel.compress=bf16", "parallel.zero=3"},
      {"parallel.dp=2", "parallel.tp=2", "parallel.compress=powersgd"},
      {"parallel.dp=2", "parallel.pp=2", "parallel.compress=topk", "train.grad_accum=2"},
      {"parallel.dp=4", "parallel.tp=2", "parallel.compress=terngrad"},
      {"parallel.dp=2", "parallel.reduce=adasum"},
      {"parallel.dp=4", "parallel.reduce=adasum"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=3"},
      {"parallel.dp=4", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=3"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.pp=2", "train.grad_accum=2",
       "parallel.compress_warmup_steps=3"},
      {"parallel.dp=2", "parallel.pp=2", "parallel.compress=terngrad", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.zero=1", "parallel.compress_warmup_steps=3"},
      {"parallel.dp=4", "parallel.compress=topk_adam", "parallel.zero=3", "parallel.compress_warmup_steps=3"},
      {"parallel.dp=2", "parallel.compress=zero_one_adam", "parallel.zero_one_var_freeze_steps=4",
       "parallel.zero_one_local_scaler=1", "parallel.zero_one_local_clip=4"},
      {"parallel.dp=4", "parallel.compress=zero_one_adam", "parallel.zero_one_var_freeze_steps=4",
       "parallel.zero_one_local_scaler=1", "parallel.zero_one_local_clip=4"},
  };
  int ran = 0;
  for (const auto& sets : layouts) {
    const Config c = config_from_toml_string(to_toml(base), sets);
    if (c.parallel.world() != g_world->world_size()) continue;
    const TrainSummary got = run(c, g_world);
    const VerifyRow row = compare_runs(sets[1], ref, got, tolerance_for(c));
    ran++;
    EXPECT_TRUE(row.ok) << sets[1] << " at " << c.parallel.world() << " ranks: " << row.error << " loss rel "
                        << row.max_loss_rel << " (bound " << row.tolerance.loss_rel << ")";
    // Replicas agree: rank 0's weights reach every rank bit for bit (the dp group's ranks
    // hold the same replica; tp/pp ranks compare their gathered whole-model copy).
    std::vector<float> mine = got.final_params, first = mine;
    g_world->world_group().broadcast(std::span<float>(first), 0);
    EXPECT_EQ(first, mine) << sets[1] << " rank " << g_world->global_rank();
  }
  EXPECT_GT(ran, 0) << "no layout for " << g_world->world_size() << " ranks";
}

// comm.param_dtype = bf16 (Note [bf16 parameter gathers]) against the single-process bf16
// run, with the bounds of Precision.Bf16ParameterGathersStayNearTheFp32Ones.
TEST(MpiTrain, Bf16ParameterGathersStayNearTheSingleProcessRun) {
  VerifyTolerance tol;
  tol.loss_rel = 0x1p-6;
  tol.weight_abs = 1e-3;
  check_layouts("gpt",
                {{"parallel.dp=2", "parallel.zero=3", "comm.param_dtype=bf16", "train.grad_accum=2"},
                 {"parallel.dp=3", "parallel.zero=3", "comm.param_dtype=bf16"},
                 {"parallel.dp=2", "parallel.tp=2", "parallel.zero=3", "comm.param_dtype=bf16"},
                 {"parallel.dp=4", "parallel.tp=2", "parallel.zero=3", "comm.param_dtype=bf16"}},
                {"train.precision=bf16"}, tol);
}

// ZeRO++ under mpirun (one host, so hpZ's host group is the whole dp group) against the
// single-process run: the loss bound of Precision.Qwz* / Qgz*, the weights to the hard
// ceiling of Bf16LayoutsMatchTheSingleProcessBf16Run over these 20 steps, 2 sum_k lr_k =
// 1.05e-2 (an int8 rounding flips an update's sign as a bf16 one does). Observed 2.4e-3
// (dp 2, all three).
TEST(MpiTrain, ZeroPlusPlusStaysNearTheSingleProcessRun) {
  VerifyTolerance tol;
  tol.loss_rel = 0x1p-6;
  tol.weight_abs = 1.05e-2;
  check_layouts("gpt",
                {{"parallel.dp=2", "parallel.zero=3", "parallel.zeropp_qwz=true", "parallel.zeropp_qgz=true",
                  "parallel.zeropp_hpz=true", "train.grad_accum=2"},
                 {"parallel.dp=3", "parallel.zero=2", "parallel.zeropp_qgz=true"},
                 {"parallel.dp=4", "parallel.zero=3", "parallel.zeropp_hpz=true", "parallel.zeropp_qwz=true"},
                 {"parallel.dp=2", "parallel.tp=2", "parallel.zero=3", "parallel.zeropp_qwz=true",
                  "parallel.zeropp_qgz=true"},
                 {"parallel.dp=4", "parallel.tp=2", "parallel.zero=3", "parallel.zeropp_qwz=true",
                  "parallel.zeropp_qgz=true", "parallel.zeropp_hpz=true"}},
                {}, tol);
}

// comm.p2p_dtype = bf16 (Note [bf16 pipeline transfers]) against the single-process bf16
// run, with the bounds of Precision.Bf16PipelineTransfersStayNearTheFp32Ones.
TEST(MpiTrain, Bf16PipelineTransfersStayNearTheSingleProcessRun) {
  VerifyTolerance tol;
  tol.loss_rel = 0x1p-6;
  tol.weight_abs = 1e-3;
  check_layouts("gpt",
                {{"parallel.pp=2", "train.grad_accum=2", "comm.p2p_dtype=bf16"},
                 {"parallel.pp=3", "train.grad_accum=3", "comm.p2p_dtype=bf16"},
                 {"parallel.pp=2", "parallel.dp=2", "train.grad_accum=2", "comm.p2p_dtype=bf16"},
                 {"parallel.pp=2", "parallel.tp=2", "parallel.dp=2", "train.grad_accum=2", "comm.p2p_dtype=bf16"}},
                {"train.precision=bf16"}, tol);
}

// A stream layout `c` (2bw, pipedream or pipemare) against its reference, the same layout's
// flushing steps binding the same versions, bit for bit under real processes.
void expect_stream_matches_reference(const Config& c) {
  Config ref = c;
  ref.parallel.schedule = ScheduleKind::k1F1B;
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink, o.keep_params = true;
  const TrainSummary got = train(c, o, *g_world);
  if (c.parallel.schedule == ScheduleKind::k2BW) o.two_bw_reference = true;
  else o.async_reference = schedule_name(c.parallel.schedule);
  const TrainSummary want = train(ref, o, *g_world);
  EXPECT_EQ(got.losses, want.losses) << schedule_name(c.parallel.schedule);
  EXPECT_EQ(got.final_params, want.final_params) << schedule_name(c.parallel.schedule);
}

// Note [PipeDream-2BW] under mpirun: a pipeline over every rank, no flush between steps
// (boundary messages of 128 KiB, past MPI's eager limit, so a send received only in the
// next step must not hold its rank out of the step's end), equal bit for bit to its
// reference (the same layout's flushing steps with the delayed updates).
TEST(MpiTrain, TwoBwMatchesItsDelayedUpdateReference) {
  const int n = g_world->world_size();
  if (n < 2 || n > 4) GTEST_SKIP() << "a 2bw pipeline of 2 to 4 stages";
  expect_stream_matches_reference(config_from_toml_string(
      to_toml(base_config("gpt")), {"model.d_model=128", "model.ctx=64", "model.layers=" + std::to_string(n),
                                    "parallel.pp=" + std::to_string(n), "train.grad_accum=" + std::to_string(n + 1),
                                    "train.batch=" + std::to_string(4 * (n + 1)), "train.steps=6",
                                    "optim.grad_clip=0.5", "parallel.schedule=2bw"}));
}

// Note [Vocabulary passes in a stream] under mpirun: 2bw with the vocabulary split over every
// rank (Llama: its head and embedding each sum their gradients in micro-batch order, so bit
// for bit at any depth), the trailing embedding gradients carried into the step before's.
TEST(MpiTrain, TwoBwWithTheVocabularySplitMatchesItsDelayedUpdateReference) {
  const int n = g_world->world_size();
  if (n < 2 || n > 4) GTEST_SKIP() << "a 2bw pipeline of 2 to 4 stages";
  expect_stream_matches_reference(config_from_toml_string(
      to_toml(base_config("llama")), {"model.layers=" + std::to_string(n), "parallel.pp=" + std::to_string(n),
                                      "parallel.pp_vocab=true", "train.grad_accum=" + std::to_string(n + 1),
                                      "train.batch=" + std::to_string(n + 1), "train.steps=6", "optim.grad_clip=0.5",
                                      "parallel.schedule=2bw"}));
}

// Note [PipeDream weight stashing], Note [PipeMare]: under real processes (the tied wte's
// two links between the first and last stage included) each mode equals its reference.
TEST(MpiTrain, PipeDreamAndPipeMareMatchTheirReference) {
  const int n = g_world->world_size();
  if (n < 2 || n > 4) GTEST_SKIP() << "a pipeline of 2 to 4 stages";
  for (const std::string kind : {"pipedream", "pipemare"})
    expect_stream_matches_reference(config_from_toml_string(
        to_toml(base_config("gpt")), {"model.d_model=128", "model.ctx=64", "model.layers=" + std::to_string(n),
                                      "parallel.pp=" + std::to_string(n), "train.grad_accum=1", "train.batch=4",
                                      "train.steps=" + std::to_string(2 * n + 2), "optim.grad_clip=0",
                                      "parallel.schedule=" + kind}));
}

// Note [Streams with data parallelism] under mpirun: two replicas of a two-stage stream, each
// update's gradient all-reduced over the stage's replicas, equal bit for bit to the flushing
// dp x pp layout's reference for 2bw, pipedream and pipemare.
TEST(MpiTrain, StreamsWithDataParallelismMatchTheirReference) {
  if (g_world->world_size() != 4) GTEST_SKIP() << "dp 2 x pp 2";
  for (const std::string kind : {"2bw", "pipedream", "pipemare"}) {
    const bool two_bw = kind == "2bw";
    expect_stream_matches_reference(config_from_toml_string(
        to_toml(base_config("gpt")),
        {"parallel.dp=2", "parallel.pp=2", "train.grad_accum=" + std::string(two_bw ? "2" : "1"),
         "train.batch=" + std::string(two_bw ? "8" : "4"), "train.steps=6",
         "optim.grad_clip=" + std::string(two_bw ? "0.5" : "0"), "parallel.schedule=" + kind}));
  }
}

// Note [Parameter server]: workers and servers as real processes train as the
// single process does (loom verify's tolerances); every worker ends with the same weights.
TEST(MpiTrain, ParameterServerMatchesTheSingleProcessRun) {
  const int n = g_world->world_size();
  if (n < 3) GTEST_SKIP() << "two workers and a server";
  const Config base = config_from_toml_string(to_toml(base_config("gpt")), {"train.batch=12", "train.steps=6"});
  const TrainSummary ref = run(base, nullptr);
  int dp = n - 1;  // the most workers that divide the batch, the other ranks servers
  while (12 % dp != 0) --dp;
  const Config c = config_from_toml_string(to_toml(base), {"parallel.dp=" + std::to_string(dp),
                                                           "parallel.ps_servers=" + std::to_string(n - dp)});
  const TrainSummary got = run(c, g_world);
  if (g_world->global_rank() >= dp) return;  // servers report no losses
  const VerifyRow row = compare_runs("ps", ref, got, tolerance_for(c));
  EXPECT_TRUE(row.ok) << row.error << " loss rel " << row.max_loss_rel << ", weight " << row.max_weight_abs;
}

// Note [Asynchronous parameter server] across processes: two workers (the second 2x slower)
// and the other ranks servers under ssp with bound 1: every rank agrees on the pushes
// applied, exactly W x steps, none was staler than the bound, and both modes train.
TEST(MpiTrain, ParameterServerSspHoldsItsBoundAcrossProcesses) {
  const int n = g_world->world_size();
  if (n < 3) GTEST_SKIP() << "two workers and a server";
  const Config base = config_from_toml_string(to_toml(base_config("gpt")), {"train.batch=12", "train.steps=10"});
  for (const char* mode : {"ps.mode=ssp", "ps.mode=async"}) {
    const Config c = config_from_toml_string(
        to_toml(base), {"parallel.dp=2", "parallel.ps_servers=" + std::to_string(n - 2), mode, "ps.staleness=1",
                        "ps.slow_worker=1", "ps.slow_factor=2"});
    const TrainSummary got = run(c, g_world);
    EXPECT_EQ(got.ps_pushes, 20) << mode;  // Note [Exact push count]
    if (std::string(mode) == "ps.mode=ssp") EXPECT_LE(got.ps_max_staleness, 1);
    if (g_world->global_rank() >= 2) continue;  // servers report no losses
    ASSERT_FALSE(got.losses.empty()) << mode;
    EXPECT_LT(got.losses.back(), got.losses.front()) << mode;
  }
}

// Context parallelism across processes (Note [Context-parallel chunks]): cp 2, 3, 4 and 8
// alone, and with dp 2 x ZeRO-1 and dp 2 x tp 2 + sp, each on the rank count it fills; Ulysses
// (Note [Ulysses attention]) at cp 2 and 4 and with dp 2 x ZeRO-3 and dp 2 x tp 2 + sp; ring
// (Note [Ring attention]) at cp 2, 3 and 4 and with dp 2 x tp 2 + sp.
TEST(MpiTrain, ContextParallelLayoutsMatchTheSingleProcessRun) {
  check_layouts("gpt",
                {{"parallel.cp=2"},
                 {"parallel.cp=3"},
                 {"parallel.cp=4"},
                 {"parallel.cp=2", "parallel.dp=2", "parallel.zero=1"},
                 {"parallel.cp=8"},
                 {"parallel.cp=2", "parallel.dp=2", "parallel.tp=2", "parallel.sp=true"},
                 {"parallel.cp=2", "parallel.cp_mode=ulysses"},
                 {"parallel.cp=4", "parallel.cp_mode=ulysses"},
                 {"parallel.cp=2", "parallel.cp_mode=ulysses", "parallel.dp=2", "parallel.zero=3"},
                 {"parallel.cp=2", "parallel.cp_mode=ulysses", "parallel.dp=2", "parallel.tp=2", "parallel.sp=true"},
                 {"parallel.cp=2", "parallel.cp_mode=ring"},
                 {"parallel.cp=3", "parallel.cp_mode=ring"},
                 {"parallel.cp=4", "parallel.cp_mode=ring"},
                 {"parallel.cp=2", "parallel.cp_mode=ring", "parallel.dp=2", "parallel.tp=2", "parallel.sp=true"}},
                {"model.ctx=48", "train.seq=48"});
}

// Note [Parameter server with model parallelism] across processes: at 4 ranks a pp 2 GPT
// worker pair (tied wte) with one server per stage, at 8 ranks dp 2 x tp 2 workers with two
// servers per shard. Sync matches the single process (loom verify's tolerances); async /
// ssp applies exactly W x steps pushes on every server and trains.
TEST(MpiTrain, ParameterServerWithModelParallelWorkers) {
  const int n = g_world->world_size();
  if (n != 4 && n != 8) GTEST_SKIP() << "pp 2 + 2 servers, or dp 2 x tp 2 + 4 servers";
  const Config base = config_from_toml_string(to_toml(base_config("gpt")), {"train.batch=12", "train.steps=6"});
  const TrainSummary ref = run(base, nullptr);
  const std::vector<std::string> layout =
      n == 4 ? std::vector<std::string>{"parallel.pp=2", "parallel.ps_servers=1", "train.grad_accum=2"}
             : std::vector<std::string>{"parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "parallel.ps_servers=2"};
  const Config c = config_from_toml_string(to_toml(base), layout);
  const TrainSummary got = run(c, g_world);
  if (g_world->global_rank() < c.parallel.world()) {
    const VerifyRow row = compare_runs("ps model parallel", ref, got, tolerance_for(c));
    EXPECT_TRUE(row.ok) << row.error << " loss rel " << row.max_loss_rel << ", weight " << row.max_weight_abs;
  }
  std::vector<std::string> free_sets = layout;
  free_sets.insert(free_sets.end(), {"ps.mode=ssp", "ps.staleness=1", "ps.slow_worker=0", "ps.slow_factor=2"});
  const Config f = config_from_toml_string(to_toml(base), free_sets);
  const TrainSummary free = run(f, g_world);
  EXPECT_EQ(free.ps_pushes, f.parallel.dp * 6);  // Note [Exact push count]
  EXPECT_LE(free.ps_max_staleness, 1);
  if (g_world->global_rank() != 0) return;
  ASSERT_FALSE(free.losses.empty());
  EXPECT_LT(free.losses.back(), free.losses.front());
}

// data.bucketing (Note [Length bucketing]): micro-batches of different lengths on every
// rank, the loss normalised by the global batch's real targets.
TEST(MpiTrain, BucketedLayoutsMatchTheSingleProcessRun) {
  testing_support::TempDir d{"loom-mpi-bucketing"};  // each rank prepares its own copy
  testing_support::prepare_fortune_shards("fortunes-1k.model", d / "shards");
  Config base = base_config("gpt");
  base = config_from_toml_string(to_toml(base), {"data.shards=" + (d / "shards"), "model.vocab=1000",
                                                 "model.ctx=48", "train.steps=6", "data.bucketing=true",
                                                 "data.buckets=6", "data.bucket_pool=4"});
  const TrainSummary ref = run(base, nullptr);
  int ran = 0;
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {"parallel.dp=2", "train.grad_accum=3"},
           {"parallel.dp=3", "train.grad_accum=2", "parallel.zero=2"},
           {"parallel.dp=2", "parallel.tp=2", "train.grad_accum=3", "parallel.zero=1"},
           {"parallel.dp=4", "parallel.tp=2", "train.grad_accum=3"}}) {
    const Config c = config_from_toml_string(to_toml(base), layout);
    if (c.parallel.world() != g_world->world_size()) continue;
    const VerifyRow row = compare_runs(layout[0], ref, run(c, g_world));
    ran++;
    EXPECT_TRUE(row.ok) << layout[0] << " " << layout[1] << ": " << row.error << " loss rel " << row.max_loss_rel
                        << ", weight " << row.max_weight_abs;
  }
  EXPECT_EQ(ran, 1) << "one bucketed layout per world size";
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return testing_support::run_mpi_tests(argc, argv, [](loom::comm::World* w) { loom::g_world = w; });
}
