// SentencePiece models (Llama 2 style) through Debian's libsentencepiece: loading, and
// training a new vocabulary on a corpus.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path);

struct SpmTrainOptions {
  int64_t vocab = 8000;
  std::string type = "bpe";  // bpe | unigram
  int threads = 2;
  int64_t max_sentences = 2'000'000;  // lines sampled for training (SentencePiece's input_sentence_size)
};

// Trains on the lines of `files` and writes `out` (a .model) atomically. The model is
// lossless: identity normalization, byte fallback, whitespace kept, digits split (the Llama
// recipe), so decode(encode(x)) == x for every text without U+2581 ('▁'), the symbol
// SentencePiece writes for a space and decodes as one. Throws loom::Error naming the option
// or file at fault.
void train_sentencepiece(const std::vector<std::string>& files, const std::string& out, const SpmTrainOptions& opt);

}  // namespace loom::data
