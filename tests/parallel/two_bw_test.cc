// PipeDream-2BW (Note [PipeDream-2BW] in parallel/schedule.h): the flush-free pipeline
// against its single-process reference with one-step-delayed updates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/train/verify.h"
#include "support/error_message.h"
#include "support/temp_dir.h"
#include "support/train_threads.h"

namespace loom {
namespace {

Config base(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ffn=128",
                                   "model.ctx=32", "train.steps=5", "train.val_batches=1", "train.val_every=0",
                                   "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60",
                                   "optim.warmup_steps=2", "optim.grad_clip=0.5"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// The reference (TrainOptions::two_bw_reference): the same layout with flushing 1F1B steps
// (the same gradient-norm grouping, so clipping agrees to the bit), or `single`: one
// process, schedule 2bw at pp = 1 (clipping off: its norm sums in another grouping).
TrainSummary reference(std::vector<std::string> sets, bool single = false) {
  sets.push_back(single ? "parallel.schedule=2bw" : "parallel.schedule=1f1b");
  Config c = base(sets);
  if (single) c.parallel.pp = c.parallel.tp = 1, c.parallel.sp = false, c.optim.grad_clip = 0;
  TrainOptions o;
  o.keep_params = true;
  o.two_bw_reference = true;
  return testing_support::train_as_threads(c, o)[0];
}

int64_t peak(const TrainSummary& s, const std::string& category) {
  for (const auto& [name, bytes] : s.memory_peak_bytes)
    if (name == category) return bytes;
  return -1;
}

// Every rank of the 2bw pipeline `layout` reports the reference's losses and whole-model
// final weights, bit for bit (with `bound`: losses within bound x 0.1 relative, weights within
// bound absolute); returns the pipeline's summaries.
std::vector<TrainSummary> expect_equal_to_reference(const std::vector<std::string>& layout, bool single = false,
                                                    double bound = 0) {
  std::vector<std::string> sets = layout;
  sets.push_back("parallel.schedule=2bw");
  if (single) sets.push_back("optim.grad_clip=0");
  const std::vector<TrainSummary> got = testing_support::train_keeping_params(base(sets));
  const TrainSummary want = reference(layout, single);
  std::string at;
  for (const std::string& s : layout) at += s + " ";
  for (size_t r = 0; r < got.size(); r++) {
    if (bound == 0) EXPECT_EQ(got[r].losses, want.losses) << at << "rank " << r;
    for (size_t i = 0; bound > 0 && i < want.losses.size() && i < got[r].losses.size(); i++)
      EXPECT_NEAR(got[r].losses[i], want.losses[i], 0.1 * bound * std::abs(want.losses[i])) << at << "step " << i;
    EXPECT_EQ(got[r].final_params.size(), want.final_params.size()) << at;
    if (got[r].final_params.size() != want.final_params.size()) continue;
    size_t differ = 0;
    double worst = 0;
    for (size_t i = 0; i < want.final_params.size(); i++) {
      differ += got[r].final_params[i] != want.final_params[i];
      worst = std::max(worst, double(std::abs(got[r].final_params[i] - want.final_params[i])));
    }
    if (bound == 0) EXPECT_EQ(differ, 0u) << at << "rank " << r << ": weights differing from the delayed-update reference";
    else EXPECT_LE(worst, bound) << at << "rank " << r << ": " << differ << " weights differ";
  }
  return got;
}

// Pipeline depths 2-4 with m in {p, 2p}, GPT and Llama, recompute, tp: the flush-free
// pipeline applies W(t+1) = AdamW(W(t), g(W(t-1))) exactly as the reference does (clipping
// active: grad_clip 0.5), and as the single-process reference without clipping. Each stage
// holds two weight versions and one pending gradient.
TEST(TwoBw, EqualsTheDelayedUpdateReferenceBitForBit) {
  const std::vector<std::string> llama = {"model.preset=llama", "model.layers=4", "model.d_model=64", "model.heads=4",
                                          "model.kv_heads=2", "model.ffn=96"};
  for (int pp = 2; pp <= 4; pp++)
    for (int m : {pp, 2 * pp}) {
      const std::vector<std::string> layout = {"parallel.pp=" + std::to_string(pp), "train.grad_accum=" + std::to_string(m),
                                               "train.batch=" + std::to_string(m)};
      const std::vector<TrainSummary> got = expect_equal_to_reference(layout);
      if (m == pp) {  // one process: Llama (GPT's two tied wte copies sum their gradients in another order)
        std::vector<std::string> untied = layout;
        untied.insert(untied.end(), llama.begin(), llama.end());
        expect_equal_to_reference(untied, true);
      }
      const std::vector<TrainSummary> flushing = testing_support::train_keeping_params(
          base({"parallel.pp=" + std::to_string(pp), "train.grad_accum=" + std::to_string(m),
                "train.batch=" + std::to_string(m), "parallel.schedule=1f1b"}));
      for (size_t r = 0; r < got.size(); r++) {  // Note [Early stash]: no stash on the last stage
        const int64_t versions = r + 1 < got.size() ? 2 : 1;
        EXPECT_EQ(peak(got[r], "params"), versions * peak(flushing[r], "params")) << "pp " << pp << " rank " << r;
        EXPECT_EQ(peak(got[r], "grads"), 2 * peak(flushing[r], "grads")) << "pp " << pp << " rank " << r;
        EXPECT_EQ(peak(got[r], "activations"), peak(flushing[r], "activations")) << "pp " << pp << " rank " << r;
      }
      // Not a renamed 1F1B: the delayed gradient changes the run from step 2 on.
      EXPECT_EQ(got[0].losses[0], flushing[0].losses[0]);
      EXPECT_NE(got[0].losses[2], flushing[0].losses[2]);
    }
  for (std::vector<std::string> layout : std::vector<std::vector<std::string>>{
           {"parallel.pp=2", "train.grad_accum=3", "train.batch=6", "parallel.recompute=full"},
           {"parallel.pp=2", "parallel.tp=2", "train.grad_accum=2", "train.batch=2"},
           {"parallel.pp=3", "train.grad_accum=4", "train.batch=4", "parallel.recompute=selective"}}) {
    expect_equal_to_reference(layout);
    layout.insert(layout.end(), llama.begin(), llama.end());
    expect_equal_to_reference(layout);
  }
}

// Note [Streams with data parallelism]: dp replicas of a 2bw pipeline all-reduce each
// update's gradient (the pending one as it completes, a flush's own at the step's end) and
// apply the same delayed updates as the flushing dp layout's reference, bit for bit (two
// replicas: a + b is one rounding in any order), GPT (tied wte across the ends) and Llama.
TEST(TwoBw, DataParallelReplicasEqualTheDelayedUpdateReference) {
  const std::vector<std::string> llama = {"model.preset=llama", "model.layers=4", "model.d_model=64", "model.heads=4",
                                          "model.kv_heads=2", "model.ffn=96"};
  std::vector<std::string> layout = {"parallel.pp=2", "parallel.dp=2", "train.grad_accum=2", "train.batch=4",
                                     "train.val_every=3"};
  const std::vector<TrainSummary> got = expect_equal_to_reference(layout);
  ASSERT_EQ(got.size(), 4u);
  const std::vector<TrainSummary> flushing =
      testing_support::train_keeping_params(base({"parallel.pp=2", "parallel.dp=2", "train.grad_accum=2",
                                                  "train.batch=4", "train.val_every=3", "parallel.schedule=1f1b"}));
  EXPECT_EQ(got[0].losses[0], flushing[0].losses[0]);
  EXPECT_NE(got[0].losses[2], flushing[0].losses[2]);  // delayed: not the flushing run
  layout.insert(layout.end(), llama.begin(), llama.end());
  expect_equal_to_reference(layout);
  expect_equal_to_reference({"parallel.pp=3", "parallel.dp=2", "train.grad_accum=3", "train.batch=6",
                             "parallel.sync_warmup_steps=2"});
}

// Context parallelism inside each stage (issue 53): the stage's cp ranks apply the delayed
// updates of their dp x cp-reduced gradients exactly as the same layout's reference, GPT and
// Llama, allgather and ring, with dp 2.
TEST(TwoBw, ContextParallelStagesEqualTheDelayedUpdateReference) {
  const std::vector<std::string> llama = {"model.preset=llama", "model.layers=4", "model.d_model=64", "model.heads=4",
                                          "model.kv_heads=2", "model.ffn=96"};
  std::vector<std::string> layout = {"parallel.pp=2", "parallel.cp=2", "train.grad_accum=2", "train.batch=2"};
  EXPECT_EQ(expect_equal_to_reference(layout).size(), 4u);
  layout.insert(layout.end(), llama.begin(), llama.end());
  expect_equal_to_reference(layout);
  expect_equal_to_reference({"parallel.pp=2", "parallel.cp=2", "parallel.cp_mode=ring", "parallel.dp=2",
                             "train.grad_accum=2", "train.batch=4"});
}

// Note [Vocabulary passes in a stream]: with the head, the loss and the embedding split over the
// pipeline's ranks (parallel.pp_vocab), the stream applies the delayed updates exactly as the
// same layout's flushing reference, the step's trailing embedding gradients carried into the
// previous step's pending gradient: pp 2-4, GPT (one tied table) and Llama, with tp 2, dp 2,
// cp 2, a validation flush and synchronous warm-up steps (streams of one step).
TEST(TwoBw, VocabularyPassesEqualTheDelayedUpdateReference) {
  const std::vector<std::string> llama = {"model.preset=llama", "model.layers=4", "model.d_model=64", "model.heads=4",
                                          "model.kv_heads=2", "model.ffn=96"};
  for (std::vector<std::string> layout : std::vector<std::vector<std::string>>{
           {"parallel.pp=2", "train.grad_accum=2", "train.batch=2"},
           {"parallel.pp=2", "train.grad_accum=4", "train.batch=4", "train.val_every=3"},
           {"parallel.pp=3", "train.grad_accum=4", "train.batch=4"},
           {"parallel.pp=2", "parallel.tp=2", "train.grad_accum=2", "train.batch=2"},
           {"parallel.pp=2", "parallel.dp=2", "train.grad_accum=2", "train.batch=4"},
           {"parallel.pp=2", "parallel.cp=2", "train.grad_accum=2", "train.batch=2"},
           {"parallel.pp=3", "train.grad_accum=3", "train.batch=3", "parallel.sync_warmup_steps=2"}}) {
    layout.push_back("parallel.pp_vocab=true");
    expect_equal_to_reference(layout);
    layout.insert(layout.end(), llama.begin(), llama.end());
    expect_equal_to_reference(layout);
  }
  // At pp 4 the stream adds micro-batch m - 1's head to the tied table before micro-batch
  // m - 3's embedding gradient (the first stage's B(m - 3) trails into the next step) where
  // 1F1B adds them the other way round: the same sums in another order, within loom verify's
  // weight bound (measured at m 4: at most 1.2e-7 apart). Llama's head and embedding are two tensors,
  // each summed in micro-batch order: bit for bit.
  for (int m : {4, 8}) {
    const std::vector<std::string> four = {"parallel.pp=4", "train.grad_accum=" + std::to_string(m),
                                           "train.batch=" + std::to_string(m), "parallel.pp_vocab=true"};
    expect_equal_to_reference(four, false, 1e-4);
    std::vector<std::string> untied = four;
    untied.insert(untied.end(), llama.begin(), llama.end());
    expect_equal_to_reference(untied);
  }
}

// Validation and checkpoints flush the stream: the reference flushes at the same steps, a
// resume from a mid-run checkpoint continues the run bit for bit, and pp = 1 is plain
// training (nothing in flight to delay).
TEST(TwoBw, FlushesAtCheckpointsAndResumesBitForBit) {
  testing_support::TempDir dir("loom-2bw");
  for (const std::string vocab : {"false", "true"}) {  // and with the vocabulary split
    const std::vector<std::string> layout = {"parallel.pp=2", "train.grad_accum=2", "train.batch=4",
                                             "train.val_every=2", "train.steps=6", "parallel.pp_vocab=" + vocab};
    expect_equal_to_reference(layout);
    std::vector<std::string> saving = layout;
    saving.push_back("parallel.schedule=2bw");
    saving.push_back("checkpoint.save_every=3");
    saving.push_back("checkpoint.dir=" + (dir / ("whole-" + vocab)));
    const std::vector<TrainSummary> whole = testing_support::train_keeping_params(base(saving));
    saving.back() = "checkpoint.dir=" + (dir / ("resumed-" + vocab));
    const std::vector<TrainSummary> resumed =
        testing_support::train_keeping_params(base(saving), dir / ("whole-" + vocab) + "/step-00000003");
    ASSERT_EQ(resumed[0].losses.size(), 3u) << vocab;
    EXPECT_EQ(resumed[0].losses, std::vector<float>(whole[0].losses.begin() + 3, whole[0].losses.end())) << vocab;
    EXPECT_EQ(resumed[0].final_params, whole[0].final_params) << vocab;
  }
  const std::vector<TrainSummary> one = testing_support::train_keeping_params(base({"parallel.schedule=2bw"}));
  const std::vector<TrainSummary> plain = testing_support::train_keeping_params(base({}));
  EXPECT_EQ(one[0].losses, plain[0].losses);
  EXPECT_EQ(one[0].final_params, plain[0].final_params);
}

// The trace of 4 steps of `schedule` at pp 2 (2 micro-batches), validating every `val_every`.
nlohmann::json traced_run(const std::string& schedule, int val_every) {
  testing_support::TempDir dir("loom-2bw-trace-" + schedule);
  TrainOptions o;
  o.trace_path = dir / "trace.json";
  testing_support::train_as_threads(base({"parallel.pp=2", "train.grad_accum=2", "train.batch=4", "train.steps=4",
                                          "train.val_every=" + std::to_string(val_every), "parallel.schedule=" + schedule}),
                                    o);
  std::ifstream f(o.trace_path);
  return nlohmann::json::parse(f);
}

// Note [Trace schema]: the trace marks the steps a stream flushes (here the validation at
// step 2 and the last, step 4) with args {"flush": 1} on every rank, and only those; a
// flushing schedule's steps are not marked (every one of them flushes).
TEST(TwoBw, TraceMarksTheFlushingSteps) {
  for (const std::string schedule : {"2bw", "1f1b"}) {
    const nlohmann::json j = traced_run(schedule, 2);
    std::map<int, std::vector<std::string>> marked;  // rank -> its marked steps
    int steps = 0;
    for (const auto& e : j.at("traceEvents")) {
      if (e.value("cat", "") != "step") continue;
      ++steps;
      if (e.contains("args") && e["args"].value("flush", 0) == 1) marked[e.at("pid").get<int>()].push_back(e["name"]);
    }
    EXPECT_EQ(steps, 2 * 4) << schedule;
    if (schedule == "1f1b") {
      EXPECT_TRUE(marked.empty());
    }
    for (int r = 0; r < 2 && schedule == "2bw"; r++)
      EXPECT_EQ(marked[r], (std::vector<std::string>{"step 2", "step 4"})) << r;
  }
}

// Note [Measured bubble]: a pipeline stage traces its update rule's work inside the stream
// (the gradient's move, its squares, the stash copy, AdamW) as "U" spans of category
// "update" in every step that does not flush, never inside a pipeline step; 1F1B's update
// after its drain carries none.
TEST(TwoBw, TraceMarksTheUpdateWorkInsideTheStream) {
  for (const std::string schedule : {"2bw", "1f1b"}) {
    const nlohmann::json j = traced_run(schedule, 0);
    struct Span {
      double a, b;
      bool flush;
    };
    std::map<int, std::vector<Span>> steps, updates, pipeline;  // rank -> spans
    for (const auto& e : j.at("traceEvents")) {
      if (e.value("ph", "") != "X") continue;
      const double a = e.value("ts", 0.0), b = a + e.value("dur", 0.0);
      const int pid = e.at("pid").get<int>();
      const std::string cat = e.value("cat", "");
      const bool flush = e.contains("args") && e["args"].is_object() && e["args"].value("flush", 0) == 1;
      if (cat == "step") steps[pid].push_back({a, b, flush});
      if (cat == "update") updates[pid].push_back({a, b, false});
      if (cat == "pipeline") pipeline[pid].push_back({a, b, false});
    }
    for (int r = 0; r < 2; r++) {
      if (schedule == "1f1b") {
        EXPECT_TRUE(updates[r].empty()) << r;
        continue;
      }
      ASSERT_EQ(steps[r].size(), 4u) << r;
      for (const Span& st : steps[r]) {
        int inside = 0;
        for (const Span& u : updates[r]) inside += u.a >= st.a && u.b <= st.b;
        if (!st.flush) EXPECT_GE(inside, 1) << "rank " << r << " step at " << st.a;
      }
      for (const Span& u : updates[r])
        for (const Span& p : pipeline[r]) EXPECT_TRUE(u.b <= p.a || u.a >= p.b) << "rank " << r;
    }
  }
}

// Note [2BW's update in the waits]: a first stage that only embeds spends most of each step
// waiting for the last stage's gradients; it writes the pending update into the stash there,
// piece by piece ("U wait" spans), so in steady steps some of them come before its step's
// last backward. The run still equals the delayed-update reference bit for bit. Llama: its
// norm's sum starts as soon as each stage's pending gradient is complete (no tied sum first),
// and eight steady-ish steps give the sum many waits to arrive in.
TEST(TwoBw, AStageThatWaitsUpdatesInItsWaits) {
  const std::vector<std::string> layout = {"model.preset=llama",   "model.layers=4",        "model.d_model=64",
                                           "model.heads=4",        "model.kv_heads=2",      "model.ffn=96",
                                           "parallel.pp=2",        "parallel.pp_layers=0,4", "train.grad_accum=8",
                                           "train.batch=8",        "train.steps=8"};
  testing_support::TempDir dir("loom-2bw-waits");
  TrainOptions o;
  o.trace_path = dir / "trace.json";
  o.keep_params = true;
  std::vector<std::string> sets = layout;
  sets.push_back("parallel.schedule=2bw");
  const std::vector<TrainSummary> got = testing_support::train_as_threads(base(sets), o);
  const TrainSummary want = reference(layout);
  ASSERT_EQ(got.size(), 2u);
  for (const TrainSummary& r : got) {
    EXPECT_EQ(r.losses, want.losses);
    EXPECT_TRUE(r.final_params == want.final_params) << "weights differ from the delayed-update reference";
  }
  std::ifstream f(o.trace_path);
  const nlohmann::json j = nlohmann::json::parse(f);
  struct Step {
    double a, b;
  };
  std::vector<Step> steps;  // rank 0's steps that do not flush
  std::vector<std::pair<double, double>> updates, backwards;
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.at("pid").get<int>() != 0) continue;
    const double a = e.value("ts", 0.0), b = a + e.value("dur", 0.0);
    const std::string cat = e.value("cat", ""), name = e.value("name", "");
    const bool flush = e.contains("args") && e["args"].is_object() && e["args"].value("flush", 0) == 1;
    if (cat == "step" && !flush) steps.push_back({a, b});
    if (cat == "update" && name == "U wait") updates.push_back({a, b});
    if (cat == "pipeline" && name[0] == 'B') backwards.push_back({a, b});
  }
  ASSERT_GE(steps.size(), 6u);
  int early = 0;  // steps with pieces of the update before their last backward
  for (const Step& st : steps) {
    double last_b = -1;
    for (auto [a, b] : backwards)
      if (a >= st.a && b <= st.b) last_b = std::max(last_b, a);
    bool before = false;
    for (auto [a, b] : updates) before = before || (a >= st.a && b <= last_b);
    early += before;
  }
  EXPECT_GE(early, 1) << "of " << steps.size() << " steps";
}

// Note [Verify references]: loom verify holds 2bw to the single process with the same delayed
// updates and pipedream to its flushing reference, within the exact bounds, and names the
// reference; against the plain single-process run 2bw would differ by the delay. A 2bw run on
// another seed is still a mismatch.
TEST(TwoBw, VerifyHoldsStreamsToTheirOwnReferences) {
  const Config single = base({"train.batch=4", "train.grad_accum=2"});
  const std::vector<VerifyRow> rows =
      verify_layouts(single, {{"parallel.pp=2", "parallel.schedule=2bw"},
                              {"parallel.pp=2", "parallel.schedule=pipedream", "train.grad_accum=1", "optim.grad_clip=0"},
                              {"parallel.pp=2", "parallel.schedule=2bw", "train.seed=7"},
                              {"parallel.pp=2"}});
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i : {0u, 1u, 3u}) EXPECT_TRUE(rows[i].ok) << rows[i].layout << ": " << rows[i].error << " loss rel " << rows[i].max_loss_rel;
  EXPECT_EQ(rows[0].reference, "single process, one-step-delayed updates");
  EXPECT_EQ(rows[1].reference, "the layout's flushing pipedream reference");
  EXPECT_EQ(rows[3].reference, "single process");
  EXPECT_FALSE(rows[2].ok);
  EXPECT_GT(rows[2].max_loss_rel, 1e-4);
  // The plain single-process run is not 2bw's reference: the delay alone is far outside the bound.
  const TrainSummary plain = testing_support::train_keeping_params(single)[0];
  const TrainSummary two = testing_support::train_keeping_params(base({"train.batch=4", "train.grad_accum=2", "parallel.pp=2",
                                                                       "parallel.schedule=2bw"}))[0];
  EXPECT_FALSE(compare_runs("2bw", plain, two).ok);
}

TEST(TwoBw, RefusesWhatItDoesNotRun) {
  auto error = [](std::vector<std::string> sets) {
    sets.push_back("parallel.schedule=2bw");
    return testing_support::error_message([&] { base(sets); });
  };
  EXPECT_NE(error({"parallel.pp=4", "train.grad_accum=3", "train.batch=3"}).find("set train.grad_accum >= 4"),
            std::string::npos);
  EXPECT_NE(error({"parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "train.grad_accum=2", "train.batch=4"})
                .find("so nothing is sharded; set parallel.zero = 0"),
            std::string::npos);
  EXPECT_NE(error({"parallel.pp=2", "parallel.dp=2", "parallel.compress=int8", "train.grad_accum=2", "train.batch=4"})
                .find("all-reduces each update's gradient exactly"),
            std::string::npos);
  EXPECT_NE(error({"parallel.pp=2", "train.grad_accum=2", "train.precision=fp16"}).find("use fp32 or bf16"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
