#include "loom/train/data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/corpus.h"

namespace fs = std::filesystem;

namespace loom {

namespace {

std::vector<std::string> list_corpus_files(const std::string& path, bool is_default) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (is_default)
      throw Error("default corpus directory '" + path + "' is missing: install Debian's `fortunes` package "
                  "(scripts/setup.sh does) or set data.path to a UTF-8 text file or directory");
    throw Error("data.path = '" + path + "' does not exist: expected a UTF-8 text file or a directory of them");
  }
  std::vector<std::string> files;
  if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else if (fs::is_directory(path, ec)) {
    files = data::text_files_under(path);
  } else {
    throw Error("data.path = '" + path + "' is neither a regular file nor a directory");
  }
  return files;
}

double unigram_entropy(const std::vector<uint8_t>& t) {
  std::vector<double> count(256, 0.0);
  for (uint8_t b : t) count[b] += 1;
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / double(t.size()) * std::log(c / double(t.size()));
  return h;
}

// splitmix64: a counter-based hash, so any (step, row) can be computed independently.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<std::string> corpus_files(const std::string& path) {
  return list_corpus_files(path.empty() ? kDefaultCorpusDir : path, path.empty());
}

Corpus load_corpus(const std::string& path, double val_fraction, int64_t seq) {
  const bool is_default = path.empty();
  const std::string root = is_default ? kDefaultCorpusDir : path;
  Corpus c;
  c.files = list_corpus_files(root, is_default);
  std::vector<uint8_t> all;
  for (const auto& f : c.files) {
    const std::string bytes = read_file_bytes(f);
    const int64_t bad = first_invalid_utf8(reinterpret_cast<const uint8_t*>(bytes.data()), int64_t(bytes.size()));
    if (bad >= 0)
      throw Error("corpus file '" + f + "' is not valid UTF-8 at byte offset " + std::to_string(bad) +
                  ": convert it (e.g. iconv -f latin1 -t utf-8) or remove it from data.path");
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  if (all.empty())
    throw Error("corpus at '" + root + "' is empty (" + std::to_string(c.files.size()) +
                " files, 0 bytes): data.path needs non-empty UTF-8 text");
  constexpr int64_t kBlock = 4096;
  const int64_t k = std::max<int64_t>(2, std::llround(1.0 / val_fraction));
  for (int64_t b = 0; b * kBlock < int64_t(all.size()); b++) {
    auto first = all.begin() + b * kBlock;
    auto last = all.begin() + std::min<int64_t>((b + 1) * kBlock, int64_t(all.size()));
    auto& dst = (b % k == k - 1) ? c.val : c.train;
    dst.insert(dst.end(), first, last);
  }
  const int64_t need = seq + 1;
  if (int64_t(c.train.size()) < need || int64_t(c.val.size()) < need)
    throw Error("corpus at '" + root + "' has " + std::to_string(all.size()) + " bytes: train split " +
                std::to_string(c.train.size()) + " and validation split " + std::to_string(c.val.size()) +
                " bytes, but each needs at least seq+1 = " + std::to_string(need) +
                " (validation takes every " + std::to_string(k) + "th 4 KiB block); give more text or a shorter train.seq");
  c.unigram_entropy_nats = unigram_entropy(c.train);
  return c;
}

std::vector<int32_t> encode_bytes(const std::string& text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); i++) out[i] = uint8_t(text[i]);
  return out;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens)
    if (t >= 0 && t < 256) s.push_back(char(t));
  return s;
}

DataLoader::DataLoader(const std::vector<uint8_t>& tokens, int64_t seq, uint64_t seed, int shard_index,
                       int shard_count)
    : data_(tokens), seq_(seq), seed_(seed), shard_index_(shard_index), shard_count_(shard_count) {
  LOOM_CHECK(int64_t(tokens.size()) >= seq + 1, "data split has ", tokens.size(),
             " tokens, fewer than one window of seq+1 = ", seq + 1);
  LOOM_CHECK(shard_count > 0 && shard_index >= 0 && shard_index < shard_count, "data shard ", shard_index,
             " of ", shard_count, " is not a valid shard");
}

int64_t DataLoader::shard_rows(int64_t global_batch) const {
  LOOM_CHECK(global_batch % shard_count_ == 0, "global batch ", global_batch, " does not split evenly over ",
             shard_count_, " data shards");
  return global_batch / shard_count_;
}

void DataLoader::fill_row(int64_t offset, int32_t* tokens, int32_t* targets) const {
  for (int64_t t = 0; t < seq_; t++) {
    tokens[t] = data_[offset + t];
    targets[t] = data_[offset + t + 1];
  }
}

int64_t DataLoader::train_batch(int64_t step, int64_t micro, int64_t micro_count, int64_t global_batch,
                                int32_t* tokens, int32_t* targets) const {
  const int64_t per_shard = shard_rows(global_batch);
  LOOM_ASSERT(per_shard % micro_count == 0 && micro >= 0 && micro < micro_count);
  const int64_t rows = per_shard / micro_count;
  const uint64_t windows = data_.size() - uint64_t(seq_);  // valid start offsets
  for (int64_t i = 0; i < rows; i++) {
    const uint64_t r = uint64_t(shard_index_ * per_shard + micro * rows + i);
    const uint64_t h = mix(mix(seed_ ^ 0x6C6F6F6Dull) ^ mix(uint64_t(step) * 0x100000001B3ull + r));
    fill_row(int64_t(h % windows), tokens + i * seq_, targets + i * seq_);
  }
  return rows;
}

int64_t DataLoader::val_batch(int64_t index, int64_t batch_count, int64_t global_batch, int32_t* tokens,
                              int32_t* targets) const {
  const int64_t per_shard = shard_rows(global_batch);
  const int64_t total_rows = batch_count * global_batch;
  const int64_t windows = int64_t(data_.size()) - seq_;
  for (int64_t i = 0; i < per_shard; i++) {
    const int64_t r = index * global_batch + shard_index_ * per_shard + i;
    // Evenly spaced windows; they overlap only if the split is short.
    const int64_t offset = int64_t((__int128)r * windows / total_rows);
    fill_row(offset, tokens + i * seq_, targets + i * seq_);
  }
  return per_shard;
}

}  // namespace loom
