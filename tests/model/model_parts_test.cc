// Model parts (Note [Model parts]): running the stages of a split model in sequence gives
// the whole model's loss and gradients, for GPT (tied head) and Llama, with several
// activation slots and a two-chunk (interleaved-style) part.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "loom/core/error.h"
#include "loom/core/memory.h"
#include "loom/model/model.h"

namespace loom {
namespace {

ModelConfig small(Arch arch) {
  ModelConfig m;
  m.arch = arch, m.layers = 4, m.d_model = 32, m.heads = 4, m.kv_heads = arch == Arch::kGpt ? 4 : 2;
  m.ffn = arch == Arch::kGpt ? 128 : 48, m.vocab = 64, m.ctx = 16;
  return m;
}

ModelOptions with_part(const ModelPart& p, int slots = 1) {
  ModelOptions o;
  o.part = p;
  o.act_slots = slots;
  return o;
}

struct Batch {
  std::vector<int32_t> tok, tgt;
};

Batch random_batch(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab) - 1);
  Batch b;
  for (int64_t i = 0; i < n; i++) b.tok.push_back(d(rng)), b.tgt.push_back(d(rng));
  return b;
}

// Stage s of `parts` holds parts[s]; micro-batches run all forwards, then all backwards
// (GPipe order), each on its own activation slot.
void run_pipeline(std::vector<std::unique_ptr<Model>>& stages, const std::vector<Batch>& mbs, int64_t B, int64_t T,
                  std::vector<float>& losses) {
  const int M = int(mbs.size());
  losses.assign(size_t(M), 0.0f);
  for (int m = 0; m < M; m++) {
    const float* x = nullptr;
    for (auto& st : stages)
      for (int c = 0; c < st->chunks(); c++) {
        const float l = st->stage_forward(c, m, mbs[m].tok.data(), x, mbs[m].tgt.data(), B, T, 1.0f / float(M));
        if (st->chunk_has_head(c)) losses[size_t(m)] = l;
        else x = st->stage_output(c, m);
      }
  }
  for (int m = M - 1; m >= 0; m--) {
    const float* dy = nullptr;
    for (int s = int(stages.size()) - 1; s >= 0; s--)
      for (int c = stages[s]->chunks() - 1; c >= 0; c--) {
        stages[s]->stage_backward(c, m, dy, B, T);
        if (!stages[s]->chunk_has_embed(c)) dy = stages[s]->stage_input_grad(c, m);
      }
  }
}

void expect_parts_match_whole(Arch arch, const std::vector<ModelPart>& parts) {
  const ModelConfig cfg = small(arch);
  const int64_t B = 2, T = 8, M = 3;
  std::vector<Batch> mbs;
  for (int m = 0; m < M; m++) mbs.push_back(random_batch(B * T, cfg.vocab, 100 + m));

  Model whole(cfg, B, T);
  whole.init_weights(7);
  std::vector<float> ref_losses;
  for (int m = 0; m < M; m++)
    ref_losses.push_back(whole.forward_backward(mbs[m].tok.data(), mbs[m].tgt.data(), B, T, 1.0f / float(M)));

  std::vector<std::unique_ptr<Model>> stages;
  for (const ModelPart& p : parts) {
    stages.push_back(std::make_unique<Model>(cfg, B, T, KernelBackend::kCpu, with_part(p, int(M))));
    stages.back()->init_weights(7);
  }
  std::vector<float> losses;
  run_pipeline(stages, mbs, B, T, losses);
  for (int m = 0; m < M; m++) EXPECT_NEAR(losses[m], ref_losses[m], 1e-6f * std::abs(ref_losses[m])) << "mb " << m;

  // Every tensor of the whole model: same initial value on every part that holds it, and
  // gradients that add up (GPT's wte sits on the first and last part) to the whole's.
  for (const ParamSpec& s : whole.layout().specs()) {
    std::vector<double> g(size_t(s.numel), 0.0);
    int holders = 0;
    for (auto& st : stages) {
      const ParamSpec* mine = st->layout().find(s.name);
      if (!mine) continue;
      holders++;
      for (int64_t i = 0; i < s.numel; i++) {
        ASSERT_EQ(st->params()[size_t(mine->offset + i)], whole.params()[size_t(s.offset + i)]) << s.name;
        g[size_t(i)] += st->grads()[size_t(mine->offset + i)];
      }
    }
    EXPECT_GE(holders, 1) << s.name;
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < s.numel; i++) {
      max_err = std::max(max_err, std::abs(g[size_t(i)] - whole.grads()[size_t(s.offset + i)]));
      max_ref = std::max(max_ref, double(std::abs(whole.grads()[size_t(s.offset + i)])));
    }
    EXPECT_LE(max_err, 1e-5 * std::max(1.0, max_ref)) << s.name;
  }
}

TEST(ModelParts, TwoStagesMatchTheWholeModel) {
  for (Arch a : {Arch::kGpt, Arch::kLlama})
    expect_parts_match_whole(a, {{{{0, 2}}, true, false}, {{{2, 4}}, false, true}});
}

TEST(ModelParts, UnevenThreeStagesMatchTheWholeModel) {
  for (Arch a : {Arch::kGpt, Arch::kLlama})
    expect_parts_match_whole(a, {{{{0, 1}}, true, false}, {{{1, 3}}, false, false}, {{{3, 4}}, false, true}});
}

TEST(ModelParts, ChunkedPartsAsInterleavedSchedulesUseThem) {
  // Two ranks, two chunks each: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3. Run in
  // virtual-stage order by giving each chunk its own single-chunk view of the schedule.
  const ModelConfig cfg = small(Arch::kGpt);
  const ModelPart r0{{{0, 1}, {2, 3}}, true, false}, r1{{{1, 2}, {3, 4}}, false, true};
  Model m0(cfg, 2, 8, KernelBackend::kCpu, with_part(r0)), m1(cfg, 2, 8, KernelBackend::kCpu, with_part(r1));
  Model whole(cfg, 2, 8);
  for (Model* m : {&m0, &m1, &whole}) m->init_weights(3);
  const Batch b = random_batch(16, cfg.vocab, 5);
  const float ref = whole.forward_backward(b.tok.data(), b.tgt.data(), 2, 8, 1.0f);
  m0.stage_forward(0, 0, b.tok.data(), nullptr, nullptr, 2, 8, 1.0f);
  m1.stage_forward(0, 0, nullptr, m0.stage_output(0, 0), nullptr, 2, 8, 1.0f);
  m0.stage_forward(1, 0, nullptr, m1.stage_output(0, 0), nullptr, 2, 8, 1.0f);
  const float loss = m1.stage_forward(1, 0, nullptr, m0.stage_output(1, 0), b.tgt.data(), 2, 8, 1.0f);
  EXPECT_NEAR(loss, ref, 1e-6f * ref);
  m1.stage_backward(1, 0, nullptr, 2, 8);
  m0.stage_backward(1, 0, m1.stage_input_grad(1, 0), 2, 8);
  m1.stage_backward(0, 0, m0.stage_input_grad(1, 0), 2, 8);
  m0.stage_backward(0, 0, m1.stage_input_grad(0, 0), 2, 8);
  const ParamSpec& q = whole.layout().at("h.2.attn.qkv.w");
  const ParamSpec& q0 = m0.layout().at("h.2.attn.qkv.w");
  for (int64_t i = 0; i < q.numel; i += 97)
    EXPECT_NEAR(m0.grads()[size_t(q0.offset + i)], whole.grads()[size_t(q.offset + i)], 1e-6) << i;
}

TEST(Recompute, SelectiveAndFullGiveBitIdenticalLossesAndGradients) {
  for (Arch arch : {Arch::kGpt, Arch::kLlama}) {
    const ModelConfig cfg = small(arch);
    const Batch b = random_batch(16, cfg.vocab, 9);
    Model plain(cfg, 2, 8);
    plain.init_weights(4);
    const float ref = plain.forward_backward(b.tok.data(), b.tgt.data(), 2, 8, 1.0f);
    // Mixed per-layer policies, as a plan may give them.
    for (std::vector<Recompute> policy :
         {std::vector<Recompute>(4, Recompute::kSelective), std::vector<Recompute>(4, Recompute::kFull),
          std::vector<Recompute>{Recompute::kFull, Recompute::kNone, Recompute::kSelective, Recompute::kFull}}) {
      ModelOptions o;
      o.recompute = policy;
      Model m(cfg, 2, 8, KernelBackend::kCpu, o);
      m.init_weights(4);
      EXPECT_EQ(m.forward_backward(b.tok.data(), b.tgt.data(), 2, 8, 1.0f), ref);
      EXPECT_EQ(m.grads(), plain.grads());
      if (policy[1] == Recompute::kFull) EXPECT_LT(m.activation_bytes(), plain.activation_bytes() / 2);
      else EXPECT_LT(m.activation_bytes(), plain.activation_bytes());
    }
  }
}

// Counts the tensor-parallel all-reduces one rank issues; the sums themselves are left out (one
// rank of two runs alone here, so only the calls are checked, not the numbers).
class CountingTpComm : public TpComm {
 public:
  int all_reduces = 0;
  void all_reduce_sum(float*, int64_t) override { all_reduces++; }
  void all_reduce_max(float*, int64_t) override {}
  void broadcast(float*, int64_t, int) override {}
  void reduce_sum(float*, int64_t, int) override {}
  void all_gather_blocks(float*, int64_t) override {}
  void reduce_scatter_blocks(float*, int64_t) override {}
  void all_to_all_blocks(const float*, float*, int64_t) override {}
  std::function<void()> ring_shift(const float*, float*, int64_t) override { return [] {}; }
};

// Note [Recompute]: a fully recomputed layer reruns its forward up to the MLP activation, not
// the output projection: at tp 2 it repeats the attention projection's all-reduce and not the
// MLP's, one all-reduce a recomputed layer more than without recompute (two before).
TEST(Recompute, FullRecomputeStopsBeforeTheMlpOutputProjection) {
  for (Arch arch : {Arch::kGpt, Arch::kLlama}) {
    const ModelConfig cfg = small(arch);
    const Batch b = random_batch(16, cfg.vocab, 9);
    int calls[2] = {0, 0};
    for (int full = 0; full < 2; full++) {
      CountingTpComm comm;
      ModelOptions o = with_part({{}, true, true, 2, 0});
      o.tp_comm = &comm;
      if (full) o.recompute = {Recompute::kFull, Recompute::kNone, Recompute::kFull, Recompute::kFull};
      Model m(cfg, 2, 8, KernelBackend::kCpu, o);
      m.init_weights(4);
      m.forward_backward(b.tok.data(), b.tgt.data(), 2, 8, 1.0f);
      calls[full] = comm.all_reduces;
    }
    EXPECT_GT(calls[0], 0);
    EXPECT_EQ(calls[1] - calls[0], 3) << "three recomputed layers, one all-reduce each";
  }
}

TEST(ModelParts, WholeModelCallsNeedTheWholeModel) {
  const ModelConfig cfg = small(Arch::kLlama);
  Model part(cfg, 1, 8, KernelBackend::kCpu, with_part({{{0, 2}}, true, false}));
  const Batch b = random_batch(8, cfg.vocab, 1);
  EXPECT_THROW(part.forward_backward(b.tok.data(), b.tgt.data(), 1, 8, 1.0f), Error);
  EXPECT_THROW(part.stage_forward(0, 1, b.tok.data(), nullptr, nullptr, 1, 8, 1.0f), Error);  // one slot only
  EXPECT_THROW(Model(cfg, 1, 8, KernelBackend::kCpu, with_part({{{3, 5}}, false, true})), Error);  // layer 4 of 4
  EXPECT_EQ(part.layout().find("head.w"), nullptr);
  EXPECT_NE(part.layout().find("h.1.mlp.fc.w"), nullptr);
  EXPECT_EQ(part.layout().find("h.2.mlp.fc.w"), nullptr);
}

// Note [Resident memory]: a new model's activation storage holds no resident page before its
// first forward, even where the allocator hands it heap pages an earlier buffer touched and
// freed (glibc: after a large mmapped block is freed, blocks up to its size come from the
// heap, whose freed pages stay resident). Counting those made PredictedMemory flaky: the
// interleaved layout's storage reused the GPipe layout's, +17 to 19 MiB.
TEST(ModelMemory, ActivationStorageStartsWithNothingResident) {
  ModelConfig m = small(Arch::kGpt);
  m.d_model = 128, m.heads = 4, m.kv_heads = 4, m.ffn = 512, m.ctx = 64;
  ModelOptions o;
  o.act_slots = 2;
  const int64_t bytes = Model(m, 4, 64, KernelBackend::kCpu, o).activation_bytes();
  for (int round = 0; round < 3; round++) {  // a touched block of the storage's size, freed, then the model
    {
      std::unique_ptr<char[]> touched(new char[size_t(bytes)]);
      std::memset(touched.get(), 1, size_t(bytes));
    }
    const Model model(m, 4, 64, KernelBackend::kCpu, o);
    // (the partial pages at the ends are zeroed in place)
    EXPECT_LE(resident_bytes(model.activation_storage(), model.activation_bytes()), 2 * page_bytes())
        << "round " << round << " of " << bytes << " bytes";
  }
}

// Note [2BW's update in the waits]: swap_params hands the model another buffer in O(1); every
// view then reads it (GPT's tied head included), and binding units to other weights and back
// still works afterwards (the views that bind_unit_params rewrites are the ones read).
TEST(ModelParams, SwappedBufferIsWhatTheModelReads) {
  for (Arch a : {Arch::kGpt, Arch::kLlama}) {
    const ModelConfig cfg = small(a);
    const int64_t B = 2, T = 8;
    const Batch b = random_batch(B * T, cfg.vocab, 5);
    Model model(cfg, B, T), other_model(cfg, B, T);
    model.init_weights(1), other_model.init_weights(2);
    const float mine = model.forward_loss(b.tok.data(), b.tgt.data(), B, T);
    const float theirs = other_model.forward_loss(b.tok.data(), b.tgt.data(), B, T);
    ASSERT_NE(mine, theirs);
    const std::vector<float> first = model.params();
    std::vector<float> other = other_model.params();
    const float* const buffer = other.data();
    model.swap_params(other);
    EXPECT_EQ(model.params().data(), buffer) << "a swap, not a copy";
    EXPECT_EQ(other, first);
    EXPECT_EQ(model.forward_loss(b.tok.data(), b.tgt.data(), B, T), theirs);
    for (int u = 0; u < model.units(); u++)  // the old buffer bound, unit by unit
      if (model.unit_range(u).count > 0) model.bind_unit_params(u, other.data() + model.unit_range(u).offset);
    EXPECT_EQ(model.forward_loss(b.tok.data(), b.tgt.data(), B, T), mine);
    for (int u = 0; u < model.units(); u++)
      if (model.unit_range(u).count > 0) model.bind_unit_params(u, nullptr);
    EXPECT_EQ(model.forward_loss(b.tok.data(), b.tgt.data(), B, T), theirs);
    model.swap_params(other);  // and back
    EXPECT_EQ(model.forward_loss(b.tok.data(), b.tgt.data(), B, T), mine);
  }
}

}  // namespace
}  // namespace loom
