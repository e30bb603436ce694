// StreamDecoder (Note [Streaming decode]) against decode() of the whole sequence, on every
// tokenizer kind, over random ids (byte-fallback pieces included) and over encoded text.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "loom/data/stream_decode.h"
#include "loom/data/tokenizer.h"

namespace {

const std::string kDir = std::string(LOOM_FIXTURE_DIR) + "/tokenizers";

// Streams ids one by one; returns the concatenated text and counts pushes that returned text.
std::string streamed(const loom::data::Tokenizer& tok, const std::vector<int32_t>& ids, int* nonempty = nullptr) {
  loom::data::StreamDecoder dec(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    if (nonempty && !piece.empty()) ++*nonempty;
    out += piece;
  }
  return out + dec.finish();
}

std::vector<std::unique_ptr<loom::data::Tokenizer>> tokenizers() {
  std::vector<std::unique_ptr<loom::data::Tokenizer>> toks;
  toks.push_back(loom::data::load_tokenizer(kDir + "/gpt2"));
  toks.push_back(loom::data::load_tokenizer("byte"));
  toks.push_back(loom::data::load_tokenizer(kDir + "/fortunes-1k.model"));
  return toks;
}

// Ids whose piece is a SentencePiece byte-fallback piece ("<0xE3>"); empty for other kinds.
std::vector<int32_t> byte_pieces(const loom::data::Tokenizer& tok) {
  std::vector<int32_t> out;
  if (tok.kind() != "sentencepiece") return out;
  for (int32_t id = 0; id < tok.vocab_size(); id++)
    if (tok.piece(id).rfind("<0x", 0) == 0) out.push_back(id);
  return out;
}

TEST(StreamDecode, EqualsWholeDecodeOnRandomIds) {
  std::mt19937 rng(std::random_device{}());
  for (const auto& tok : tokenizers()) {
    const auto bytes = byte_pieces(*tok);
    if (tok->kind() == "sentencepiece") {
      ASSERT_GE(bytes.size(), 256u) << "the fixture has byte fallback";
    }
    for (int trial = 0; trial < 60; trial++) {
      std::vector<int32_t> ids(rng() % 300);
      for (auto& id : ids)
        id = !bytes.empty() && rng() % 2 ? bytes[rng() % bytes.size()] : int32_t(rng() % tok->vocab_size());
      ASSERT_EQ(streamed(*tok, ids), tok->decode(ids)) << tok->kind() << " trial " << trial;
    }
  }
}

TEST(StreamDecode, EqualsWholeDecodeOnTextAndStreamsAsItGoes) {
  // Multi-byte characters (byte-fallback pieces in the small SentencePiece model) between words.
  std::string text;
  for (int i = 0; i < 200; i++) text += i % 3 ? "word" + std::to_string(i) + " " : "\xE3\x81\x82\xF0\x9F\x98\x80 ";
  for (const auto& tok : tokenizers()) {
    const auto ids = tok->encode(text);
    int nonempty = 0;
    EXPECT_EQ(streamed(*tok, ids, &nonempty), text) << tok->kind();
    EXPECT_GT(nonempty, int(ids.size()) / 4) << tok->kind() << ": the text must come out as the ids arrive";
  }
}

TEST(StreamDecode, HoldsAnUnfinishedCharacterUntilItCompletes) {
  auto tok = loom::data::load_tokenizer("byte");
  loom::data::StreamDecoder dec(*tok);
  EXPECT_EQ(dec.push('a'), "a");
  EXPECT_EQ(dec.push(0xE3), "");
  EXPECT_EQ(dec.push(0x81), "");
  EXPECT_EQ(dec.push(0x82), "\xE3\x81\x82");
  EXPECT_EQ(dec.push(0xF0), "");
  EXPECT_EQ(dec.finish(), "\xF0");  // an unfinished character at the end comes out as decoded
}

}  // namespace
