// Note [Vocabulary passes] (parallel/schedule.h): the head, the loss and the embedding split
// by vocabulary rows over a pipeline's ranks and run in the schedule's vocabulary passes,
// against the single-process run on the same seed, data and global batch (loom verify's
// exact bounds: every step's loss within 1e-5 relative, every final weight within 1e-4).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/model/layout.h"
#include "loom/parallel/stage_part.h"
#include "loom/train/verify.h"
#include "support/train_threads.h"

namespace loom {
namespace {

using Sets = std::vector<std::string>;

// GPT ties its head to wte (every rank's rows serve both); Llama's head is its own tensor.
Config base(bool llama, Sets extra = {}) {
  Sets sets = {"model.layers=8", "model.d_model=64", "model.heads=4", "model.ffn=128", "model.ctx=32",
               "train.seq=32", "train.batch=16", "train.steps=4", "train.val_batches=1", "train.val_every=2",
               "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60"};
  if (llama) sets.insert(sets.end(), {"model.preset=llama", "model.kv_heads=2", "model.ffn=96"});
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

void expect_every_layout_exact(const Config& c, const std::vector<Sets>& layouts, const std::string& what) {
  const std::vector<VerifyRow> rows = verify_layouts(c, layouts);
  ASSERT_EQ(rows.size(), layouts.size()) << what;
  for (const VerifyRow& r : rows)
    EXPECT_TRUE(r.ok) << what << " " << r.layout << ": loss " << r.max_loss_rel << ", weights " << r.max_weight_abs
                      << " " << r.error;
}

TEST(PpVocab, EveryFlushingScheduleEqualsTheSingleProcessRun) {
  std::vector<Sets> layouts;
  for (int pp = 2; pp <= 4; ++pp)
    for (const char* s : {"gpipe", "1f1b", "zb-h1", "zb-h2"})
      layouts.push_back({"parallel.pp=" + std::to_string(pp), "parallel.pp_vocab=true",
                         std::string("parallel.schedule=") + s, "train.grad_accum=8"});
  for (int pp : {2, 4})
    layouts.push_back({"parallel.pp=" + std::to_string(pp), "parallel.pp_vocab=true", "parallel.schedule=interleaved",
                       "parallel.vpp=2", "train.grad_accum=8"});
  for (int pp : {2, 3, 4})
    layouts.push_back({"parallel.pp=" + std::to_string(pp), "parallel.pp_vocab=true", "parallel.schedule=zb-v",
                       "parallel.vpp=2", "train.grad_accum=4"});
  expect_every_layout_exact(base(false), layouts, "gpt");
  expect_every_layout_exact(base(true), layouts, "llama");
}

TEST(PpVocab, ComposesWithTensorSequenceContextAndDataParallelZeroOffloadAndPrecision) {
  const std::vector<Sets> layouts = {
      {"parallel.pp=2", "parallel.tp=2", "parallel.pp_vocab=true", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.tp=2", "parallel.pp_vocab=true", "parallel.vocab_parallel=false",
       "train.grad_accum=4"},
      {"parallel.pp=3", "parallel.tp=2", "parallel.pp_vocab=true", "parallel.schedule=zb-h2", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.tp=2", "parallel.sp=true", "parallel.pp_vocab=true", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.tp=2", "parallel.sp=true", "parallel.pp_vocab=true", "parallel.vocab_parallel=false",
       "parallel.recompute=full", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.pp_vocab=true", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.zero=1", "parallel.pp_vocab=true", "parallel.schedule=zb-v",
       "parallel.vpp=2", "train.grad_accum=2"},
      {"parallel.pp=2", "parallel.tp=2", "parallel.dp=2", "parallel.pp_vocab=true", "parallel.schedule=interleaved",
       "parallel.vpp=2", "train.grad_accum=2"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.zero=2", "parallel.pp_vocab=true", "train.grad_accum=4"},
      {"parallel.pp=3", "parallel.dp=2", "parallel.zero=3", "parallel.pp_vocab=true", "parallel.schedule=zb-h1",
       "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "parallel.pp_vocab=true", "offload.params=disk",
       "offload.optimizer=disk", "offload.dir=" + ::testing::TempDir(), "train.grad_accum=2"},
      {"parallel.pp=2", "parallel.cp=2", "parallel.pp_vocab=true", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.cp=2", "parallel.cp_mode=ring", "parallel.pp_vocab=true", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.pp_vocab=true", "parallel.recompute=selective", "train.grad_accum=4"},
      {"parallel.pp=2", "parallel.pp_vocab=true", "train.precision=bf16", "train.grad_accum=4"},
  };
  expect_every_layout_exact(base(false), layouts, "gpt");
  expect_every_layout_exact(base(true), layouts, "llama");
}

int64_t params_bytes(const TrainSummary& s) {
  for (const auto& [name, bytes] : s.memory_peak_bytes)
    if (name == "params") return bytes;
  return -1;
}

// Every rank holds ceil(V / pp) rows of the one tied table: the last stage keeps no copy of
// wte, the first its rows only, a middle stage its rows besides its blocks; summed over the
// pipeline, the model once.
TEST(PpVocab, EveryRankHoldsItsRowsAndTheTiedTableHasNoCopy) {
  for (int pp : {2, 3}) {
    const Sets layout = {"parallel.pp=" + std::to_string(pp), "train.grad_accum=4"};
    Sets vocab = layout;
    vocab.push_back("parallel.pp_vocab=true");
    const Config plain_cfg = base(false, layout), vocab_cfg = base(false, vocab);
    const std::vector<TrainSummary> plain = testing_support::train_as_threads(plain_cfg);
    const std::vector<TrainSummary> split = testing_support::train_as_threads(vocab_cfg);
    ASSERT_EQ(split.size(), size_t(pp));
    const ModelConfig& m = vocab_cfg.model;
    const int64_t rows = (m.vocab + pp - 1) / pp, whole = m.vocab * m.d_model * 4, mine = rows * m.d_model * 4;
    EXPECT_EQ(params_bytes(split[0]), params_bytes(plain[0]) - whole + mine) << "pp " << pp << " first stage";
    EXPECT_EQ(params_bytes(split.back()), params_bytes(plain.back()) - whole + mine) << "pp " << pp << " last stage";
    for (int r = 1; r + 1 < pp; ++r)
      EXPECT_EQ(params_bytes(split[size_t(r)]), params_bytes(plain[size_t(r)]) + mine) << "pp " << pp << " rank " << r;
    int64_t held = 0;
    for (int r = 0; r < pp; ++r)
      held += ParamLayout(m, {}, parallel::rank_part(vocab_cfg, r, 0)).param_count();
    EXPECT_EQ(held, ParamLayout(m).param_count() + (rows * pp - m.vocab) * m.d_model) << "pp " << pp;  // + padding rows
    EXPECT_EQ(split.back().losses, split[0].losses);
    EXPECT_NEAR(split[0].final_val_loss, plain[0].final_val_loss, 1e-5 * plain[0].final_val_loss) << "pp " << pp;
  }
}

}  // namespace
}  // namespace loom
