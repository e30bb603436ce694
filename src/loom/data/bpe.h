// Byte-level BPE (GPT-2, Llama 3 and every tokenizer.json of that family).
//
// Note [Byte-level BPE]: text is split by the pre-tokenizer pattern into pieces; each
// piece's UTF-8 bytes start as one token per byte, and the adjacent pair with the lowest
// merge rank is merged, leftmost first, until no pair has a rank (Sennrich et al. 2016,
// as applied to bytes by Radford et al. 2019, GPT-2 `encoder.py`). Vocabulary files spell
// bytes as printable code points (GPT-2's bytes_to_unicode table); loom converts them
// back to bytes once at load, so encode and decode work on bytes directly.
#pragma once

#include <memory>
#include <string>

#include "loom/data/tokenizer.h"

namespace loom::data {

// A Hugging Face tokenizer.json whose model is BPE over ByteLevel pieces: pre_tokenizer
// ByteLevel (GPT-2 pattern), or a Sequence of Split(Regex, Isolated) + ByteLevel(use_regex
// = false) (Llama 3, Qwen 2); normalizer null; added tokens recognised in the text.
// Anything else (WordPiece, Unigram, Metaspace, normalizers) is refused naming the field.
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);
// The same from the file's text; `source` names it in messages.
std::unique_ptr<Tokenizer> tokenizer_from_json(const std::string& text, const std::string& source);

// GPT-2's vocab.json + merges.txt (what `GPT2Tokenizer` reads): GPT-2's pattern, and
// "<|endoftext|>" as a special token when the vocabulary holds it.
std::unique_ptr<Tokenizer> load_vocab_merges(const std::string& vocab_json, const std::string& merges_txt);

}  // namespace loom::data
