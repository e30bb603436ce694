// Training with compressed data-parallel gradients (Note [Gradient compressors]) against
// exact data parallelism and the single-process run (threads backend).
#include <gtest/gtest.h>

#include <sstream>

#include "loom/core/error.h"
#include "loom/train/verify.h"
#include "support/error_message.h"
#include "support/train_threads.h"

namespace loom {
namespace {

Config small_config(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=256",
                                   "model.ctx=32",   "train.batch=12",   "train.steps=6",  "train.val_batches=1",
                                   "train.val_every=0", "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

Config llama(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.preset=llama", "model.layers=2", "model.d_model=64", "model.heads=4",
                                   "model.kv_heads=2", "model.ffn=96", "model.ctx=32", "parallel.dp=2",
                                   "parallel.bucket_mb=0.02"};  // several buckets
  sets.insert(sets.end(), extra.begin(), extra.end());
  return small_config(sets);
}

// At dp 2 a sum of two values is the same in either order and the mean halves it exactly,
// so the cases where a compressor sends everything equal exact data parallelism bit for
// bit: top-k with k = n, and PowerSGD at a rank where no matrix would shrink (every tensor
// takes the exact all-reduce). Llama: its embedding is not tied, so exact dp has no
// separate embedding-row path. Warm-up steps run exact then hand over mid-run.
TEST(CompressedDataParallel, SendingEverythingEqualsExactDataParallelBitForBit) {
  const std::vector<float> exact = testing_support::train_keeping_params(llama({}))[0].final_params;
  for (const std::vector<std::string>& sets :
       std::vector<std::vector<std::string>>{{"parallel.compress=topk", "parallel.compress_ratio=1"},
                                             {"parallel.compress=topk", "parallel.compress_ratio=1",
                                              "parallel.compress_warmup_steps=3"},
                                             {"parallel.compress=powersgd", "parallel.compress_rank=1000"},
                                             // 1-bit Adam compresses only after its warm-up
                                             {"parallel.compress=onebit_adam", "parallel.compress_warmup_steps=6"},
                                             {"parallel.compress=topk_adam", "parallel.compress_warmup_steps=6"},
                                             // 0/1 Adam with every step a variance step: AdamW
                                             {"parallel.compress=zero_one_adam", "parallel.zero_one_var_scaler=6",
                                              "parallel.zero_one_var_freeze_steps=6"}}) {
    const auto out = testing_support::train_keeping_params(llama(sets));
    EXPECT_EQ(out[0].final_params, exact) << sets[0] << " " << sets[1];
    if (sets[0] == "parallel.compress=topk")  // (index, value) pairs: twice exact's bytes
      EXPECT_NE(out[0].comm_wire_bytes, out[0].comm_exact_wire_bytes) << "the compressor did not run";
    EXPECT_EQ(out[1].final_params, exact) << sets[0] << " " << sets[1];
  }
}

// Note [Accordion]: with eta 0 every window is critical, so it is plain PowerSGD at the light
// rank bit for bit; with a huge eta every window after the first is calm, so one switch to
// the heavy rank is logged (after step 4 at window 2) and the run moves fewer bytes.
TEST(CompressedDataParallel, AccordionLogsItsSwitchesAndReducesToItsSettings) {
  const std::vector<std::string> psgd = {"parallel.compress=powersgd", "parallel.compress_rank=4",
                                         "parallel.bucket_mb=1"};
  const auto plain = testing_support::train_keeping_params(llama(psgd));
  auto with = [&](const std::string& eta) {
    std::vector<std::string> sets = psgd;
    sets.insert(sets.end(), {"parallel.compress_adapt=accordion", "parallel.accordion_window=2",
                             "parallel.accordion_eta=" + eta});
    return testing_support::train_keeping_params(llama(sets));
  };
  const auto always_light = with("0");
  EXPECT_EQ(always_light[0].final_params, plain[0].final_params);
  EXPECT_TRUE(always_light[0].accordion_log.empty());
  const auto calm = with("1e9");
  ASSERT_FALSE(calm[0].accordion_log.empty());
  for (const std::string& line : calm[0].accordion_log) {
    EXPECT_NE(line.find("-> heavy (rank 1) after step 4"), std::string::npos) << line;
  }
  EXPECT_EQ(calm[0].accordion_log, calm[1].accordion_log);  // every rank decides alike
  EXPECT_EQ(calm[0].final_params, calm[1].final_params);
  EXPECT_LT(calm[0].comm_wire_bytes, plain[0].comm_wire_bytes);
}

// Every compressor, in the layouts it composes with, stays within its stated loss bound of
// the single-process run and keeps the replicas identical (verify checks both).
TEST(CompressedDataParallel, EveryCompressorStaysWithinItsBoundOfTheSingleProcessRun) {
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.dp=2", "parallel.compress=topk", "parallel.compress_ratio=0.01"},
      {"parallel.dp=2", "parallel.compress=topk", "parallel.compress_momentum=0.9", "parallel.zero=1"},
      {"parallel.dp=2", "parallel.compress=terngrad"},
      {"parallel.dp=3", "parallel.compress=powersgd", "train.batch=12"},
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_rank=1", "parallel.tp=2"},
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.pp=2", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=int8"},
      {"parallel.dp=2", "parallel.compress=bf16"},
      // The codecs on ZeRO-2/3's reduce-scatter (Note [Ring codecs]), within the same bounds.
      {"parallel.dp=2", "parallel.compress=int8", "parallel.zero=2", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=bf16", "parallel.zero=3"},
      {"parallel.dp=2", "parallel.compress=int8", "parallel.zero=3", "parallel.pp=2", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_adapt=accordion", "parallel.accordion_window=2"},
      {"parallel.dp=2", "parallel.compress=topk", "parallel.compress_ratio=0.05", "parallel.compress_adapt=accordion",
       "parallel.accordion_window=2"},
      // Note [Compressed ZeRO-2/3]: whole buckets reduced, then kept per piece.
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.zero=2", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=topk", "parallel.compress_ratio=0.01", "parallel.zero=3"},
      {"parallel.dp=2", "parallel.compress=terngrad", "parallel.zero=3", "parallel.pp=2", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_adapt=accordion", "parallel.accordion_window=2",
       "parallel.zero=3"},
      {"parallel.dp=2", "parallel.reduce=adasum", "parallel.zero=2"},
      {"parallel.dp=2", "parallel.reduce=adasum"},
      {"parallel.dp=4", "parallel.reduce=adasum", "parallel.zero=1"},
      {"parallel.dp=2", "parallel.reduce=adasum", "parallel.tp=2"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2"},
      {"parallel.dp=4", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=3"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2", "parallel.tp=2"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2", "parallel.pp=2",
       "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=topk_adam", "parallel.compress_ratio=0.01", "parallel.compress_warmup_steps=2"},
      {"parallel.dp=2", "parallel.compress=topk_adam", "parallel.compress_ratio=0.01", "parallel.compress_warmup_steps=2",
       "parallel.tp=2"},
      // Note [Compressed Adam with ZeRO]: the ranks' g / D compressed, the momentum sharded.
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2", "parallel.zero=1"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2", "parallel.zero=2",
       "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2", "parallel.zero=3"},
      {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2", "parallel.zero=3",
       "parallel.pp=2", "train.grad_accum=2"},
      {"parallel.dp=2", "parallel.compress=topk_adam", "parallel.compress_ratio=0.01", "parallel.compress_warmup_steps=2",
       "parallel.zero=1"},
      {"parallel.dp=2", "parallel.compress=topk_adam", "parallel.compress_ratio=0.01", "parallel.compress_warmup_steps=2",
       "parallel.zero=3", "parallel.tp=2"},
      // 0/1 Adam over 8 steps: variance steps 1, 2, 4 (exact), step 3 compressed, local steps
      // 5-8 synchronising after 5, 6 and 8 (the last).
      {"parallel.dp=2", "parallel.compress=zero_one_adam", "parallel.zero_one_var_freeze_steps=4",
       "parallel.zero_one_var_scaler=2", "parallel.zero_one_local_scaler=1", "parallel.zero_one_local_clip=4"},
      {"parallel.dp=2", "parallel.tp=2", "parallel.compress=zero_one_adam", "parallel.zero_one_var_freeze_steps=4",
       "parallel.zero_one_var_scaler=2", "parallel.zero_one_local_scaler=1", "parallel.zero_one_local_clip=4"},
  };
  const std::vector<VerifyRow> rows = verify_layouts(small_config({"train.steps=8"}), layouts);
  ASSERT_EQ(rows.size(), layouts.size());
  for (const VerifyRow& r : rows) {
    EXPECT_TRUE(r.ok) << r.layout << ": " << r.error << " loss rel " << r.max_loss_rel << " (bound "
                      << r.tolerance.loss_rel << ")";
    EXPECT_GT(r.max_loss_rel, 0.0) << r.layout << ": an approximation that matches exactly was not compressed";
  }
}

// Note [Compressed ZeRO-2/3]: a compressed step reduces whole buckets with ZeRO-1's
// arithmetic and keeps the pieces, so where ZeRO-2 has ZeRO-1's buckets (Llama: no tied
// embedding bucket of its own) it ends each step with ZeRO-1's bits: the same losses and
// weights, exactly. (ZeRO-3 reduces per-layer buckets, GPT's ZeRO-1 puts wte in a bucket of
// its own: other buckets, other compressed values; those are held to the bound above.)
TEST(CompressedDataParallel, ZeroTwoEqualsZeroOneBitForBit) {
  for (const std::vector<std::string>& mode : std::vector<std::vector<std::string>>{
           {"parallel.compress=powersgd"},
           {"parallel.compress=topk", "parallel.compress_ratio=0.05"},
           {"parallel.compress=terngrad"},
           {"parallel.reduce=adasum"}}) {
    auto run = [&](const char* zero) {
      std::vector<std::string> sets = mode;
      sets.insert(sets.end(), {zero, "train.grad_accum=2"});
      return testing_support::train_keeping_params(llama(sets))[0];
    };
    const TrainSummary z1 = run("parallel.zero=1"), z2 = run("parallel.zero=2");
    EXPECT_EQ(z2.losses, z1.losses) << mode[0];
    EXPECT_EQ(z2.final_params, z1.final_params) << mode[0];
    EXPECT_GT(z2.comm_wire_bytes, 0.0) << mode[0];
  }
}

// Note [Compressed Adam with ZeRO]: top-k Adam sending everything (ratio 1) reduces the exact
// mean of the ranks' g / D, so under ZeRO-1, 2 and 3 it is Adam with v frozen after the
// warm-up, as at ZeRO 0 (which sends the momentum u = m / D instead): the same run within
// the exact layouts' bounds (the two differ in rounding only: (g / D) D is not g); and
// ZeRO-2, reducing Llama's buckets as ZeRO-1 does, ends every step with ZeRO-1's bits.
TEST(CompressedDataParallel, CompressedAdamUnderZeroSendingEverythingIsZeroZerosRun) {
  auto run = [](std::vector<std::string> sets) {
    sets.insert(sets.end(), {"parallel.compress=topk_adam", "parallel.compress_ratio=1",
                             "parallel.compress_warmup_steps=2", "train.steps=8"});
    return testing_support::train_keeping_params(llama(sets))[0];
  };
  const TrainSummary z0 = run({});
  const TrainSummary z1 = run({"parallel.zero=1"});
  for (const char* zero : {"parallel.zero=1", "parallel.zero=2", "parallel.zero=3"}) {
    const TrainSummary z = std::string(zero) == "parallel.zero=1" ? z1 : run({zero});
    const VerifyRow row = compare_runs(zero, z0, z);
    EXPECT_TRUE(row.ok) << zero << ": loss rel " << row.max_loss_rel << ", weights " << row.max_weight_abs;
    EXPECT_GT(row.max_weight_abs, 0.0) << zero << ": not a different path";
    if (std::string(zero) == "parallel.zero=2") {
      EXPECT_EQ(z.losses, z1.losses);
      EXPECT_EQ(z.final_params, z1.final_params);
    }
  }
}

// The summary's wire bytes: PowerSGD rank 4 and top-k 1% move >= 20x fewer bytes than the
// exact all-reduce of the same buckets (GPT-2 small's 768-wide matrices: rank 4 is ~96x
// smaller; this model's 64-wide ones ~8x, so the ratio is checked on the formula's terms).
TEST(CompressedDataParallel, SummaryReportsTheBytesOnTheWire) {
  const auto exact = testing_support::train_as_threads(small_config({"parallel.dp=2", "train.steps=2"}));
  EXPECT_DOUBLE_EQ(exact[0].comm_wire_bytes, exact[0].comm_exact_wire_bytes);
  const auto topk = testing_support::train_as_threads(
      small_config({"parallel.dp=2", "train.steps=2", "parallel.compress=topk", "parallel.compress_ratio=0.01"}));
  EXPECT_DOUBLE_EQ(topk[0].comm_exact_wire_bytes, exact[0].comm_exact_wire_bytes);
  EXPECT_GT(topk[0].comm_exact_wire_bytes / topk[0].comm_wire_bytes, 40.0);  // 4 B x 1 vs 8 B x 1%
  const auto psgd = testing_support::train_as_threads(
      small_config({"parallel.dp=2", "train.steps=2", "parallel.compress=powersgd", "parallel.compress_rank=1"}));
  EXPECT_GT(psgd[0].comm_exact_wire_bytes / psgd[0].comm_wire_bytes, 5.0);
  // 1-bit Adam: the exact warm-up step, then signs and a scale per tensor chunk (about 32x
  // fewer bytes): the mean over the two steps is under half of exact's.
  const auto onebit = testing_support::train_as_threads(small_config(
      {"parallel.dp=2", "train.steps=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=1"}));
  EXPECT_LT(onebit[0].comm_wire_bytes, 0.55 * onebit[0].comm_exact_wire_bytes);
  EXPECT_GT(onebit[0].comm_wire_bytes, 0.5 * onebit[0].comm_exact_wire_bytes);
}

TEST(CompressedDataParallel, UnsupportedCombinationsAreRefusedNamingTheValidOnes) {
  struct Case {
    std::vector<std::string> sets;
    const char* says;  // a piece of the refusal's message
  };
  const std::string dp2 = "parallel.dp=2";
  const std::vector<Case> cases = {
      {{dp2, "parallel.zero=2", "parallel.compress=topk", "parallel.zeropp_qgz=true"}, "set only one"},
      {{dp2, "parallel.zero=3", "parallel.reduce=adasum", "parallel.zeropp_qgz=true"}, "set only one"},
      {{"parallel.compress=powersgd"}, "set parallel.dp >= 2"},
      {{dp2, "parallel.compress=terngrad", "train.precision=fp16"}, "train.precision = bf16"},
      {{dp2, "parallel.compress=int8", "comm.grad_dtype=bf16"}, "set only one"},
      {{dp2, "parallel.zero=2", "parallel.compress=int8", "parallel.zeropp_qgz=true"}, "set only one"},
      {{dp2, "parallel.compress=zip"}, "topk, terngrad, powersgd, onebit_adam, zero_one_adam or topk_adam"},
      {{dp2, "parallel.zero=1", "parallel.compress=zero_one_adam"}, "which ZeRO's sharded optimizer cannot"},
      {{dp2, "parallel.zero=2", "parallel.compress=zero_one_adam"}, "set parallel.zero = 0"},
      {{dp2, "parallel.compress=topk_adam", "parallel.compress_momentum=0.9"},
       "parallel.compress_momentum = 0.9 would add DGC's on top: set it to 0"},
      {{dp2, "parallel.compress=topk_adam", "parallel.compress_warmup_steps=0"},
       "parallel.compress = topk_adam freezes Adam's variance"},
      {{dp2, "parallel.compress=zero_one_adam", "parallel.compress_warmup_steps=5"}, "has no exact warm-up"},
      {{dp2, "parallel.compress=zero_one_adam", "parallel.zero_one_local_clip=0"},
       "parallel.zero_one_local_clip = 0: expected >= 1"},
      {{dp2, "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=0"},
       "or -1 for the larger of 15% of train.steps and optim.warmup_steps = 40"},
      {{dp2, "parallel.compress=topk", "parallel.compress_ratio=0"}, "(0, 1]"},
      {{"parallel.dp=3", "parallel.reduce=adasum"}, "power of two >= 2 (2, 4, 8, ...)"},
      {{dp2, "parallel.reduce=adasum", "parallel.compress=powersgd"}, "or parallel.reduce = mean"},
      {{dp2, "parallel.reduce=sum"}, "expected mean or adasum"},
      {{dp2, "parallel.compress=terngrad", "parallel.compress_adapt=accordion"}, "set powersgd or topk"},
      {{dp2, "parallel.compress=powersgd", "parallel.compress_adapt=accordion", "parallel.accordion_heavy_rank=8"},
       "must be in [1, parallel.compress_rank = 4]"},
  };
  for (const Case& c : cases) {
    const std::string message = testing_support::error_message([&] { small_config(c.sets); });
    EXPECT_NE(message.find(c.says), std::string::npos) << c.sets.back() << ": " << message;
  }
}

}  // namespace
}  // namespace loom
