// Sharded checkpoints (Note [Sharded checkpoints]): a run stopped at step 3 and resumed
// gives the uninterrupted run's losses and weights bit for bit, on several layouts; damage
// is refused with the file, tensor and byte range named.
#include <gtest/gtest.h>

#include <iostream>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <sstream>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/train/trainer.h"
#include "support/train_threads.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

Config small(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=256",
                                   "model.ctx=32", "train.batch=8", "train.steps=6", "train.val_batches=1",
                                   "train.val_every=0", "train.threads=1", "checkpoint.save_every=3",
                                   "checkpoint.dir=" + dir, "optim.warmup_steps=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

std::vector<TrainSummary> run(const Config& c, const std::string& resume = "") {
  return testing_support::train_keeping_params(c, resume);
}

TEST(Resume, BitIdenticalToTheUninterruptedRunOnEachLayout) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> layouts = {
      {"single", {}},
      {"dp2", {"parallel.dp=2"}},
      {"tp2 x pp2", {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}},
      {"zero3 dp2", {"parallel.dp=2", "parallel.zero=3"}},
      // bf16 keeps fp32 masters and moments in the checkpoint: resuming is bit-exact too.
      {"bf16 dp2 zero1", {"parallel.dp=2", "parallel.zero=1", "train.precision=bf16"}},
      // Note [bf16 optimizer moments]: the checkpoint holds the bf16 moments widened (exact),
      // and a resume stores them back exactly; the rounding bits follow the step count.
      {"bf16 moments dp2 zero2", {"parallel.dp=2", "parallel.zero=2", "optim.moments=bf16"}},
      {"bf16 moments and precision zero3 dp2", {"parallel.dp=2", "parallel.zero=3", "optim.moments=bf16",
                                                "train.precision=bf16"}},
      // fp16 with dynamic loss scaling from 2^23: the first steps overflow and back off, and
      // the checkpoint carries the scale and its count of clean steps (a resume that lost
      // them would start again at 2^23 and differ).
      {"fp16 dp2 dynamic", {"parallel.dp=2", "train.precision=fp16", "train.loss_scale_init=8388608",
                            "train.loss_scale_window=2"}},
      // Note [Compressor state in checkpoints]: residuals, DGC momentum and PowerSGD's Q
      // come back, so compressed runs resume bit for bit too (TernGrad keeps none).
      {"topk dp2", {"parallel.dp=2", "parallel.compress=topk", "parallel.compress_ratio=0.05",
                    "parallel.compress_momentum=0.9"}},
      {"powersgd dp2 zero1", {"parallel.dp=2", "parallel.zero=1", "parallel.compress=powersgd",
                              "parallel.compress_rank=2", "parallel.bucket_mb=0.05"}},
      {"terngrad dp2", {"parallel.dp=2", "parallel.compress=terngrad"}},
      // Accordion's window (2 steps, so the save at step 3 falls inside one) and setting.
      {"accordion dp2", {"parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_adapt=accordion",
                         "parallel.accordion_window=2", "parallel.accordion_eta=1e9"}},
      // 1-bit Adam compressing from step 3: the frozen variance and shared momentum are the
      // AdamW moments; the worker and server residuals are the compressor's state.
      {"onebit_adam dp2", {"parallel.dp=2", "parallel.compress=onebit_adam", "parallel.compress_warmup_steps=2"}},
      // Top-k Adam (Note [Top-k Adam]): the same, with the top-k residual as its state.
      {"topk_adam dp2", {"parallel.dp=2", "parallel.compress=topk_adam", "parallel.compress_ratio=0.05",
                         "parallel.compress_warmup_steps=2"}},
      // Note [Compressed Adam with ZeRO]: the momentum pieces, the whole residuals; D is
      // gathered again from the restored variance pieces.
      {"onebit_adam dp2 zero2", {"parallel.dp=2", "parallel.zero=2", "parallel.compress=onebit_adam",
                                 "parallel.compress_warmup_steps=2"}},
      {"topk_adam dp2 zero3", {"parallel.dp=2", "parallel.zero=3", "parallel.compress=topk_adam",
                               "parallel.compress_ratio=0.05", "parallel.compress_warmup_steps=2"}},
      // 0/1 Adam in local steps from step 3 (intervals 1, 2, 4): the save at 3 synchronises,
      // so the parameters, m, v and the residuals are all a resume needs.
      {"zero_one_adam dp2", {"parallel.dp=2", "parallel.compress=zero_one_adam", "parallel.zero_one_var_freeze_steps=2",
                             "parallel.zero_one_local_scaler=1", "parallel.zero_one_local_clip=4"}},
      // Note [PS checkpoints]: the servers' ranges of parameters and moments.
      {"ps 2 workers + 2 servers", {"parallel.dp=2", "parallel.ps_servers=2"}},
      // Note [Parameter server with model parallelism]: each tp x pp shard's servers; GPT's
      // tied wte saved by the first stage's servers only.
      // Note [Context-parallel chunks]: ZeRO-3's pieces over dp x cp.
      {"cp2 x dp2 zero3", {"parallel.cp=2", "parallel.dp=2", "parallel.zero=3"}},
      {"ps dp2 x pp2 + 1 server per shard", {"parallel.dp=2", "parallel.pp=2", "parallel.ps_servers=1"}},
      {"ps dp2 x tp2 sp + 2 servers per shard", {"parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "parallel.ps_servers=2"}}};
  for (const auto& [name, sets] : layouts) {
    const std::string a = testing::TempDir() + "/resume_a", b = testing::TempDir() + "/resume_b";
    fs::remove_all(a), fs::remove_all(b);
    const auto whole = run(small(a, sets));                                   // steps 1-6, saves at 3 and 6
    const auto resumed = run(small(b, sets), a + "/step-00000003");            // steps 4-6 from step 3
    ASSERT_EQ(whole[0].losses.size(), 6u) << name;
    ASSERT_EQ(resumed[0].losses.size(), 3u) << name;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[0].losses[size_t(i)], whole[0].losses[size_t(3 + i)]) << name;
    EXPECT_EQ(resumed[0].final_params, whole[0].final_params) << name;
    if (!whole[0].loss_scales.empty()) {
      EXPECT_EQ(resumed[0].loss_scales, std::vector<double>(whole[0].loss_scales.begin() + 3, whole[0].loss_scales.end()));
      EXPECT_FALSE(whole[0].skipped_steps.empty()) << name << ": the test needs an overflow before the save";
      std::cout << name << ": loss scales";
      for (double s : whole[0].loss_scales) std::cout << " " << s;
      std::cout << "\n";
    }
    // auto picks the newest complete step (6 = train.steps: nothing left to run).
    EXPECT_EQ(*resolve_step_dir(a), a + "/step-00000006") << name;
  }
}

// A checkpoint resumed under another compressor or layout starts the compressor state at
// zero and says so; a damaged state file is refused by name.
TEST(Resume, CompressorStateResetsWithAWarningElsewhereAndDamageIsNamed) {
  const std::string a = testing::TempDir() + "/resume_cmp_a", b = testing::TempDir() + "/resume_cmp_b";
  fs::remove_all(a), fs::remove_all(b);
  const std::vector<std::string> psgd = {"parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_rank=2"};
  run(small(a, psgd));
  ASSERT_TRUE(fs::exists(a + "/step-00000003/compress-00001.bin"));
  std::ostringstream out;
  TrainOptions o;
  o.out = o.err = &out, o.resume = a + "/step-00000003";
  testing_support::train_as_threads(small(b, {"parallel.dp=2", "parallel.compress=topk"}), o);
  EXPECT_NE(out.str().find("warning: gradient compressor state (error feedback, momentum, PowerSGD's Q) starts at "
                           "zero: this run's is 'topk"),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("the checkpoint's it was saved under 'powersgd"), std::string::npos) << out.str();
  {  // flip a byte of rank 1's PowerSGD state
    std::fstream f(a + "/step-00000003/compress-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  const std::string msg = [&] {
    std::ostringstream sink;
    TrainOptions bad;
    bad.out = bad.err = &sink, bad.resume = a + "/step-00000003";
    fs::remove_all(b);
    std::vector<TrainSummary> outs(2);
    comm::CommOptions copt;
    copt.timeout = std::chrono::milliseconds(20'000);
    const auto errors = comm::run_threads(2, copt, [&](comm::World& w) { train(small(b, psgd), bad, w); });
    return errors[0] + " | " + errors[1];
  }();
  EXPECT_NE(msg.find("compress-00001.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fails its CRC-32"), std::string::npos) << msg;
}

TEST(Resume, DamageIsRefusedNamingTheFileTensorSectionAndBytes) {
  const std::string a = testing::TempDir() + "/damage", b = testing::TempDir() + "/damage_b";
  fs::remove_all(a), fs::remove_all(b);
  run(small(a, {"parallel.dp=2"}));
  const std::string step = a + "/step-00000003";
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  o.resume = step;
  // One byte flipped near the end of rank 1's file (its v moments): refused by rank 1
  // (each rank reads its own file first) naming the file, the tensor, the section and
  // the byte range; the other rank stops at once too.
  const std::string file = step + "/rank-00001.bin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(file) - 100));
    f.put('\x7f');
  }
  const Config c = small(b, {"parallel.dp=2"});
  const auto errors = comm::run_threads(2, {}, [&](comm::World& w) { train(c, o, w); });
  EXPECT_NE(errors[1].find("rank-00001.bin' tensor "), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find(" section v (bytes "), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("fails its CRC-32"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1 could not load its part"), std::string::npos) << errors[0];
  // `loom ckpt inspect --verify` finds it too.
  try {
    describe_shards(step, true);
    FAIL() << "verify passed a damaged file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fails its CRC-32"), std::string::npos) << e.what();
  }
  // A truncated file: the tensor, section and bytes past the end are named.
  fs::resize_file(file, fs::file_size(file) / 2);
  const auto cut = comm::run_threads(2, {}, [&](comm::World& w) { train(c, o, w); });
  EXPECT_NE(cut[1].find("is past the end of the file: it is truncated"), std::string::npos) << cut[1];
  // Another model is refused naming what differs.
  try {
    train(small(b, {"model.d_model=32"}), o);
    FAIL() << "a checkpoint of another model was loaded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a different model"), std::string::npos) << e.what();
  }
}

TEST(Resume, KeepLastPrunesOlderStepsAndAutoStartsFreshWithoutOne) {
  const std::string a = testing::TempDir() + "/keep";
  fs::remove_all(a);
  Config c = small(a, {"checkpoint.save_every=1", "checkpoint.keep_last=2"});
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  o.resume = "auto";  // nothing there yet: starts at step 0
  EXPECT_EQ(train(c, o).losses.size(), 6u);
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(a))
    if (e.path().filename().string().rfind("step-", 0) == 0) steps.push_back(e.path().filename().string());
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<std::string>{"step-00000005", "step-00000006"}));
  // auto now finds step 6 = train.steps: nothing to run; with more steps it continues.
  c.train.steps = 8;
  EXPECT_EQ(train(c, o).losses.size(), 2u);
}

}  // namespace
}  // namespace loom
