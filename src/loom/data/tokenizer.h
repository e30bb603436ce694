// Tokenizers behind one interface: byte, byte-level BPE (Hugging Face tokenizer.json or
// GPT-2's vocab.json + merges.txt) and SentencePiece models.
//
// Note [Tokenizer semantics]: encode() is Hugging Face's `encode(text,
// add_special_tokens=False)`: no template (BOS/EOS) is added, but special tokens written in
// the text (e.g. "<|endoftext|>") are recognised when `special` is kRecognize. Data
// preparation encodes documents with kPlain (text is text) and appends end_of_document()
// itself, as llm.c's and Megatron's preparers do. decode() is the exact inverse for
// byte-level BPE and the byte tokenizer: decode(encode(x)) == x for every valid UTF-8 x.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

enum class Special { kPlain, kRecognize };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws loom::Error for text that is not valid UTF-8 (naming the byte offset).
  virtual std::vector<int32_t> encode(std::string_view text, Special special = Special::kRecognize) const = 0;
  // Throws loom::Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The token that ends a document (<|endoftext|>, <|end_of_text|>, </s>), or -1 if the
  // vocabulary has none.
  virtual int32_t end_of_document() const = 0;
  // "byte", "bpe (tokenizer.json)", "bpe (vocab.json + merges.txt)", "sentencepiece bpe", ...
  virtual std::string kind() const = 0;
  // The text of one token (for error messages and `loom tokenizer encode --pieces`).
  virtual std::string piece(int32_t id) const = 0;
};

// "byte" (or empty): the byte tokenizer; a `tokenizer.json`; a directory holding
// `tokenizer.json`, or `vocab.json` + `merges.txt`, or one `*.model`; a SentencePiece
// `.model` file. Throws loom::Error naming the path and what was expected.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// Token = byte value; vocab 256, no end-of-document token.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Offset of the first byte that is not valid UTF-8, or -1 (overlong forms, surrogates and
// code points past U+10FFFF are invalid).
int64_t first_invalid_utf8(const uint8_t* data, int64_t n);
// Throws loom::Error "<what> is not valid UTF-8 at byte offset N" when it is not.
void require_utf8(std::string_view text, const std::string& what);

}  // namespace loom::data
