// Test helper: Debian's fortunes/people (one fortune per document) as token shards.
#pragma once

#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/data/prepare.h"
#include "support/train_threads.h"

namespace loom::testing_support {

// `tokenizer`: "byte" or a path under the fixtures' tokenizers/ folder (e.g.
// "fortunes-1k.model", "gpt2"); `shard_tokens` 0 keeps prepare's default; `file` another of
// the fortunes files (e.g. "computers").
inline void prepare_fortune_shards(const std::string& tokenizer, const std::string& out, int64_t shard_tokens = 0,
                                   const std::string& file = "people") {
  std::string path = tokenizer;
  if (tokenizer != "byte") path = std::string(LOOM_FIXTURE_DIR) + "/tokenizers/" + tokenizer;
  const auto tok = data::load_tokenizer(path);
  data::PrepareOptions o;
  o.in = "/usr/share/games/fortunes/" + file;
  o.out = out;
  o.doc_separator = std::string(1, '%');
  if (shard_tokens > 0) o.shard_tokens = shard_tokens;
  data::prepare_shards(*tok, path, o);
}

// A tiny 2-layer byte model on `shards` (a directory or a mixture) for 6 steps of 8 rows,
// saving every 3 steps into `ckpt`; `extra` sets follow (and win).
inline Config shard_run_config(const std::string& shards, const std::string& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"data.shards=" + shards, "model.preset=tiny", "model.layers=2", "model.d_model=64",
                                   "model.heads=4", "model.ffn=256", "model.ctx=32", "train.batch=8",
                                   "train.steps=6", "train.val_batches=1", "train.val_every=0", "train.threads=1",
                                   "checkpoint.save_every=3", "checkpoint.dir=" + ckpt, "optim.warmup_steps=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// Trains shard_run_config(shards, dir/a) whole, then resumes its step 3 on each layout
// (dir/b0, b1 ...) and expects steps 4-6 where the whole run had them: the same rows summed
// in another order, so fp32 rounding only. Returns the whole run's and the resumed runs'
// rank-0 summaries.
inline std::vector<TrainSummary> expect_resumes_where_it_would_have_been(
    const std::string& shards, const std::string& dir, const std::vector<std::vector<std::string>>& layouts,
    const std::vector<std::string>& common = {}) {
  std::vector<TrainSummary> out = {train_keeping_params(shard_run_config(shards, dir + "/a", common))[0]};
  EXPECT_EQ(out[0].losses.size(), 6u);
  for (const std::vector<std::string>& layout : layouts) {
    std::vector<std::string> sets = common;
    sets.insert(sets.end(), layout.begin(), layout.end());
    const std::string ckpt = dir + "/b" + std::to_string(out.size() - 1);
    out.push_back(train_keeping_params(shard_run_config(shards, ckpt, sets), dir + "/a/step-00000003").back());
    EXPECT_EQ(out.back().losses.size(), 3u);
    for (size_t i = 0; i < 3 && i < out.back().losses.size() && 3 + i < out[0].losses.size(); i++)
      EXPECT_NEAR(out.back().losses[i], out[0].losses[3 + i], 1e-5 * out[0].losses[3 + i])
          << layout[0] << " step " << 4 + i;
  }
  return out;
}

}  // namespace loom::testing_support

