// Sparse embedding rows for parameter servers (Note [Sparse embeddings]): the row and piece
// arithmetic, a sparse step against the dense one, lazy AdamW's untouched rows, the bytes,
// and refusals.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/model/layout.h"
#include "loom/modes/ps/ps_sparse.h"
#include "loom/train/trainer.h"
#include "support/error_message.h"
#include "support/train_threads.h"

namespace loom {
namespace {

using parallel::PsTable;

// A table of 5 rows of 3 floats at offset 4 in a 24-float buffer: [0,4) dense, [4,19) table,
// [19,24) dense. Ranges cut rows apart; every float lands in exactly one piece.
TEST(SparseEmbedding, PiecesCoverRangesAndCutRowsAtServerBoundaries) {
  const PsTable t{4, 5, 3};
  const std::vector<FlatRange> servers = {{0, 8}, {8, 8}, {16, 8}};
  const std::vector<int32_t> rows = {0, 1, 3, 4};
  std::vector<int> covered(24, 0);
  for (const FlatRange& s : servers) {
    for (const FlatRange& d : parallel::dense_pieces(s, t))
      for (int64_t i = d.offset; i < d.offset + d.count; ++i) covered[size_t(i)] += 1;
    for (const FlatRange& r : parallel::table_part(s, t))
      for (int64_t i = r.offset; i < r.offset + r.count; ++i) covered[size_t(i)] += 10;
    for (const FlatRange& r : parallel::row_pieces(parallel::rows_within(rows, s, t), s, t))
      for (int64_t i = r.offset; i < r.offset + r.count; ++i) covered[size_t(i)] += 100;
  }
  for (int i = 0; i < 24; ++i) {
    const bool table = i >= 4 && i < 19, row = table && ((i - 4) / 3) != 2;
    EXPECT_EQ(covered[size_t(i)], table ? 10 + (row ? 100 : 0) : 1) << "float " << i;
  }
  // Row 1 is floats [7, 10): server 0 holds [7, 8), server 1 [8, 10).
  auto piece = [&](const FlatRange& s) {
    const std::vector<FlatRange> p = parallel::row_pieces({1}, s, t);
    return p.size() == 1 ? std::pair<int64_t, int64_t>{p[0].offset, p[0].count} : std::pair<int64_t, int64_t>{-1, -1};
  };
  EXPECT_EQ(piece(servers[0]), (std::pair<int64_t, int64_t>{7, 1}));
  EXPECT_EQ(piece(servers[1]), (std::pair<int64_t, int64_t>{8, 2}));
  EXPECT_EQ(parallel::rows_within(rows, servers[2], t), (std::vector<int32_t>{4}));
  parallel::RowSet set(5);
  const int32_t a[] = {3, 1, 3, 0}, b[] = {1, 4};
  set.add(a, 4), set.add(b, 2);
  EXPECT_EQ(set.take(), (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_TRUE(set.take().empty());
}

// A Llama (untied embedding) whose rows straddle the servers' 1024-float keys (d = 48).
Config llama(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.arch=llama", "model.layers=2", "model.d_model=48", "model.heads=4",
                                   "model.kv_heads=2", "model.ffn=96", "model.ctx=32", "train.batch=8",
                                   "train.val_batches=1", "train.val_every=0", "train.threads=1", "checkpoint.dir=",
                                   "comm.timeout_s=60", "optim.warmup_steps=2", "optim.grad_clip=0",
                                   "parallel.dp=2", "parallel.ps_servers=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

std::vector<float> table_of(const Config& c, const std::vector<float>& params) {
  const ParamLayout layout(c.model);
  const ParamSpec& wte = layout.at("wte");
  return {params.begin() + wte.offset, params.begin() + wte.offset + wte.numel};
}

// One step from the same weights without weight decay: a touched row's mean gradient and
// AdamW update are the dense ones, and an untouched row stays where it is in both (zero
// gradient and zero moments move nothing), so every weight agrees bit for bit.
TEST(SparseEmbedding, OneStepEqualsDensePsBitForBit) {
  TrainOptions o;
  o.keep_params = true;
  const std::vector<std::string> one = {"train.steps=1", "optim.weight_decay=0"};
  std::vector<std::string> sparse = one;
  sparse.push_back("ps.sparse_embedding=true");
  const std::vector<TrainSummary> d = testing_support::train_as_threads(llama(one), o);
  const std::vector<TrainSummary> s = testing_support::train_as_threads(llama(sparse), o);
  EXPECT_EQ(s[0].losses, d[0].losses);
  EXPECT_EQ(s[0].final_params, d[0].final_params);
  EXPECT_EQ(s[1].final_params, d[0].final_params);
}

// Lazy AdamW: after a second step, the rows no worker touched in it hold exactly the
// one-step run's weights (no decay, no momentum drift), the touched rows moved, and the
// pulls before the end give every worker the servers' whole table.
TEST(SparseEmbedding, UntouchedRowsKeepTheirStateAndTouchedRowsMove) {
  const Config c = llama({"ps.sparse_embedding=true", "train.steps=2"});
  const ParamLayout layout(c.model);
  const ParamSpec& wte = layout.at("wte");
  std::mutex mu;
  std::set<int64_t> touched;  // rows with a gradient at step 1 (0-based) on any worker
  TrainOptions o;
  o.keep_params = true;
  o.after_gradients = [&](int64_t step, const std::vector<float>& g) {
    if (step != 1) return;
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t r = 0; r < wte.shape[0]; ++r)
      for (int64_t j = 0; j < wte.shape[1]; ++j)
        if (g[size_t(wte.offset + r * wte.shape[1] + j)] != 0.0f) touched.insert(r);
  };
  const std::vector<TrainSummary> two = testing_support::train_as_threads(c, o);
  const std::vector<TrainSummary> one =
      testing_support::train_as_threads(llama({"ps.sparse_embedding=true", "train.steps=1"}), o);
  ASSERT_FALSE(touched.empty());
  ASSERT_LT(int64_t(touched.size()), wte.shape[0]) << "the test needs rows the second step leaves alone";
  const std::vector<float> a = table_of(c, one[0].final_params), b = table_of(c, two[0].final_params);
  int64_t moved = 0;
  for (int64_t r = 0; r < wte.shape[0]; ++r)
    for (int64_t j = 0; j < wte.shape[1]; ++j) {
      const size_t i = size_t(r * wte.shape[1] + j);
      if (!touched.count(r)) EXPECT_EQ(b[i], a[i]) << "untouched row " << r;
      else moved += b[i] != a[i];
    }
  EXPECT_GT(moved, 0);
  EXPECT_EQ(two[1].final_params, two[0].final_params);
}

// The bytes: a sparse step moves the touched and pulled rows (and their ids), never the
// whole table both ways.
TEST(SparseEmbedding, MovesFewerTableBytesThanDense) {
  const TrainSummary d = testing_support::train_as_threads(llama({"train.steps=4", "model.vocab=2048"}))[0];
  const TrainSummary s =
      testing_support::train_as_threads(llama({"train.steps=4", "model.vocab=2048", "ps.sparse_embedding=true"}))[0];
  EXPECT_GT(d.ps_table_bytes_per_step, 0);
  EXPECT_LT(s.ps_table_bytes_per_step, d.ps_table_bytes_per_step);
  EXPECT_LT(s.ps_bytes_per_step, d.ps_bytes_per_step);
}

TEST(SparseEmbedding, RefusesTiedTablesAndFreeRunningModes) {
  auto error = [](std::vector<std::string> sets) {
    return testing_support::error_message([&] { llama(sets); });
  };
  EXPECT_NE(error({"model.arch=gpt", "ps.sparse_embedding=true"}).find("use model.arch = llama"), std::string::npos);
  EXPECT_NE(error({"ps.mode=async", "ps.sparse_embedding=true"}).find("ps.mode = sync only"), std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=0", "ps.sparse_embedding=true"}).find("need servers"), std::string::npos);
}

}  // namespace
}  // namespace loom
