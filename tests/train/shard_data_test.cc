// Training from token shards: Note [Epoch order] (a keyed bijection per epoch; dp ranks x
// steps read every window once per epoch, whatever the layout), and a run on shards that
// resumes on another layout where the uninterrupted run would be.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include "loom/data/prepare.h"
#include "loom/model/model.h"
#include "loom/data/source.h"
#include "loom/data/loader.h"
#include "loom/train/trainer.h"
#include "support/error_message.h"
#include "support/fortune_shards.h"
#include "support/global_batch.h"
#include "support/temp_dir.h"
#include "support/train_threads.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing_support::TempDir;

TEST(Permute, IsABijectionOfEverySize) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> sizes = {1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4096, 4097};
  for (int i = 0; i < 20; i++) sizes.push_back(1 + rng() % 20000);
  for (uint64_t n : sizes) {
    const uint64_t key = rng();
    std::vector<bool> seen(n);
    for (uint64_t i = 0; i < n; i++) {
      const uint64_t p = data::permute(i, n, key);
      ASSERT_LT(p, n);
      ASSERT_FALSE(seen[p]) << "n " << n << " i " << i;
      seen[p] = true;
    }
  }
  // Another key is another order.
  int same = 0;
  for (uint64_t i = 0; i < 1000; i++) same += data::permute(i, 1000, 1) == data::permute(i, 1000, 2);
  EXPECT_LT(same, 20);
}

// Two shards of random tokens read as one stream.
struct Stream {
  TempDir dir{"loom-epoch"};
  std::unique_ptr<data::ShardStream> stream;
  std::vector<int32_t> all;
  Stream() {
    std::mt19937 rng(std::random_device{}());
    std::vector<std::unique_ptr<data::Shard>> shards;
    for (uint64_t n : {1000u, 777u}) {
      std::vector<uint32_t> t(n);
      for (auto& x : t) x = rng() % 5000, all.push_back(int32_t(x));
      data::ShardHeader h;
      h.vocab_size = 5000;
      const std::string path = dir / ("train_" + std::to_string(n) + ".bin");
      data::write_shard(path, h, t, std::vector<uint64_t>{0});
      shards.push_back(std::make_unique<data::Shard>(path));
    }
    stream = std::make_unique<data::ShardStream>(std::move(shards));
  }
};

TEST(EpochOrder, DpRanksTimesStepsReadEveryWindowOncePerEpoch) {
  const Stream s;
  const int64_t T = 16, B = 6;
  const uint64_t W = (s.all.size() - 1) / T;  // 111 windows, the last crossing the shard boundary
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int k = 0; k < 2; k++) ranks.push_back(std::make_unique<DataLoader>(*s.stream, T, 7, k, 2, DataOrder::kEpoch));
  std::vector<std::multiset<uint64_t>> per_epoch(3);
  std::vector<int32_t> tok(size_t(3 * T)), tgt(size_t(3 * T));
  for (int64_t step = 0; step * B < int64_t(3 * W); step++) {
    for (int k = 0; k < 2; k++) {
      ASSERT_EQ(ranks[size_t(k)]->train_batch(step, 0, 1, B, tok.data(), tgt.data()), 3);
      for (int64_t i = 0; i < 3; i++) {
        const int64_t row = k * 3 + i;
        const uint64_t start = ranks[size_t(k)]->window_start(step, B, row);
        for (int64_t t = 0; t < T; t++) {  // the filled row is the stream at that window
          ASSERT_EQ(tok[size_t(i * T + t)], s.all[start + uint64_t(t)]);
          ASSERT_EQ(tgt[size_t(i * T + t)], s.all[start + uint64_t(t) + 1]);
        }
        const uint64_t g = uint64_t(step * B + row);
        if (g / W < 3) per_epoch[g / W].insert(start);
      }
    }
  }
  for (const auto& e : per_epoch) {
    ASSERT_EQ(e.size(), W);
    uint64_t w = 0;
    for (uint64_t start : e) EXPECT_EQ(start, T * w++);  // each window once: no gap, no overlap
  }
}

TEST(EpochOrder, TheGlobalBatchIsTheSameOnEveryLayout) {
  const Stream s;
  for (int64_t step : {0, 5, 300}) testing_support::expect_same_batch_on_dp4_x2(*s.stream, 8, 3, step);
}

using testing_support::shard_run_config;
int rng_tag = 0;  // distinct checkpoint directories per run

TEST(ShardData, ARunOnShardsResumesOnAnotherLayoutWhereItWouldHaveBeen) {
  TempDir d{"loom-shardrun"};
  testing_support::prepare_fortune_shards("byte", d / "shards", 40000);  // several shards: windows cross them
  const auto runs = testing_support::expect_resumes_where_it_would_have_been(
      d / "shards", d.path.string(), {{"parallel.dp=2"}, {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}});
  EXPECT_LT(runs[0].final_val_loss, std::log(256.0));
}

TEST(ShardData, RefusesAVocabularyTheModelCannotHold) {
  TempDir d{"loom-shardvocab"};
  testing_support::prepare_fortune_shards("gpt2", d / "shards");
  const Config c = shard_run_config(d / "shards", d / "a", {});
  try {
    load_train_data(c, 32);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.vocab = 256: set model.vocab = 50257 or more"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(std::string(testing_support::error_message([&] {
              load_config("", {"data.shards=x", "data.path=y"});
            })).find("are both set"), std::string::npos);
}

// Note [Document-causal mask]: with RoPE (relative positions) a document packed after
// another gives exactly the logits it gives alone; without the mask it does not.
TEST(DocumentMask, APackedLlamaDocumentSeesOnlyItself) {
  ModelConfig m;
  apply_model_preset(m, "llama");
  m.layers = 2, m.d_model = 64, m.heads = 4, m.kv_heads = 2, m.ffn = 128, m.vocab = 300, m.ctx = 24;
  Model model(m, 1, 24);
  model.init_weights(5);
  const int32_t eod = 299;
  std::mt19937 rng(std::random_device{}());
  std::vector<int32_t> window(24);
  for (auto& t : window) t = int32_t(rng() % 299);
  const size_t p = 9;  // document A = [0, 9], its end token at 9; document B = [10, 24)
  window[p] = eod;
  const std::vector<int32_t> b(window.begin() + p + 1, window.end());
  std::vector<float> alone, packed, unmasked;
  model.forward_logits(b.data(), 1, int64_t(b.size()), alone);
  model.forward_logits(window.data(), 1, 24, unmasked);
  model.set_document_mask(eod);
  model.forward_logits(window.data(), 1, 24, packed);
  float worst = 0, unmasked_gap = 0;
  for (size_t t = 0; t < b.size(); t++)
    for (int64_t v = 0; v < m.vocab; v++) {
      const float a = alone[t * 300 + size_t(v)];
      worst = std::max(worst, std::abs(packed[(p + 1 + t) * 300 + size_t(v)] - a));
      unmasked_gap = std::max(unmasked_gap, std::abs(unmasked[(p + 1 + t) * 300 + size_t(v)] - a));
    }
  EXPECT_LT(worst, 1e-4f);
  EXPECT_GT(unmasked_gap, 1e-2f);  // the mask is what makes them equal
  for (size_t t = 0; t <= p; t++)   // document A is unaffected by the mask
    for (int64_t v = 0; v < m.vocab; v++)
      EXPECT_EQ(packed[t * 300 + size_t(v)], unmasked[t * 300 + size_t(v)]);
}

// The mask in every layout: tp 2 x pp 2 with sp, and dp 2 with selective recompute, train
// the single-process run's losses.
TEST(DocumentMask, ParallelLayoutsMatchTheSingleProcessRun) {
  TempDir d{"loom-docmask"};
  testing_support::prepare_fortune_shards("fortunes-1k.model", d / "shards");
  auto cfg = [&](std::vector<std::string> extra) {
    extra.push_back("model.vocab=1000");
    extra.push_back("checkpoint.save_every=0");
    return shard_run_config(d / "shards", d / ("ck" + std::to_string(extra.size()) + std::to_string(rng_tag++)), extra);
  };
  const auto single = testing_support::train_as_threads(cfg({"data.doc_mask=true"}));
  const auto plain = testing_support::train_as_threads(cfg({}));
  EXPECT_NE(single[0].losses, plain[0].losses);  // windows hold several fortunes: the mask changes the loss
  for (const auto& layout : std::vector<std::vector<std::string>>{
           {"data.doc_mask=true", "parallel.tp=2", "parallel.pp=2", "train.grad_accum=2", "parallel.sp=true"},
           {"data.doc_mask=true", "parallel.dp=2", "parallel.zero=1", "parallel.recompute=selective"},
           // Note [Context-parallel chunks]: documents cross the chunk boundaries.
           {"data.doc_mask=true", "parallel.cp=2"},
           {"data.doc_mask=true", "parallel.cp=2", "parallel.dp=2", "parallel.cp_split=plain"},
           // Note [Ulysses attention]: the whole sequence's document starts on each rank's heads.
           {"data.doc_mask=true", "parallel.cp=2", "parallel.cp_mode=ulysses"},
           // Note [Ring attention]: each block's keys masked by their global positions.
           {"data.doc_mask=true", "parallel.cp=2", "parallel.cp_mode=ring", "parallel.dp=2"},
           // and its backward recomputes each block's probabilities under the same mask.
           {"data.doc_mask=true", "parallel.cp=4", "parallel.cp_mode=ring", "parallel.recompute=selective"}}) {
    const auto par = testing_support::train_as_threads(cfg(layout));
    ASSERT_EQ(par[0].losses.size(), single[0].losses.size());
    for (size_t i = 0; i < single[0].losses.size(); i++)
      EXPECT_NEAR(par.back().losses[i], single[0].losses[i], 2e-5 * single[0].losses[i]) << layout[1] << " step " << i + 1;
  }
}

}  // namespace
}  // namespace loom
