// PipeDream weight stashing and PipeMare (Note [PipeDream weight stashing], Note [PipeMare]
// in modes/stream/async_pipe.h): the flush-free pipelines against their reference, the versions each
// forward and backward compute on, memory, flushes, resume and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"
#include "support/error_message.h"
#include "support/temp_dir.h"
#include "support/train_threads.h"

namespace loom {
namespace {

Config base(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ffn=128",
                                   "model.ctx=32", "train.steps=7", "train.batch=2", "train.grad_accum=1",
                                   "train.val_batches=1", "train.val_every=0", "train.threads=1", "checkpoint.dir=",
                                   "comm.timeout_s=60", "optim.warmup_steps=2", "optim.grad_clip=0"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

const std::vector<std::string> kLlama = {"model.preset=llama", "model.layers=4", "model.d_model=64", "model.heads=4",
                                         "model.kv_heads=2", "model.ffn=96"};

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + " ";
  return out;
}

int64_t peak(const TrainSummary& s, const std::string& category) {
  for (const auto& [name, bytes] : s.memory_peak_bytes)
    if (name == category) return bytes;
  return -1;
}

// Every rank of the `kind` pipeline `layout` reports its reference's losses and whole-model
// final weights, bit for bit; returns the pipeline's summaries.
std::vector<TrainSummary> expect_equal_to_reference(const std::string& kind, const std::vector<std::string>& layout) {
  std::vector<std::string> sets = layout;
  sets.push_back("parallel.schedule=" + kind);
  const std::vector<TrainSummary> got = testing_support::train_keeping_params(base(sets));
  sets.back() = "parallel.schedule=1f1b";
  TrainOptions o;
  o.keep_params = true;
  o.async_reference = kind;
  const std::vector<TrainSummary> want = testing_support::train_as_threads(base(sets), o);
  const std::string at = kind + " " + joined(layout);
  for (size_t r = 0; r < got.size(); r++) {
    EXPECT_EQ(got[r].losses, want[0].losses) << at << "rank " << r;
    EXPECT_EQ(got[r].final_params.size(), want[0].final_params.size()) << at;
    if (got[r].final_params.size() != want[0].final_params.size()) continue;
    size_t differ = 0;
    for (size_t i = 0; i < want[0].final_params.size(); i++)
      differ += got[r].final_params[i] != want[0].final_params[i];
    EXPECT_EQ(differ, 0u) << at << "rank " << r << ": weights differing from the reference";
  }
  return got;
}

// pp 2-4, GPT (tied wte across the first and last stage) and Llama, tp, recompute, both
// modes and PipeMare's corrections on and off: each stage's per-minibatch updates at its own
// delay are exactly the reference's, and not a renamed 1F1B.
TEST(AsyncPipe, PipeDreamAndPipeMareEqualTheirReferenceBitForBit) {
  for (const std::string kind : {"pipedream", "pipemare"}) {
    for (int pp = 2; pp <= 4; pp++) {
      const std::vector<std::string> layout = {"parallel.pp=" + std::to_string(pp)};
      const std::vector<TrainSummary> got = expect_equal_to_reference(kind, layout);
      std::vector<std::string> llama = layout;
      llama.insert(llama.end(), kLlama.begin(), kLlama.end());
      expect_equal_to_reference(kind, llama);
      const std::vector<TrainSummary> flushing = testing_support::train_keeping_params(base(layout));
      EXPECT_EQ(got[0].losses[0], flushing[0].losses[0]) << kind << " pp " << pp;
      EXPECT_NE(got[0].losses[3], flushing[0].losses[3]) << kind << " pp " << pp;
    }
    expect_equal_to_reference(kind, {"parallel.pp=2", "parallel.tp=2"});
    expect_equal_to_reference(kind, {"parallel.pp=3", "parallel.recompute=full", "train.val_every=3"});
  }
  expect_equal_to_reference("pipemare", {"parallel.pp=3", "parallel.pipemare_decay=0", "parallel.pipemare_lr_steps=4"});
  expect_equal_to_reference("pipemare", {"parallel.pp=3", "parallel.sync_warmup_steps=2", "parallel.pipemare_lr_steps=3"});
}

// Note [Streams with data parallelism]: each stage replica all-reduces its minibatch's
// gradient before its update (a tied GPT first stage after adding the head's wte part, which
// it sends on reduced); with two replicas the flushing dp layout's reference bit for bit.
TEST(AsyncPipe, DataParallelReplicasEqualTheirReferenceBitForBit) {
  for (const std::string kind : {"pipedream", "pipemare"}) {
    const std::vector<std::string> layout = {"parallel.pp=2", "parallel.dp=2", "train.batch=4"};
    const std::vector<TrainSummary> got = expect_equal_to_reference(kind, layout);
    ASSERT_EQ(got.size(), 4u) << kind;
    const std::vector<TrainSummary> flushing = testing_support::train_keeping_params(base(layout));
    EXPECT_NE(got[0].losses[3], flushing[0].losses[3]) << kind;
    std::vector<std::string> llama = layout;
    llama.insert(llama.end(), kLlama.begin(), kLlama.end());
    expect_equal_to_reference(kind, llama);
  }
  expect_equal_to_reference("pipemare", {"parallel.pp=3", "parallel.dp=2", "train.batch=4",
                                         "parallel.sync_warmup_steps=2", "train.val_every=3"});
}

// Context parallelism inside each stage (issue 53): a stage's cp ranks run the stream together
// and reduce its gradient over dp x cp before each update: the same layout's reference bit for
// bit in every cp mode (Ulysses on Llama: cp 2 divides its 4 heads and 2 kv heads), and the cp
// 1 stream's losses within loom verify's exact bound (the cp sums run in another order).
TEST(AsyncPipe, ContextParallelStagesEqualTheirReferenceBitForBit) {
  for (const std::string kind : {"pipedream", "pipemare"}) {
    const std::vector<TrainSummary> got = expect_equal_to_reference(kind, {"parallel.pp=2", "parallel.cp=2"});
    ASSERT_EQ(got.size(), 4u) << kind;
    expect_equal_to_reference(kind, {"parallel.pp=2", "parallel.cp=2", "parallel.cp_mode=ring", "parallel.dp=2",
                                     "train.batch=4"});
    std::vector<std::string> llama = {"parallel.pp=2", "parallel.cp=2", "parallel.cp_mode=ulysses"};
    llama.insert(llama.end(), kLlama.begin(), kLlama.end());
    expect_equal_to_reference(kind, llama);
    const std::vector<TrainSummary> one =
        testing_support::train_keeping_params(base({"parallel.pp=2", "parallel.schedule=" + kind}));
    ASSERT_EQ(one[0].losses.size(), got[0].losses.size());
    for (size_t i = 0; i < got[0].losses.size(); i++)
      EXPECT_NEAR(got[0].losses[i], one[0].losses[i], 1e-5 * std::fabs(one[0].losses[i])) << kind << " step " << i;
  }
}

// Note [Synchronous warm-up]: warm-up steps flush after every minibatch, so a run that is
// all warm-up is the flushing schedule bit for bit (pipedream and pipemare: 1F1B of one
// micro-batch per step; 2bw: 1F1B of its m micro-batches), and a shorter one is that run's
// prefix, after which the stream's delays begin.
TEST(AsyncPipe, SynchronousWarmUpIsTheFlushingScheduleThenTheStreamStarts) {
  for (const std::string kind : {"pipedream", "pipemare", "2bw"}) {
    const std::vector<std::string> shape = kind == "2bw" ? std::vector<std::string>{"parallel.pp=3", "train.grad_accum=3",
                                                                                     "train.batch=6"}
                                                         : std::vector<std::string>{"parallel.pp=3"};
    auto run = [&](std::vector<std::string> more) {
      more.insert(more.end(), shape.begin(), shape.end());
      return testing_support::train_keeping_params(base(more));
    };
    const std::vector<TrainSummary> flushing = run({});
    const std::vector<TrainSummary> all = run({"parallel.schedule=" + kind, "parallel.sync_warmup_steps=7"});
    EXPECT_EQ(all[0].losses, flushing[0].losses) << kind;
    EXPECT_EQ(all[0].final_params, flushing[0].final_params) << kind;
    const std::vector<TrainSummary> part = run({"parallel.schedule=" + kind, "parallel.sync_warmup_steps=3"});
    EXPECT_EQ(std::vector<float>(part[0].losses.begin(), part[0].losses.begin() + 4),
              std::vector<float>(flushing[0].losses.begin(), flushing[0].losses.begin() + 4))
        << kind << ": steps 1-3 synchronous, step 4 the stream's first (no delay yet)";
    EXPECT_NE(part[0].losses[5], flushing[0].losses[5]) << kind << ": the stream's delays begin";
  }
}

// Every forward and backward reports the version it computes on: a stage's updates before
// it. PipeDream's backward uses its forward's version (the stash), which is d = min(t - t0,
// pp - 1 - r) updates old; PipeMare's backward runs on every update so far. Validation
// flushes the stream (t0 restarts). Each stage holds one weight version per minibatch in
// flight (PipeDream) or W, the velocity and the corrected weights (PipeMare), and 1F1B's
// activations.
TEST(AsyncPipe, EachBackwardUsesTheVersionItsModeSays) {
  const int pp = 4;
  for (const std::string kind : {"pipedream", "pipemare"}) {
    std::mutex mu;
    std::map<std::tuple<int, int64_t, bool>, std::vector<int64_t>> seen;  // (stage, batch, forward) -> versions
    TrainOptions o;
    o.on_weight_version = [&](int stage, int64_t batch, bool forward, int64_t version) {
      std::lock_guard<std::mutex> lock(mu);
      seen[{stage, batch, forward}].push_back(version);
    };
    const Config c = base({"parallel.pp=4", "parallel.schedule=" + kind, "train.steps=9", "train.val_every=4"});
    const std::vector<TrainSummary> got = testing_support::train_as_threads(c, o);
    // 1F1B over pp micro-batches of the same size holds pp - r of them, as the stream does.
    const std::vector<TrainSummary> flushing =
        testing_support::train_keeping_params(base({"parallel.pp=4", "train.grad_accum=4", "train.batch=8"}));
    for (int r = 0; r < pp; r++) {
      const int tau = pp - 1 - r;
      for (int64_t t = 0; t < 9; t++) {
        const int64_t t0 = t < 4 ? 0 : t < 8 ? 4 : 8;  // flushes after steps 4 and 8 (validation)
        const int64_t d = std::min<int64_t>(t - t0, tau);
        const auto f = seen[{r, t, true}], b = seen[{r, t, false}];
        ASSERT_EQ(f.size(), 1u) << kind << " stage " << r << " batch " << t;
        ASSERT_EQ(b.size(), 1u) << kind << " stage " << r << " batch " << t;
        EXPECT_EQ(f[0], t - d) << kind << " stage " << r << " forward of " << t;
        EXPECT_EQ(b[0], kind == "pipedream" ? t - d : t) << kind << " stage " << r << " backward of " << t;
      }
      const int64_t one = peak(flushing[size_t(r)], "params");
      EXPECT_EQ(peak(got[size_t(r)], "params"), kind == "pipedream" ? (tau + 1) * one : (tau > 0 ? 3 : 1) * one)
          << kind << " stage " << r;
      EXPECT_EQ(peak(got[size_t(r)], "activations"), peak(flushing[size_t(r)], "activations")) << kind << " stage " << r;
    }
  }
}

// A checkpoint flushes the stream: a resume from it continues bit for bit; pp = 1 is plain
// training (nothing in flight to delay).
TEST(AsyncPipe, ResumesBitForBitAndIsPlainTrainingAtPpOne) {
  testing_support::TempDir dir("loom-async-pipe");
  for (const std::string kind : {"pipedream", "pipemare"}) {
    std::vector<std::string> saving = {"parallel.pp=3", "train.steps=8", "parallel.schedule=" + kind,
                                       "checkpoint.save_every=4", "checkpoint.dir=" + (dir / (kind + "-whole"))};
    const std::vector<TrainSummary> whole = testing_support::train_keeping_params(base(saving));
    saving.back() = "checkpoint.dir=" + (dir / (kind + "-resumed"));
    const std::vector<TrainSummary> resumed =
        testing_support::train_keeping_params(base(saving), dir / (kind + "-whole") + "/step-00000004");
    ASSERT_EQ(resumed[0].losses.size(), 4u);
    EXPECT_EQ(resumed[0].losses, std::vector<float>(whole[0].losses.begin() + 4, whole[0].losses.end())) << kind;
    EXPECT_EQ(resumed[0].final_params, whole[0].final_params) << kind;
    const std::vector<TrainSummary> one = testing_support::train_keeping_params(base({"parallel.schedule=" + kind}));
    const std::vector<TrainSummary> plain = testing_support::train_keeping_params(base({}));
    EXPECT_EQ(one[0].losses, plain[0].losses) << kind;
    EXPECT_EQ(one[0].final_params, plain[0].final_params) << kind;
  }
}

TEST(AsyncPipe, RefusesWhatItDoesNotRun) {
  auto error = [](std::vector<std::string> sets) {
    return testing_support::error_message([&] { base(sets); });
  };
  EXPECT_NE(error({"parallel.pp=2", "parallel.schedule=pipedream", "train.grad_accum=2"}).find("set train.grad_accum = 1"),
            std::string::npos);
  EXPECT_NE(error({"parallel.pp=2", "parallel.schedule=pipemare", "optim.grad_clip=1"}).find("set optim.grad_clip = 0"),
            std::string::npos);
  EXPECT_NE(error({"parallel.pp=2", "parallel.schedule=pipedream", "parallel.dp=2", "parallel.zero=1", "train.batch=4"})
                .find("so nothing is sharded"),
            std::string::npos);
  EXPECT_NE(error({"parallel.pp=2", "parallel.schedule=pipemare", "parallel.pipemare_decay=1"}).find("in [0, 1)"),
            std::string::npos);
  EXPECT_NO_THROW(base({"parallel.pp=2", "parallel.sync_warmup_steps=10", "train.grad_accum=2"}));  // 1f1b: always synchronous
  EXPECT_NE(error({"parallel.pp=2", "parallel.schedule=pipedream", "parallel.sync_warmup_steps=-1"}).find("steps >= 0"),
            std::string::npos);
  EXPECT_THROW(parallel::make_schedule(ScheduleKind::kPipeDream, 2, 2), Error);
}

}  // namespace
}  // namespace loom
