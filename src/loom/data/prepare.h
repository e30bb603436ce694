// `loom data prepare`: text -> token shards (Note [Token shard format]).
//
// Documents: each line of a .jsonl file (its `text_field`), or each whole text file, or,
// with `doc_separator`, the pieces of a text file between separator lines (fortunes use
// "%"). Every round(1/val_fraction)-th document goes to val_NNNNN.bin, the rest to
// train_NNNNN.bin; documents are never split across shards. Encoding runs on `threads`
// threads in document order, so the output does not depend on the thread count. The
// shards are written into a marked temporary directory DIR.loom-tmp-<token> and renamed to
// DIR at the end: a failed or interrupted run leaves no half-written DIR, and the next
// prepare into DIR removes what a killed one left (Note [Ownership by content]). Only files
// whose content proves them shards or the summary of an earlier prepare are replaced.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

struct PrepareOptions {
  std::string in, out;
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0.05;
  std::string text_field = "text";
  std::string doc_separator;  // a line equal to this ends a document in text files
  int threads = 2;
  // A document longer than this is encoded in pieces of about this many bytes (Note
  // [Document pieces] in prepare.cc): memory stays a few bytes per input byte.
  int64_t piece_bytes = int64_t(1) << 18;
  bool overwrite = false;
};

struct PrepareStats {
  uint64_t docs[2] = {0, 0}, tokens[2] = {0, 0}, bytes[2] = {0, 0};  // [train, val]
  int shards[2] = {0, 0};
  double seconds = 0;
  std::vector<std::string> removed;  // abandoned temporary directories of a killed prepare
  uint64_t pieces = 0;  // pieces the long documents were encoded in (Note [Document pieces])

};

// Progress: bytes of input read so far and the total.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

PrepareStats prepare_shards(const Tokenizer& tok, const std::string& tokenizer_path, const PrepareOptions& opt,
                            const Progress& progress = {});

// crc32 over every token's decoded bytes: two tokenizers with the same fingerprint encode
// identically. Stored in shards as "<kind> <vocab> <crc>".
std::string tokenizer_fingerprint(const Tokenizer& tok);

}  // namespace loom::data
