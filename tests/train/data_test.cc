#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/data/loader.h"
#include "support/loom_cli.h"

namespace loom {
namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/loom_data_" + name; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Data, Utf8Validation) {
  auto bad = [](std::string s) {
    return first_invalid_utf8(reinterpret_cast<const uint8_t*>(s.data()), int64_t(s.size()));
  };
  EXPECT_EQ(bad("plain ascii"), -1);
  EXPECT_EQ(bad("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), -1);
  EXPECT_EQ(bad("ab\xff"), 2);
  EXPECT_EQ(bad("ab\xc3"), 2);              // truncated sequence
  EXPECT_EQ(bad("\xc0\xaf"), 0);            // overlong
  EXPECT_EQ(bad("x\xed\xa0\x80"), 1);       // surrogate
}

TEST(Data, DefaultCorpusSplitsDeterministically) {
  Corpus a = load_corpus("", 0.1, 128);
  Corpus b = load_corpus("", 0.1, 128);
  EXPECT_GT(a.files.size(), 10u);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.val, b.val);
  const double frac = double(a.val.size()) / double(a.val.size() + a.train.size());
  EXPECT_NEAR(frac, 0.1, 0.01);
  EXPECT_GT(a.unigram_entropy_nats, 2.5);  // English text: ~3.3 nats per byte
  EXPECT_LT(a.unigram_entropy_nats, 4.0);
}

TEST(Data, BadCorporaGetClearErrors) {
  const std::string empty = temp_path("empty.txt");
  std::ofstream(empty).close();
  EXPECT_NE(error_of([&] { load_corpus(empty, 0.1, 16); }).find("is empty"), std::string::npos);
  const std::string latin1 = temp_path("latin1.txt");
  std::ofstream(latin1) << std::string(100, 'a') << "caf\xe9";
  EXPECT_NE(error_of([&] { load_corpus(latin1, 0.1, 16); }).find("not valid UTF-8 at byte offset 103"), std::string::npos);
  EXPECT_NE(error_of([&] { load_corpus("/no/such/corpus", 0.1, 16); }).find("does not exist"), std::string::npos);
  const std::string small = temp_path("small.txt");
  std::ofstream(small) << "hello world";
  EXPECT_NE(error_of([&] { load_corpus(small, 0.1, 16); }).find("at least seq+1 = 17"), std::string::npos);
}

TEST(Data, DirectoryCorpusReadsFilesInSortedOrder) {
  const std::string dir = temp_path("dir");
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/b.txt") << std::string(5000, 'b');
  std::ofstream(dir + "/a.txt") << std::string(5000, 'a');
  std::ofstream(dir + "/sub/c.txt") << std::string(5000, 'c');
  Corpus c = load_corpus(dir, 0.5, 8);  // k = 2: every second 4 KiB block is validation
  ASSERT_EQ(c.files.size(), 3u);
  EXPECT_EQ(c.files[0], dir + "/a.txt");
  EXPECT_EQ(c.train.size() + c.val.size(), 15000u);
  EXPECT_EQ(c.train.front(), 'a');
  EXPECT_EQ(c.val.size(), 4096u + (15000u - 3 * 4096u));  // blocks 1 and 3 (the short last one)
}

TEST(Data, ShardsAndMicroBatchesPartitionTheGlobalBatch) {
  std::vector<uint8_t> text(10000);
  for (size_t i = 0; i < text.size(); i++) text[i] = uint8_t((i * 7919) % 251);
  const int64_t T = 16, B = 12;
  DataLoader whole(text, T, 42);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  whole.train_batch(5, 0, 1, B, tok.data(), tgt.data());
  for (int64_t i = 0; i < B * T; i++) {
    if (i % T != T - 1) {
      EXPECT_EQ(tgt[i], tok[i + 1]);  // targets are the next token
    }
  }
  // 3 shards x 2 micro-batches reproduce the same rows in order.
  std::vector<int32_t> got;
  for (int shard = 0; shard < 3; shard++) {
    DataLoader part(text, T, 42, shard, 3);
    for (int micro = 0; micro < 2; micro++) {
      std::vector<int32_t> t(2 * T), g(2 * T);
      EXPECT_EQ(part.train_batch(5, micro, 2, B, t.data(), g.data()), 2);
      got.insert(got.end(), t.begin(), t.end());
    }
  }
  EXPECT_EQ(got, tok);
  // A different step or seed reads different windows.
  std::vector<int32_t> other(B * T);
  whole.train_batch(6, 0, 1, B, other.data(), tgt.data());
  EXPECT_NE(other, tok);
  DataLoader reseeded(text, T, 43);
  reseeded.train_batch(5, 0, 1, B, other.data(), tgt.data());
  EXPECT_NE(other, tok);
  EXPECT_THROW(DataLoader(text, T, 1, 0, 5).shard_rows(B), Error);  // 12 rows over 5 shards
}

TEST(Data, ByteTokenizerRoundTrips) {
  const std::string s = "h\xc3\xa9llo\n";
  auto t = encode_bytes(s);
  ASSERT_EQ(t.size(), s.size());
  EXPECT_EQ(t[1], 0xc3);
  EXPECT_EQ(decode_bytes(t), s);
}

// `loom data batches` writes exactly what the run's loaders read: the global batch of each
// step, dp ranks in order, micro-batches in order (the file another framework trains on).
TEST(Data, BatchesCommandWritesWhatTheLoadersRead) {
  const std::string out = temp_path("batches.bin");
  std::filesystem::remove(out);  // an earlier run's file carries no mark: it would need --overwrite
  const std::vector<std::string> sets = {"model.preset=tiny", "train.batch=4", "train.seq=32", "parallel.dp=2",
                                         "train.grad_accum=2"};
  std::string args = "data batches --steps 3 --out " + out;
  for (const std::string& s : sets) args += " --set " + s;
  const auto r = testing_support::run_loom(args);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream f(out, std::ios::binary);
  std::vector<int32_t> got;
  int32_t v;
  while (f.read(reinterpret_cast<char*>(&v), 4)) got.push_back(v);
  const int64_t B = 4, T = 32, steps = 3;
  ASSERT_EQ(int64_t(got.size()), 2 + steps * 2 * B * T);
  EXPECT_EQ(got[0], B);
  EXPECT_EQ(got[1], T);
  const Config cfg = load_config("", sets);
  const auto data = load_train_data(cfg, T);
  std::vector<int32_t> tok(size_t(B * T)), tgt(tok.size());
  for (int64_t step = 0; step < steps; step++) {
    int64_t at = 0;
    for (int r = 0; r < 2; r++) {
      const DataLoader loader(*data->train, T, uint64_t(cfg.train.seed), r, 2, data->order);
      for (int m = 0; m < 2; m++, at += T) loader.train_batch(step, m, 2, B, tok.data() + at, tgt.data() + at);
    }
    const int32_t* file = got.data() + 2 + step * 2 * B * T;
    EXPECT_TRUE(std::equal(tok.begin(), tok.end(), file)) << step;
    EXPECT_TRUE(std::equal(tgt.begin(), tgt.end(), file + B * T)) << step;
  }
}

}  // namespace
}  // namespace loom
