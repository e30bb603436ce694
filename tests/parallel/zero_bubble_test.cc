// Zero-bubble pipelines (Note [B/W split] in model/model.h): the split backward against the
// joint one on one model, and zb-h1 / zb-h2 against 1F1B on whole parallel layouts.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "loom/model/model.h"
#include "loom/train/verify.h"
#include "support/train_threads.h"

namespace loom {
namespace {

ModelConfig small(const char* preset) {
  return load_config("", {std::string("model.preset=") + preset, "model.layers=3", "model.d_model=64", "model.heads=4",
                          std::string("model.kv_heads=") + (preset == std::string("llama") ? "2" : "4"),
                          "model.ffn=96", "model.ctx=16", "model.vocab=300"})
      .model;
}

// Two micro-batches through one chunk: B of the first, F and B of the second, then both
// W's (two slots, two W slots), against the joint backward in the same order. Every
// gradient and both losses are bit-identical, for GPT and Llama, fp32 and bf16, with and
// without selective recompute, on both kernel sets.
TEST(SplitBackward, BThenWEqualsTheJointBackwardBitForBit) {
  std::mt19937 rng(std::random_device{}());
  const int64_t B = 2, T = 16;
  for (const char* preset : {"tiny", "llama"})
    for (Precision p : {Precision::kFp32, Precision::kBf16})
      for (Recompute rc : {Recompute::kNone, Recompute::kSelective})
        for (KernelBackend backend : {KernelBackend::kCpu, KernelBackend::kRef}) {
          const ModelConfig m = small(preset);
          std::vector<int32_t> tok(size_t(2 * B * T)), tgt(tok.size());
          for (auto& t : tok) t = int32_t(rng() % 300);
          for (auto& t : tgt) t = int32_t(rng() % 300);
          std::vector<float> grads[2];
          float losses[2][2];
          for (int split = 0; split < 2; split++) {
            ModelOptions o;
            o.precision = p;
            o.recompute.assign(size_t(m.layers), rc);
            o.act_slots = 2;
            o.w_slots = split ? 2 : 0;
            Model model(m, B, T, backend, o);
            model.init_weights(11);
            model.zero_grads();
            for (int mb = 0; mb < 2; mb++) {
              const size_t at = size_t(mb * B * T);
              losses[split][mb] = model.stage_forward(0, mb, tok.data() + at, nullptr, tgt.data() + at, B, T, 0.5f);
              if (split) model.stage_backward_input(0, mb, mb, nullptr, B, T);
              else model.stage_backward(0, mb, nullptr, B, T);
            }
            if (split)
              for (int mb = 0; mb < 2; mb++) model.stage_backward_weight(0, mb, mb, B, T);
            grads[split] = model.grads();
          }
          const std::string at = std::string(preset) + (p == Precision::kBf16 ? " bf16" : " fp32") +
                                 (rc == Recompute::kSelective ? " selective" : "") +
                                 (backend == KernelBackend::kRef ? " ref" : " cpu");
          EXPECT_EQ(losses[0][0], losses[1][0]) << at;
          EXPECT_EQ(losses[0][1], losses[1][1]) << at;
          ASSERT_EQ(grads[0].size(), grads[1].size());
          size_t differ = 0;
          for (size_t i = 0; i < grads[0].size(); i++) differ += grads[0][i] != grads[1][i];
          EXPECT_EQ(differ, 0u) << at << ": gradients differing from the joint backward";
        }
}

TEST(SplitBackward, FullRecomputeIsRefused) {
  ModelOptions o;
  o.recompute.assign(3, Recompute::kFull);
  o.w_slots = 1;
  EXPECT_THROW(Model(small("tiny"), 2, 16, KernelBackend::kCpu, o), Error);
}

Config base(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ffn=128",
                                   "model.ctx=32", "train.steps=3", "train.val_batches=1", "train.val_every=0",
                                   "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

int64_t activation_bytes(const TrainSummary& s) {
  for (const auto& [name, bytes] : s.memory_peak_bytes)
    if (name == "activations") return bytes;
  return -1;
}

// zb-h1 and zb-h2 against 1F1B on the same layout: the same forward and backward
// arithmetic, weight gradients accumulated in the same micro-batch order, so every step's
// loss and every rank's final weights are equal bit for bit.
// (zb-v runs two chunks per rank, so its ranks' parts differ from 1F1B's: the whole model's
// final weights are compared, which every rank of a pipeline reports.)
void expect_equal_to_1f1b(const std::vector<std::string>& layout,
                          const std::vector<const char*>& schedules = {"zb-h1", "zb-h2"}) {
  std::vector<std::string> sets = layout;
  sets.push_back("parallel.schedule=1f1b");
  const std::vector<TrainSummary> ref = testing_support::train_keeping_params(base(sets));
  for (const char* zb : schedules) {
    sets.back() = std::string("parallel.schedule=") + zb;
    if (zb == std::string("zb-v")) sets.push_back("parallel.vpp=2");
    const std::vector<TrainSummary> got = testing_support::train_keeping_params(base(sets));
    if (zb == std::string("zb-v")) sets.pop_back();
    std::string at = zb;
    for (const std::string& s : layout) at += " " + s;
    ASSERT_EQ(got.size(), ref.size()) << at;
    for (size_t r = 0; r < ref.size(); r++) {
      ASSERT_EQ(ref[r].losses.size(), 3u) << at;
      EXPECT_EQ(got[r].losses, ref[r].losses) << at << " rank " << r;
      // The split ran: the last stage holds W slots (and ZB-H1 / H2 more activations) that 1F1B's does not.
      if (r + 1 == ref.size() && zb != std::string("zb-v")) EXPECT_GT(activation_bytes(got[r]), activation_bytes(ref[r])) << at;
      ASSERT_EQ(got[r].final_params.size(), ref[r].final_params.size()) << at;
      size_t differ = 0;
      for (size_t i = 0; i < ref[r].final_params.size(); i++) differ += got[r].final_params[i] != ref[r].final_params[i];
      EXPECT_EQ(differ, 0u) << at << " rank " << r << ": weights differing from 1F1B's";
    }
  }
}

TEST(ZeroBubble, EqualsOneFOneBForEveryPipelineDepthAndMicroBatchCount) {
  for (int pp = 2; pp <= 4; pp++)
    for (int m : {pp, 2 * pp, 3 * pp})
      expect_equal_to_1f1b({"parallel.pp=" + std::to_string(pp), "train.grad_accum=" + std::to_string(m),
                            "train.batch=" + std::to_string(m)});
}

TEST(ZeroBubble, EqualsOneFOneBWithDataAndTensorParallelAndLlama) {
  const std::vector<std::string> llama = {"model.preset=llama", "model.layers=4", "model.d_model=64", "model.heads=4",
                                          "model.kv_heads=2", "model.ffn=96"};
  std::vector<std::vector<std::string>> layouts = {
      {"parallel.pp=2", "parallel.dp=2", "train.grad_accum=4", "train.batch=8"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.zero=1", "train.grad_accum=2", "train.batch=4"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.zero=2", "train.grad_accum=4", "train.batch=8"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "train.grad_accum=2", "train.batch=4"},
      {"parallel.pp=2", "parallel.tp=2", "train.grad_accum=4", "train.batch=4"},
      {"parallel.pp=2", "parallel.tp=2", "parallel.sp=true", "train.grad_accum=2", "train.batch=2"},
      {"parallel.pp=3", "parallel.recompute=selective", "train.grad_accum=6", "train.batch=6"},
      {"parallel.pp=2", "train.precision=bf16", "train.grad_accum=4", "train.batch=4"},
      // Note [Stage split]: a head-only last stage in bf16, an embedding-only first with selective recompute
      {"parallel.pp=2", "parallel.pp_layers=4,0", "train.precision=bf16", "train.grad_accum=4", "train.batch=4"},
      {"parallel.pp=3", "parallel.pp_layers=0,4,0", "parallel.recompute=selective", "train.grad_accum=3",
       "train.batch=3"},
  };
  for (auto l : std::vector<std::vector<std::string>>{{"parallel.pp=2", "train.grad_accum=4", "train.batch=4"},
                                                      {"parallel.pp=2", "parallel.tp=2", "train.grad_accum=2",
                                                       "train.batch=2"}}) {
    l.insert(l.begin(), llama.begin(), llama.end());
    layouts.push_back(l);
  }
  for (const auto& l : layouts) expect_equal_to_1f1b(l);
}

// ZB-V against 1F1B, Llama (untied head): bit for bit, for pp 2-4. Gradient clipping is off
// here: the global norm sums each rank's squares, and zb-v's ranks hold other layers than
// 1F1B's, so the norm (and a clip coefficient below 1) can differ in its last bit.
TEST(ZeroBubble, VEqualsOneFOneBOnLlama) {
  const std::vector<std::string> llama = {"model.preset=llama", "model.layers=8", "model.d_model=64", "model.heads=4",
                                          "model.kv_heads=2", "model.ffn=96", "optim.grad_clip=0"};
  for (int pp = 2; pp <= 4; pp++)
    for (int m : {pp, 2 * pp}) {
      std::vector<std::string> l = llama;
      for (std::string s : {"parallel.pp=" + std::to_string(pp), "train.grad_accum=" + std::to_string(m),
                            "train.batch=" + std::to_string(m)})
        l.push_back(s);
      expect_equal_to_1f1b(l, {"zb-v"});
    }
}

// ZB-V on GPT: rank 0 holds both ends of the tied embedding, so wte's gradient sums the
// head's and the embedding's contributions micro-batch by micro-batch, as the single
// process does, where 1F1B sums each end's and then adds the two. Against the single-process
// run with loom verify's fp32 bounds (loss 1e-5 relative, weights 1e-4), with dp and tp.
TEST(ZeroBubble, VOnGptMatchesTheSingleProcessRun) {
  const Config gpt = base({"model.layers=8", "train.batch=8", "train.steps=6"});
  std::vector<std::vector<std::string>> layouts = {
      {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v", "train.grad_accum=4"},
      {"parallel.pp=4", "parallel.vpp=2", "parallel.schedule=zb-v", "train.grad_accum=8"},
      {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v", "parallel.dp=2", "train.grad_accum=2"},
      {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v", "parallel.tp=2", "train.grad_accum=4"}};
  const std::vector<VerifyRow> rows = verify_layouts(gpt, layouts);
  ASSERT_EQ(rows.size(), layouts.size());
  for (size_t i = 0; i < rows.size(); i++)
    EXPECT_TRUE(rows[i].ok && rows[i].error.empty()) << i << ": " << rows[i].error << " loss rel " << rows[i].max_loss_rel
                                                     << ", weight " << rows[i].max_weight_abs;
}

TEST(ZeroBubble, RefusesLayoutsItCannotRunNamingTheFix) {
  for (auto [sets, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"parallel.schedule=zb-h1"}, "needs parallel.pp >= 2"},
           {{"parallel.schedule=zb-h2", "parallel.pp=2", "parallel.recompute=full"}, "use none or selective"},
           {{"parallel.schedule=zb-h1", "parallel.pp=2", "parallel.vpp=2"}, "needs parallel.schedule = interleaved or zb-v"},
           {{"parallel.schedule=zb-v", "parallel.pp=2", "parallel.vpp=3", "model.layers=6"}, "set parallel.vpp = 2"},
           {{"parallel.schedule=zb-v", "parallel.pp=4", "parallel.vpp=2"}, "exceeds model.layers"}}) {
    try {
      base(sets);
      ADD_FAILURE() << "accepted " << sets.back();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace loom
