// Corpus loading, the byte tokenizer, the train/val split and the deterministic loader.
//
// Note [data order]: row r of the global batch of optimizer step s always reads the window
// starting at offset hash(seed, s, r) of the train split, whatever the layout: a data
// parallel shard k of n takes rows [k*B/n, (k+1)*B/n), and micro-batches split those rows
// in order. So every layout sees the same global batch as the single-process run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom {

inline constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

struct Corpus {
  std::vector<uint8_t> train, val;  // byte tokens
  std::vector<std::string> files;   // what was read, in order
  double unigram_entropy_nats = 0;  // of the train split's byte distribution
};

// Reads a UTF-8 text file or every regular file under a directory (sorted by path; for
// the default fortunes directory, *.dat index files are skipped). Every 4 KiB block whose
// index i satisfies i % k == k-1, k = round(1/val_fraction), goes to validation.
// Throws loom::Error for a missing path, an empty corpus, invalid UTF-8 (naming the file
// and byte offset), or a split too small for one sequence of seq+1 tokens.
Corpus load_corpus(const std::string& path, double val_fraction, int64_t seq);
// The files load_corpus reads for `path` (empty: the default corpus), in order.
std::vector<std::string> corpus_files(const std::string& path);

// Byte tokenizer: token = byte value.
std::vector<int32_t> encode_bytes(const std::string& text);
std::string decode_bytes(const std::vector<int32_t>& tokens);

using data::first_invalid_utf8;

class DataLoader {
 public:
  // Reads (seq+1)-token windows from `tokens`; this process is shard `shard_index` of
  // `shard_count` (data parallel ranks). Throws if the split is shorter than seq+1.
  DataLoader(const std::vector<uint8_t>& tokens, int64_t seq, uint64_t seed, int shard_index = 0,
             int shard_count = 1);

  // Micro-batch `micro` (of `micro_count`) of this shard's part of step `step`'s global batch
  // of `global_batch` rows: fills (rows, seq) tokens and next-token targets; returns rows.
  int64_t train_batch(int64_t step, int64_t micro, int64_t micro_count, int64_t global_batch,
                      int32_t* tokens, int32_t* targets) const;
  // Validation batch `index`: fixed, evenly spaced windows; same shard rules.
  int64_t val_batch(int64_t index, int64_t batch_count, int64_t global_batch, int32_t* tokens,
                    int32_t* targets) const;
  int64_t shard_rows(int64_t global_batch) const;

 private:
  void fill_row(int64_t offset, int32_t* tokens, int32_t* targets) const;
  const std::vector<uint8_t>& data_;
  int64_t seq_;
  uint64_t seed_;
  int shard_index_, shard_count_;
};

}  // namespace loom
