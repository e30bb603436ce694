// Token shards (round trip, damage refused, llm.c's format) and `prepare_shards`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/prepare.h"
#include "loom/data/shards.h"
#include "support/error_message.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using loom::testing_support::error_message;
using loom::testing_support::TempDir;

namespace {


bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Shards, RoundTripBothWidthsOnRandomTokens) {
  TempDir d;
  std::mt19937 rng(std::random_device{}());
  for (uint64_t vocab : {256ull, 50257ull, 65536ull, 128256ull}) {
    std::vector<uint32_t> toks(1000 + rng() % 5000);
    for (auto& t : toks) t = uint32_t(rng() % vocab);
    std::vector<uint64_t> starts = {0};
    while (starts.back() + 50 < toks.size()) starts.push_back(starts.back() + 1 + rng() % 49);
    loom::data::ShardHeader h;
    h.vocab_size = vocab;
    h.token_bytes = vocab <= 65536 ? 2 : 4;
    h.end_of_document = int64_t(vocab - 1);
    h.tokenizer = "test v" + std::to_string(vocab);
    loom::data::write_shard(d / "s.bin", h, toks, starts);
    const loom::data::Shard s(d / "s.bin");
    ASSERT_EQ(s.size(), toks.size());
    for (size_t i = 0; i < toks.size(); i++) ASSERT_EQ(s.token(i), toks[i]);
    EXPECT_EQ(s.doc_starts(), starts);
    EXPECT_EQ(s.header().tokenizer, h.tokenizer);
    EXPECT_EQ(s.header().end_of_document, h.end_of_document);
    EXPECT_EQ(fs::file_size(d / "s.bin"), 256 + toks.size() * size_t(h.token_bytes) + starts.size() * 8);
  }
}

TEST(Shards, DamagedShardsAreRefusedNamingTheProblem) {
  TempDir d;
  std::vector<uint32_t> toks(100, 7);
  loom::data::ShardHeader h;
  h.vocab_size = 300;
  loom::data::write_shard(d / "s.bin", h, toks, std::vector<uint64_t>{0, 40});
  const std::string good = loom::read_file_bytes(d / "s.bin");
  auto with = [&](std::string bytes) {
    loom::write_file_atomic(d / "bad.bin", bytes);
    return error_message([&] { loom::data::Shard s(d / "bad.bin"); });
  };
  EXPECT_TRUE(contains(with(good.substr(0, good.size() - 3)), "the file is truncated")) << with(good.substr(0, 300));
  EXPECT_TRUE(contains(with(good + "x"), "longer than written"));
  std::string flipped = good;
  flipped[300] ^= 1;
  EXPECT_TRUE(contains(with(flipped), "body CRC mismatch"));
  flipped = good;
  flipped[20] ^= 1;
  EXPECT_TRUE(contains(with(flipped), "header CRC mismatch"));
  EXPECT_TRUE(contains(with("LOOMTOK"), "shorter than its 256-byte header"));
  EXPECT_TRUE(contains(with(std::string(300, 'x')), "neither \"LOOMTOKS\" nor llm.c's magic"));
  EXPECT_TRUE(contains(error_message([&] { loom::data::Shard s(d / "none.bin"); }), "cannot open shard"));
  std::vector<uint32_t> big = {1, 2, 400};
  EXPECT_TRUE(contains(error_message([&] { loom::data::write_shard(d / "x.bin", h, big, std::vector<uint64_t>{0}); }),
                       "token 400 at 2 is outside the vocabulary of 300"));
}

// llm.c's dev/data/data_common.py layout: int32 header[256] = {20240520, 1, n}, uint16 tokens,
// each document led by <|endoftext|> (50256).
TEST(Shards, ReadsLlmcShards) {
  TempDir d;
  const std::vector<uint16_t> toks = {50256, 10, 11, 12, 50256, 20, 21, 50256, 30};
  std::string bytes(1024 + toks.size() * 2, '\0');
  const int32_t head[3] = {20240520, 1, int32_t(toks.size())};
  std::memcpy(bytes.data(), head, sizeof head);
  std::memcpy(bytes.data() + 1024, toks.data(), toks.size() * 2);
  loom::write_file_atomic(d / "fineweb_train_000001.bin", bytes);
  const auto shards = loom::data::open_shards(d.path.string());
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_EQ(shards[0]->header().format, "llm.c");
  EXPECT_EQ(shards[0]->header().vocab_size, 50257u);
  EXPECT_EQ(shards[0]->doc_starts(), (std::vector<uint64_t>{0, 4, 7}));
  for (size_t i = 0; i < toks.size(); i++) EXPECT_EQ(shards[0]->token(i), toks[i]);
  loom::write_file_atomic(d / "fineweb_train_000001.bin", bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(contains(error_message([&] { loom::data::open_shards(d.path.string()); }), "truncated"));
}

// Three fortune-style files: documents split on "%" lines; every 3rd document to validation.
struct PrepareFixture {
  TempDir d;
  std::vector<std::string> docs;  // in input order
  PrepareFixture() {
    fs::create_directories(d.path / "in");
    std::mt19937 rng(std::random_device{}());
    const std::vector<std::string> words = {"the", "cat", "Grüße", "你好", "sat", "😀", "on", "mat\n", "it's"};
    for (int f = 0; f < 3; f++) {
      std::string text;
      for (int k = 0; k < 5 + int(rng() % 5); k++) {
        std::string doc;
        for (int w = 0; w < 1 + int(rng() % 30); w++) doc += words[rng() % words.size()] + " ";
        doc += "\n";
        docs.push_back(doc);
        text += doc + "%\n";
      }
      loom::write_file_atomic((d.path / "in" / ("f" + std::to_string(f) + ".txt")).string(), text);
    }
  }
  loom::data::PrepareOptions options(const std::string& out) const {
    loom::data::PrepareOptions o;
    o.in = d / "in";
    o.out = d / out;
    o.doc_separator = "%";
    o.val_fraction = 1.0 / 3;
    o.shard_tokens = 1024;
    return o;
  }
};

std::vector<std::string> decoded_docs(const loom::data::Tokenizer& tok, const std::string& dir, const std::string& split) {
  std::vector<std::string> out;
  for (const auto& s : loom::data::open_shards(dir)) {
    if (fs::path(s->path()).filename().string().rfind(split, 0) != 0) continue;
    const auto& st = s->doc_starts();
    for (size_t i = 0; i < st.size(); i++) {
      const uint64_t end = i + 1 < st.size() ? st[i + 1] : s->size();
      std::vector<int32_t> ids;
      for (uint64_t t = st[i]; t < end; t++) ids.push_back(int32_t(s->token(t)));
      if (tok.end_of_document() >= 0) {
        EXPECT_EQ(ids.back(), tok.end_of_document());
        ids.pop_back();
      }
      out.push_back(tok.decode(ids));
    }
  }
  return out;
}

TEST(Prepare, ShardsHoldEveryDocumentOnceInOrderWhateverTheThreads) {
  PrepareFixture fx;
  const auto tok = loom::data::load_tokenizer(std::string(LOOM_FIXTURE_DIR) + "/tokenizers/gpt2");
  // A strfile index beside its text (as in Debian's fortunes) is not input.
  loom::write_file_atomic(fx.d / "in/f0.txt.dat", std::string("\x00\x00\x00\x02\xff\xfe", 6));
  auto o1 = fx.options("one");
  o1.threads = 1;
  const auto st = loom::data::prepare_shards(*tok, "gpt2", o1);
  std::vector<std::string> train, val;
  for (size_t i = 0; i < fx.docs.size(); i++) (i % 3 == 2 ? val : train).push_back(fx.docs[i]);
  EXPECT_EQ(decoded_docs(*tok, fx.d / "one", "train"), train);
  EXPECT_EQ(decoded_docs(*tok, fx.d / "one", "val"), val);
  EXPECT_EQ(st.docs[0], train.size());
  EXPECT_EQ(st.docs[1], val.size());
  EXPECT_TRUE(fs::exists(fx.d / "one/prepare.json"));
  auto o2 = fx.options("two");
  o2.threads = 2;
  loom::data::prepare_shards(*tok, "gpt2", o2);
  for (const auto& e : fs::directory_iterator(fx.d / "one")) {
    if (e.path().extension() != ".bin") continue;
    EXPECT_EQ(loom::read_file_bytes(e.path().string()),
              loom::read_file_bytes(fx.d / ("two/" + e.path().filename().string())));
  }
}

// Note [Document pieces]: a document encoded in pieces of 64 bytes (cut at single spaces)
// gives the same shards, byte for byte, as one encoded whole, for each kind of tokenizer
// loom reads (bytes, GPT-2 byte-level BPE, SentencePiece), on text with every kind of
// spacing the cut rule must respect (double spaces, tabs, newlines, digits, non-ASCII).
TEST(Prepare, LongDocumentsEncodedInPiecesEqualTheWholeDocument) {
  TempDir d;
  fs::create_directories(d.path / "in");
  const std::string sample = loom::read_file_bytes(std::string(LOOM_FIXTURE_DIR) + "/tokenizers/sample.txt");
  std::string text;
  std::mt19937 rng(59);
  const std::vector<std::string> glue = {" ", "  ", "\t", "\n", " \n ", "   x ", " 12345 ", " Grüße ", " , "};
  std::vector<std::string> lines;  // whole lines, so no UTF-8 sequence is cut
  for (size_t at = 0, end; at < sample.size(); at = end + 1) {
    end = std::min(sample.find('\n', at), sample.size());
    if (end > at) lines.push_back(sample.substr(at, end - at));
  }
  for (int i = 0; i < 60; ++i) text += lines[rng() % lines.size()] + glue[rng() % glue.size()];
  loom::write_file_atomic((d.path / "in" / "one.txt").string(), text);
  const std::string fixtures = std::string(LOOM_FIXTURE_DIR) + "/tokenizers/";
  for (const std::string& name : {std::string("byte"), fixtures + "gpt2", fixtures + "fortunes-1k.model"}) {
    const auto tok = loom::data::load_tokenizer(name);
    std::vector<std::string> shards[2];
    for (int pieces = 0; pieces < 2; ++pieces) {
      loom::data::PrepareOptions o;
      o.in = d / "in/one.txt";
      o.out = d / ("out" + std::to_string(pieces));
      o.val_fraction = 0;
      o.piece_bytes = pieces ? 64 : int64_t(1) << 30;
      o.overwrite = true;
      const loom::data::PrepareStats st = loom::data::prepare_shards(*tok, name, o);
      if (pieces) EXPECT_GT(st.pieces, 20u) << name << ": the document was not cut";
      for (const auto& e : fs::directory_iterator(o.out))
        if (e.path().extension() == ".bin") shards[pieces].push_back(loom::read_file_bytes(e.path().string()));
    }
    ASSERT_EQ(shards[0].size(), 1u) << name;
    EXPECT_EQ(shards[1], shards[0]) << name << ": pieces changed the tokens";
  }
}

TEST(Prepare, RefusesBadInputsAndLeavesNothingHalfWritten) {
  PrepareFixture fx;
  const auto tok = loom::data::load_tokenizer("byte");
  auto o = fx.options("out");
  loom::data::prepare_shards(*tok, "byte", o);
  EXPECT_TRUE(contains(error_message([&] { loom::data::prepare_shards(*tok, "byte", o); }), "pass --overwrite"));
  o.overwrite = true;
  loom::data::prepare_shards(*tok, "byte", o);
  loom::write_file_atomic(fx.d / "out/mine.txt", "user file");
  EXPECT_TRUE(contains(error_message([&] { loom::data::prepare_shards(*tok, "byte", o); }),
                       "did not write (mine.txt)"));
  loom::write_file_atomic(fx.d / "in/f1.txt", std::string("ok\n%\nbad \xC3\x28 here\n", 17));
  o.out = fx.d / "fresh";
  EXPECT_TRUE(contains(error_message([&] { loom::data::prepare_shards(*tok, "byte", o); }),
                       "f1.txt' is not valid UTF-8 at byte offset 9"));
  EXPECT_FALSE(fs::exists(fx.d / "fresh"));
  for (const auto& e : fs::directory_iterator(fx.d.path))
    EXPECT_EQ(e.path().filename().string().find(".loom-tmp-"), std::string::npos) << e.path();
  loom::write_file_atomic(fx.d / "in/f1.txt", "");
  EXPECT_TRUE(contains(error_message([&] { loom::data::prepare_shards(*tok, "byte", o); }), "f1.txt' is empty"));
  fs::remove(fx.d / "in/f1.txt");
  o.doc_separator = "";
  o.in = fx.d / "in/f0.txt";
  EXPECT_TRUE(contains(error_message([&] { loom::data::prepare_shards(*tok, "byte", o); }),
                       "too few for a validation split"));
}

TEST(Prepare, ReadsJsonlTextFields) {
  TempDir d;
  loom::write_file_atomic(d / "a.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\", \"id\": 2}\n\n{\"text\": \"three\"}\n");
  const auto tok = loom::data::load_tokenizer("byte");
  loom::data::PrepareOptions o;
  o.in = d / "a.jsonl";
  o.out = d / "out";
  o.val_fraction = 0;
  o.shard_tokens = 1024;
  loom::data::prepare_shards(*tok, "byte", o);
  EXPECT_EQ(decoded_docs(*tok, d / "out", "train"), (std::vector<std::string>{"one", "two", "three"}));
  loom::write_file_atomic(d / "a.jsonl", "{\"text\": \"one\"}\n{\"body\": 1}\n");
  o.overwrite = true;
  EXPECT_TRUE(contains(error_message([&] { loom::data::prepare_shards(*tok, "byte", o); }),
                       "line 2 (byte offset 16) has no string field \"text\""));
}

}  // namespace
