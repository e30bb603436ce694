// Loss scaling (issue 14, Note [Dynamic loss scaling]): the scaler's state machine, the
// config it accepts, scaled runs equal to unscaled ones bit for bit, and overflow steps
// (real fp16 overflows and injected ones on a single rank) skipped on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/optim/loss_scale.h"
#include "loom/parallel/rank_plan.h"
#include "loom/train/trainer.h"
#include "support/train_threads.h"

namespace loom {
namespace {

TrainConfig dynamic(double init, int64_t window, double min) {
  TrainConfig t;
  t.loss_scale = "dynamic";
  t.loss_scale_init = init, t.loss_scale_window = window, t.loss_scale_min = min;
  return t;
}

TEST(LossScale, DynamicBacksOffOnOverflowAndGrowsAfterTheWindow) {
  LossScaler s(dynamic(8, 3, 1));
  ASSERT_EQ(s.mode(), LossScaler::Mode::kDynamic);
  // (finite?, applied?, scale after)
  const std::vector<std::tuple<bool, bool, double>> script = {
      {true, true, 8},  {true, true, 8},   {true, true, 16},  // three clean steps: x2
      {false, false, 8}, {false, false, 4},                   // overflows: x1/2 each, skipped
      {true, true, 4},  {true, true, 4},   {false, false, 2},  // an overflow restarts the count
      {true, true, 2},  {true, true, 2},   {true, true, 4},
      {false, false, 2}, {false, false, 1}};
  int64_t step = 0;
  for (const auto& [finite, applied, after] : script) {
    EXPECT_EQ(s.update(finite, step), applied) << "step " << step;
    EXPECT_EQ(s.scale(), after) << "step " << step;
    EXPECT_EQ(s.event().empty(), applied && !(step == 2 || step == 10)) << "step " << step << ": " << s.event();
    step++;
  }
  EXPECT_EQ(s.skipped(), 5);
  EXPECT_NE(s.event().find("step 13 skipped: gradient overflow at loss scale 2, scale now 1"), std::string::npos)
      << s.event();
  // At the floor an overflow is a divergence.
  try {
    s.update(false, 99);
    FAIL() << "an overflow at the floor went on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 100 even at the loss scale floor train.loss_scale_min = 1"),
              std::string::npos)
        << e.what();
  }
  // The checkpointed state comes back; a checkpoint without a scale keeps the initial one.
  LossScaler r(dynamic(8, 3, 1));
  r.restore({256, 2});
  EXPECT_EQ(r.scale(), 256);
  EXPECT_TRUE(r.update(true, 0));
  EXPECT_EQ(r.scale(), 512);  // the third clean step in a row
  LossScaler fresh(dynamic(8, 3, 1));
  fresh.restore({});
  EXPECT_EQ(fresh.scale(), 8);
}

TEST(LossScale, StaticSkipsWithoutMovingAndNoneCallsItDivergence) {
  TrainConfig t;
  t.loss_scale = "1024";
  LossScaler st(t);
  EXPECT_EQ(st.mode(), LossScaler::Mode::kStatic);
  EXPECT_FALSE(st.update(false, 0));
  EXPECT_EQ(st.scale(), 1024);
  EXPECT_TRUE(st.update(true, 1));
  EXPECT_EQ(st.scale(), 1024);
  t.loss_scale = "auto";  // fp32: none
  LossScaler none(t);
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.scale(), 1.0);
  EXPECT_THROW(none.update(false, 0), Error);
  t.precision = Precision::kFp16;  // auto is dynamic for fp16
  EXPECT_EQ(LossScaler(t).mode(), LossScaler::Mode::kDynamic);
  EXPECT_EQ(LossScaler(t).scale(), 65536);
}

// Issue 59 finding 4: a run whose every step overflows is a runaway. A static scale never
// moves, so it is stopped by the count of steps skipped in a row; an applied step resets it.
TEST(LossScale, EveryStepSkippedForAWindowIsADivergence) {
  TrainConfig t;
  t.loss_scale = "1024";
  LossScaler st(t);
  int64_t step = 0;
  for (int i = 0; i + 1 < LossScaler::kMaxSkippedInARow; ++i) EXPECT_FALSE(st.update(false, step++));
  EXPECT_TRUE(st.update(true, step++));  // one applied step: the count starts again
  for (int i = 0; i + 1 < LossScaler::kMaxSkippedInARow; ++i) EXPECT_FALSE(st.update(false, step++));
  try {
    st.update(false, step);
    FAIL() << "the " << LossScaler::kMaxSkippedInARow << "th skip in a row went on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged: 32 steps in a row up to step 64 overflowed"),
              std::string::npos) << e.what();
  }
  // A dynamic scale from 2^40 with floor 1: the count stops it before its floor does.
  LossScaler dy(dynamic(1099511627776.0, 2000, 1));
  for (int i = 0; i + 1 < LossScaler::kMaxSkippedInARow; ++i) EXPECT_FALSE(dy.update(false, i));
  EXPECT_THROW(dy.update(false, 31), Error);
}

TEST(LossScale, ConfigRefusesScalesThatAreNotPowersOfTwo) {
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {"train.loss_scale=1000", "train.loss_scale = 1000: expected a power of two"},
           {"train.loss_scale=big", "train.loss_scale = 'big': expected auto, dynamic, none or a number"},
           {"train.loss_scale_init=3", "train.loss_scale_init = 3.0: expected a power of two"},
           {"train.loss_scale_min=0", "train.loss_scale_min = 0.0: expected a power of two"},
           {"train.loss_scale_window=0", "train.loss_scale_window = 0: expected >= 1"},
           {"train.loss_scale_min=1024", "train.loss_scale_init = 65536.0 is below"},
           {"train.precision=fp8", "train.precision = 'fp8': expected fp32, bf16 or fp16"}}) {
    try {
      load_config("", {set, set == "train.loss_scale_min=1024" ? "train.loss_scale_init=512" : "train.seed=1"});
      FAIL() << "accepted " << set;
    } catch (const ConfigError& e) {
      const std::string w = set == "train.loss_scale_min=1024" ? "train.loss_scale_init = 512.0 is below" : want;
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(load_config("", {"train.loss_scale=0.5", "train.precision=fp16"}));
}

Config small(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=128",
                                   "model.ctx=32", "train.batch=8", "train.steps=6", "train.val_batches=1",
                                   "train.val_every=0", "train.threads=1", "checkpoint.dir="};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// S is a power of two, so every gradient, partial sum and norm of the scaled run is S
// times the unscaled one exactly, and dividing by S restores the same bits (fp32 and
// bf16: no value comes near the edges of their range here). Growth every 2 steps takes
// S from 2^16 to 2^18 within the run.
TEST(LossScale, ScaledRunsEqualTheUnscaledRunBitForBit) {
  for (const auto& layout : std::vector<std::vector<std::string>>{
           {"train.precision=fp32"},
           {"train.precision=bf16", "parallel.dp=2", "parallel.zero=2", "train.grad_accum=2"},
           {"train.precision=bf16", "parallel.pp=2", "train.grad_accum=2"},
           {"train.precision=fp32", "parallel.tp=2", "parallel.sp=true", "optim.grad_clip=0.05"}}) {
    std::vector<std::string> scaled = layout, plain = layout;
    scaled.insert(scaled.end(), {"train.loss_scale=dynamic", "train.loss_scale_window=2"});
    plain.push_back("train.loss_scale=none");
    const TrainSummary a = testing_support::train_keeping_params(small(scaled))[0];
    const TrainSummary b = testing_support::train_keeping_params(small(plain))[0];
    EXPECT_EQ(a.losses, b.losses) << layout[0] << " " << layout.back();
    EXPECT_EQ(a.final_params, b.final_params) << layout[0] << " " << layout.back();
    EXPECT_EQ(a.loss_scales, (std::vector<double>{65536, 65536, 131072, 131072, 262144, 262144})) << layout.back();
    EXPECT_TRUE(a.skipped_steps.empty() && b.loss_scales.empty());
  }
}

int64_t optimizer_steps_saved(const std::string& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "/step-%08d/manifest.json", step);
  std::ifstream f(dir + name);
  return nlohmann::json::parse(f).at("optimizer_steps").get<int64_t>();
}

// Checks the scale sequence follows Note [Dynamic loss scaling] given which steps skipped.
void expect_scale_rule(const TrainSummary& s, int64_t window, const std::string& at) {
  int64_t clean = 0;
  for (size_t i = 0; i + 1 < s.loss_scales.size(); i++) {
    const bool skipped = std::count(s.skipped_steps.begin(), s.skipped_steps.end(), int64_t(i) + 1) > 0;
    clean = skipped ? 0 : clean + 1;
    double want = s.loss_scales[i];
    if (skipped) want /= 2;
    if (clean == window) want *= 2, clean = 0;
    EXPECT_EQ(s.loss_scales[i + 1], want) << at << " after step " << i + 1;
  }
}

// train.precision = fp16 from a scale of 2^24: the fp16-rounded upstream gradients
// overflow until the scale has backed off far enough, on every rank at once (the ranks
// hold different data and layers; the global norm brings the overflow to all of them).
// Skipped steps leave the optimizer's step count alone.
TEST(LossScale, Fp16OverflowsAreSkippedOnEveryRankAndTheScaleBacksOff) {
  for (const auto& layout : std::vector<std::vector<std::string>>{{"parallel.dp=2", "parallel.zero=1"},
                                                                   {"parallel.pp=2", "train.grad_accum=2"}}) {
    const std::string dir = testing::TempDir() + "/fp16_overflow";
    std::filesystem::remove_all(dir);
    std::vector<std::string> sets = {"train.precision=fp16", "train.loss_scale_init=16777216",
                                     "train.loss_scale_window=3", "checkpoint.dir=" + dir, "train.steps=16"};
    sets.insert(sets.end(), layout.begin(), layout.end());
    const std::vector<TrainSummary> ranks = testing_support::train_as_threads(small(sets));
    const TrainSummary& r0 = ranks[0];
    ASSERT_EQ(r0.loss_scales.size(), 16u) << layout[0];
    EXPECT_GE(r0.skipped_steps.size(), 2u) << layout[0] << ": 2^24 must overflow fp16";
    EXPECT_LE(r0.skipped_steps.size(), 10u) << layout[0] << ": the scale must come down to one that fits";
    EXPECT_EQ(r0.skipped_steps[0], 1) << layout[0];
    for (const TrainSummary& r : ranks) {
      EXPECT_EQ(r.skipped_steps, r0.skipped_steps) << layout[0];
      EXPECT_EQ(r.loss_scales, r0.loss_scales) << layout[0];
    }
    expect_scale_rule(r0, 3, layout[0]);
    EXPECT_EQ(optimizer_steps_saved(dir, 16), 16 - int64_t(r0.skipped_steps.size())) << layout[0];
    EXPECT_LT(r0.losses.back(), r0.losses.front()) << layout[0] << ": the applied steps must train";
    std::cout << layout[0] << ": skipped";
    for (int64_t s : r0.skipped_steps) std::cout << " " << s;
    std::cout << "; scales";
    for (double s : r0.loss_scales) std::cout << " " << s;
    std::cout << "\n";
  }
}

// An overflow injected into one rank's gradients (a NaN on that rank only) is skipped by
// every rank of every layout: the data-parallel peer, the other pipeline stage, the other
// tensor-parallel slice.
TEST(LossScale, AnOverflowOnOneRankIsSkippedByAll) {
  for (const auto& layout : std::vector<std::vector<std::string>>{{"parallel.dp=2", "parallel.zero=2"},
                                                                   {"parallel.pp=2", "train.grad_accum=2"},
                                                                   {"parallel.tp=2"}}) {
    const std::string dir = testing::TempDir() + "/injected_overflow";
    std::filesystem::remove_all(dir);
    std::vector<std::string> sets = {"train.loss_scale=dynamic", "train.loss_scale_window=100", "checkpoint.dir=" + dir};
    sets.insert(sets.end(), layout.begin(), layout.end());
    const Config c = small(sets);
    TrainOptions o;
    std::ostringstream sink;
    o.out = o.err = &sink;
    std::vector<TrainSummary> out(2);
    // Rank 1's own gradients (what its optimizer updates; under ZeRO-2 the rest of its
    // buffer was released to zero after the reduce-scatter, as a real overflow would leave it).
    const std::vector<FlatRange> own = plan_rank(c, 1).moment_ranges;
    const auto errors = comm::run_threads(2, {}, [&](comm::World& w) {
      TrainOptions mine = o;
      if (w.global_rank() == 1)
        mine.after_gradients = [&own](int64_t step, std::vector<float>& g) {
          if (step != 1 && step != 4) return;
          for (const FlatRange& r : own)
            std::fill(g.begin() + r.offset, g.begin() + r.offset + r.count, std::numeric_limits<float>::quiet_NaN());
        };
      out[size_t(w.global_rank())] = train(c, mine, w);
    });
    EXPECT_EQ(errors, std::vector<std::string>(2)) << layout[0];
    for (const TrainSummary& r : out) {
      EXPECT_EQ(r.skipped_steps, (std::vector<int64_t>{2, 5})) << layout[0];
      EXPECT_EQ(r.loss_scales, (std::vector<double>{65536, 65536, 32768, 32768, 32768, 16384})) << layout[0];
    }
    EXPECT_EQ(optimizer_steps_saved(dir, 6), 4) << layout[0];
    EXPECT_NE(sink.str().find("step 2 skipped: gradient overflow at loss scale 65536, scale now 32768"),
              std::string::npos)
        << sink.str();
  }
}

}  // namespace
}  // namespace loom
