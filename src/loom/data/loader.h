// Corpus loading, the byte tokenizer, the train/val split and the deterministic loader.
//
// Note [data order]: row r of the global batch of optimizer step s always reads the window
// starting at offset hash(seed, s, r) of the train split, whatever the layout: a data
// parallel shard k of n takes rows [k*B/n, (k+1)*B/n), and micro-batches split those rows
// in order. So every layout sees the same global batch as the single-process run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/data/length_buckets.h"
#include "loom/data/source.h"
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

// Which window each global row reads: kHashed, Note [data order] (random windows at any
// offset; the byte corpus), or kEpoch, Note [Epoch order] in data/source.h (each window once
// per epoch; token shards).
enum class DataOrder { kHashed, kEpoch };

class DataLoader {
 public:
  // Reads (seq+1)-token windows from `tokens`; this process is shard `shard_index` of
  // `shard_count` (data parallel ranks). Throws if the split is shorter than seq+1.
  DataLoader(const std::vector<uint8_t>& tokens, int64_t seq, uint64_t seed, int shard_index = 0,
             int shard_count = 1);
  // The same over any token source (kept alive by the caller).
  DataLoader(const data::TokenSource& tokens, int64_t seq, uint64_t seed, int shard_index, int shard_count,
             DataOrder order);
  ~DataLoader();

  // Micro-batch `micro` (of `micro_count`) of this shard's part of step `step`'s global batch
  // of `global_batch` rows: fills (rows, seq) tokens and next-token targets; returns rows.
  int64_t train_batch(int64_t step, int64_t micro, int64_t micro_count, int64_t global_batch,
                      int32_t* tokens, int32_t* targets) const;
  // Validation batch `index`: fixed, evenly spaced windows; same shard rules.
  int64_t val_batch(int64_t index, int64_t batch_count, int64_t global_batch, int32_t* tokens,
                    int32_t* targets) const;
  int64_t shard_rows(int64_t global_batch) const;
  // Note [Context-parallel chunks]: each row keeps only these positions of its window (a cp
  // rank's), so a batch is (rows, positions.size()).
  void keep_columns(std::vector<int32_t> positions);
  int64_t row_len() const { return columns_.empty() ? seq_ : int64_t(columns_.size()); }
  // The window start that global row `row` of step `step` reads (for tests of the order).
  uint64_t window_start(int64_t step, int64_t global_batch, int64_t row) const;

 private:
  void check() const;
  // `window`: scratch for the whole window when columns are kept (reused across a batch's rows).
  void fill_row(uint64_t offset, int32_t* tokens, int32_t* targets, std::vector<int32_t>& window) const;
  std::unique_ptr<data::TokenSource> owned_;  // the byte corpus, when built from one
  const data::TokenSource& src_;
  int64_t seq_;
  uint64_t seed_;
  int shard_index_, shard_count_;
  DataOrder order_;
  std::vector<int32_t> columns_;  // empty: the whole window
};

// What a run trains and validates on: the byte corpus (data.path, Note [data order]),
// token shards (data.shards, Note [Epoch order]) or a weighted mixture of shard
// directories (Note [Dataset mixtures]). Built once per rank; the loaders read
// `train` and `val`, which point into this object (so it is not moved).
struct TrainData {
  Corpus corpus;             // byte corpus mode
  data::ShardSplits shards;  // shard mode
  std::unique_ptr<data::TokenSource> corpus_train, corpus_val;
  std::unique_ptr<data::TokenSource> mix_train, mix_val;  // data.shards names a mixture (data/mixture.h)
  const data::TokenSource* train = nullptr;
  const data::TokenSource* val = nullptr;
  DataOrder order = DataOrder::kHashed;
  std::string describe;               // one header line
  double unigram_entropy_nats = 0;    // of the train split (first 16M tokens for shards)
  double val_bytes_per_token = 0;     // 1 for bytes; from prepare.json for shards; 0 unknown
  int32_t end_of_document = -1;       // the shards' end token (data.doc_mask), -1 none
};
// Throws ConfigError when the shards' vocabulary exceeds model.vocab (naming both).
std::unique_ptr<TrainData> load_train_data(const Config& cfg, int64_t seq);

// data.bucketing (Note [Length bucketing] in data/length_buckets.h) for one dp rank.
class BucketLoader {
 public:
  // Cuts data.train into document samples (reads it once). Throws ConfigError when the
  // shards mark no document ends.
  BucketLoader(const TrainData& data, const Config& cfg, int dp_rank, int dp);

  struct Step {
    std::vector<data::MicroPlan> micros;  // this rank's micro-batches, in order
    int64_t real_targets = 0;             // of the whole global batch
    int64_t positions = 0;                // of the whole global batch: rows x padded lengths
  };
  Step plan(int64_t step) const;
  // (rows, m.seq) tokens and targets (kPadTarget at padding) of one micro-batch.
  void fill(const data::MicroPlan& m, int32_t* tokens, int32_t* targets) const;
  int64_t sample_count() const { return plan_.sample_count(); }

 private:
  const data::TokenSource& src_;
  data::BucketPlan plan_;
  int32_t pad_token_;
  int64_t batch_, accum_;
  int dp_rank_, dp_;
};

}  // namespace loom
