#include "loom/data/loader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/corpus.h"
#include "loom/data/mixture.h"
#include "loom/data/prepare.h"

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

double entropy_of_counts(const std::vector<double>& count, double total) {
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / total * std::log(c / total);
  return h;
}

double unigram_entropy(const std::vector<uint8_t>& t) {
  std::vector<double> count(256, 0.0);
  for (uint8_t b : t) count[b] += 1;
  return entropy_of_counts(count, double(t.size()));
}

// Of the first 16M tokens: enough for a unigram baseline at any corpus size.
double unigram_entropy(const data::TokenSource& src, uint64_t vocab) {
  const int64_t n = int64_t(std::min<uint64_t>(src.size(), uint64_t(1) << 24));
  std::vector<int32_t> toks(static_cast<size_t>(n));
  src.copy(0, n, toks.data());
  std::vector<double> count(vocab, 0.0);
  for (int32_t t : toks) count[size_t(t)] += 1;
  return entropy_of_counts(count, double(n));
}

// The byte corpus as a token source.
class ByteSource final : public data::TokenSource {
 public:
  explicit ByteSource(const std::vector<uint8_t>& bytes) : b_(bytes) {}
  uint64_t size() const override { return b_.size(); }
  void copy(uint64_t offset, int64_t n, int32_t* out) const override {
    for (int64_t t = 0; t < n; t++) out[t] = b_[offset + uint64_t(t)];
  }

 private:
  const std::vector<uint8_t>& b_;
};

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

namespace {

// The sources of data.shards agree on the tokenizer and its end token, the model holds
// their vocabulary, and data.tokenizer (when given) wrote them. Returns the vocabulary.
uint64_t check_shard_sources(const std::vector<data::ShardSplits>& parts, const std::vector<data::WeightedDir>& dirs,
                             const Config& cfg) {
  const data::ShardHeader& h = parts[0].train->shards()[0]->header();
  uint64_t vocab = 0;
  for (size_t k = 0; k < parts.size(); k++) {
    vocab = std::max({vocab, parts[k].train->vocab_size(), parts[k].val->vocab_size()});
    const data::ShardHeader& hk = parts[k].train->shards()[0]->header();
    LOOM_CONFIG_CHECK(hk.tokenizer == h.tokenizer && hk.end_of_document == h.end_of_document, "data.shards: '",
                      dirs[k].dir, "' was prepared by ", hk.tokenizer, " (end token ", hk.end_of_document, ") but '",
                      dirs[0].dir, "' by ", h.tokenizer, " (end token ", h.end_of_document,
                      "): a mixture needs one tokenizer; prepare every directory with the same one");
  }
  LOOM_CONFIG_CHECK(vocab <= uint64_t(cfg.model.vocab), "data.shards = '", cfg.data.shards, "' holds token ids up to ",
                    vocab - 1, " (vocabulary ", vocab, ", ", h.tokenizer, ") but model.vocab = ", cfg.model.vocab,
                    ": set model.vocab = ", vocab, " or more");
  if (!cfg.data.tokenizer.empty() && h.format == "loom") {
    const std::string fp = data::tokenizer_fingerprint(*data::load_tokenizer(cfg.data.tokenizer));
    LOOM_CONFIG_CHECK(fp == h.tokenizer, "data.tokenizer = '", cfg.data.tokenizer, "' (", fp,
                      ") is not the tokenizer that wrote data.shards = '", cfg.data.shards, "' (", h.tokenizer, ")");
  }
  return vocab;
}

// Note [Dataset mixtures]: the sources' splits as two mixed streams; the unigram baseline
// and the bytes per token are the weighted mixtures of the sources' own (the latter 0,
// unknown, when a source has no prepare.json).
void mix_sources(TrainData& d, std::vector<data::ShardSplits> parts, const std::vector<data::WeightedDir>& dirs,
                 const Config& cfg, int64_t seq, uint64_t vocab) {
  std::vector<double> weights;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<data::ShardStream>> train, val;
  std::vector<double> unigram(vocab, 0.0);
  d.val_bytes_per_token = 0;
  bool bytes_known = true;
  for (size_t k = 0; k < parts.size(); k++) {
    weights.push_back(dirs[k].weight), names.push_back(dirs[k].dir);
    const int64_t n = int64_t(std::min<uint64_t>(parts[k].train->size(), uint64_t(1) << 22));
    std::vector<int32_t> toks(static_cast<size_t>(n));
    parts[k].train->copy(0, n, toks.data());
    for (int32_t t : toks) unigram[size_t(t)] += dirs[k].weight / double(n);
    bytes_known = bytes_known && parts[k].val_bytes_per_token > 0;
    d.val_bytes_per_token += dirs[k].weight * parts[k].val_bytes_per_token;
    train.push_back(std::move(parts[k].train)), val.push_back(std::move(parts[k].val));
  }
  if (!bytes_known) d.val_bytes_per_token = 0;
  d.unigram_entropy_nats = entropy_of_counts(unigram, 1.0);
  auto t = std::make_unique<data::MixedStream>(std::move(train), names, data::Mixture(weights));
  auto v = std::make_unique<data::MixedStream>(std::move(val), names, data::Mixture(weights));
  t->check_windows(seq, "training"), v->check_windows(seq, "validation");
  LOOM_CONFIG_CHECK(!cfg.data.bucketing, "data.bucketing = true with the mixture data.shards = '", cfg.data.shards,
                    "': length buckets draw documents from one source; train a mixture on fixed windows "
                    "(data.bucketing = false; data.doc_mask = true keeps attention inside each document)");
  d.train = t.get(), d.val = v.get();
  d.mix_train = std::move(t), d.mix_val = std::move(v);
}

}  // namespace

std::unique_ptr<TrainData> load_train_data(const Config& cfg, int64_t seq) {
  auto d = std::make_unique<TrainData>();
  if (cfg.data.shards.empty()) {
    // An imported model may name its tokenizer; training it on the byte corpus would not use it.
    LOOM_CONFIG_CHECK(cfg.data.tokenizer.empty() || cfg.data.tokenizer == "byte", "data.tokenizer = '",
                      cfg.data.tokenizer, "' needs data.shards: the text corpus (data.path) is read as bytes; "
                      "tokenize it with loom data prepare and train on the shards");
    d->corpus = load_corpus(cfg.data.path, cfg.data.val_fraction, seq);
    d->corpus_train = std::make_unique<ByteSource>(d->corpus.train);
    d->corpus_val = std::make_unique<ByteSource>(d->corpus.val);
    d->train = d->corpus_train.get();
    d->val = d->corpus_val.get();
    d->unigram_entropy_nats = d->corpus.unigram_entropy_nats;
    d->val_bytes_per_token = 1;
    d->describe = "corpus " + (cfg.data.path.empty() ? std::string(kDefaultCorpusDir) : cfg.data.path) + ": " +
                  std::to_string(d->corpus.files.size()) + " files, train " + std::to_string(d->corpus.train.size()) +
                  " / val " + std::to_string(d->corpus.val.size()) + " bytes";
    return d;
  }
  const std::vector<data::WeightedDir> dirs = data::parse_shard_sources(cfg.data.shards);
  std::vector<data::ShardSplits> parts;
  for (const data::WeightedDir& w : dirs) parts.push_back(data::open_shard_splits(w.dir));
  const uint64_t vocab = check_shard_sources(parts, dirs, cfg);
  const data::ShardHeader& h = parts[0].train->shards()[0]->header();
  d->end_of_document = int32_t(h.end_of_document);
  LOOM_CONFIG_CHECK(!cfg.data.doc_mask || d->end_of_document >= 0, "data.doc_mask = true but data.shards = '",
                    cfg.data.shards, "' (", h.tokenizer, ") mark no document ends: prepare them with a tokenizer "
                    "that has an end-of-document token, or turn data.doc_mask off");
  d->order = DataOrder::kEpoch;
  if (dirs.size() == 1) {
    d->shards = std::move(parts[0]);
    d->train = d->shards.train.get();
    d->val = d->shards.val.get();
    d->unigram_entropy_nats = unigram_entropy(*d->train, vocab);
    d->val_bytes_per_token = d->shards.val_bytes_per_token;
    d->describe = "shards " + cfg.data.shards + ": " + std::to_string(d->shards.train->shards().size()) +
                  " train (" + std::to_string(d->train->size()) + " tokens) / " +
                  std::to_string(d->shards.val->shards().size()) + " val (" + std::to_string(d->val->size()) +
                  " tokens), " + h.tokenizer + ", epoch of " +
                  std::to_string((d->train->size() - 1) / uint64_t(seq)) + " windows";
    return d;
  }
  mix_sources(*d, std::move(parts), dirs, cfg, seq, vocab);
  d->describe = "mixture of " + std::to_string(dirs.size()) + " shard directories (" + h.tokenizer + "):";
  const auto& mix = static_cast<const data::MixedStream&>(*d->train);
  for (int k = 0; k < mix.part_count(); k++) {
    const uint64_t windows = (mix.part(k).size() - 1) / uint64_t(seq);
    const double steps = double(windows) / (mix.mixture().weights()[size_t(k)] * double(cfg.train.batch));
    char line[160];
    std::snprintf(line, sizeof line, " %s %.1f%% (%llu windows: an epoch every %.0f steps)", mix.name(k).c_str(),
                  100 * mix.mixture().weights()[size_t(k)], (unsigned long long)windows, steps);
    d->describe += line;
  }
  return d;
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
    : owned_(std::make_unique<ByteSource>(tokens)), src_(*owned_), seq_(seq), seed_(seed), shard_index_(shard_index),
      shard_count_(shard_count), order_(DataOrder::kHashed) {
  check();
}

DataLoader::DataLoader(const data::TokenSource& tokens, int64_t seq, uint64_t seed, int shard_index,
                       int shard_count, DataOrder order)
    : src_(tokens), seq_(seq), seed_(seed), shard_index_(shard_index), shard_count_(shard_count), order_(order) {
  check();
}

DataLoader::~DataLoader() = default;

void DataLoader::check() const {
  LOOM_CHECK(src_.size() >= uint64_t(seq_ + 1), "data split has ", src_.size(),
             " tokens, fewer than one window of seq+1 = ", seq_ + 1);
  LOOM_CHECK(shard_count_ > 0 && shard_index_ >= 0 && shard_index_ < shard_count_, "data shard ", shard_index_,
             " of ", shard_count_, " is not a valid shard");
}

int64_t DataLoader::shard_rows(int64_t global_batch) const {
  LOOM_CHECK(global_batch % shard_count_ == 0, "global batch ", global_batch, " does not split evenly over ",
             shard_count_, " data shards");
  return global_batch / shard_count_;
}

void DataLoader::fill_row(uint64_t offset, int32_t* tokens, int32_t* targets, std::vector<int32_t>& window) const {
  if (columns_.empty()) {
    src_.copy(offset, seq_, tokens);
    src_.copy(offset + 1, seq_, targets);
    return;
  }
  // Note [Context-parallel chunks]: the whole window, then this rank's positions of it.
  window.resize(size_t(seq_ + 1));
  src_.copy(offset, seq_ + 1, window.data());
  for (size_t i = 0; i < columns_.size(); ++i)
    tokens[i] = window[size_t(columns_[i])], targets[i] = window[size_t(columns_[i]) + 1];
}

void DataLoader::keep_columns(std::vector<int32_t> positions) {
  for (int32_t p : positions) LOOM_CHECK(p >= 0 && p < seq_, "column ", p, " outside a window of ", seq_);
  columns_ = std::move(positions);
}

uint64_t DataLoader::window_start(int64_t step, int64_t global_batch, int64_t row) const {
  if (order_ == DataOrder::kHashed) {  // Note [data order]
    const uint64_t windows = src_.size() - uint64_t(seq_);  // valid start offsets
    using data::mix64;
    const uint64_t h = mix64(mix64(seed_ ^ 0x6C6F6F6Dull) ^ mix64(uint64_t(step) * 0x100000001B3ull + uint64_t(row)));
    return h % windows;
  }
  const uint64_t g = uint64_t(step) * uint64_t(global_batch) + uint64_t(row);
  if (const data::MixedStream* m = src_.mixed()) return m->train_window(g, seq_, seed_);  // Note [Dataset mixtures]
  // Note [Epoch order]
  const uint64_t windows = (src_.size() - 1) / uint64_t(seq_);
  const uint64_t epoch = g / windows;
  return data::permute(g % windows, windows, data::mix64(seed_ ^ 0x65706F6368ull) ^ data::mix64(epoch)) * uint64_t(seq_);
}

int64_t DataLoader::train_batch(int64_t step, int64_t micro, int64_t micro_count, int64_t global_batch,
                                int32_t* tokens, int32_t* targets) const {
  const int64_t per_shard = shard_rows(global_batch);
  LOOM_ASSERT(per_shard % micro_count == 0 && micro >= 0 && micro < micro_count);
  const int64_t rows = per_shard / micro_count;
  std::vector<int32_t> window;
  for (int64_t i = 0; i < rows; i++) {
    const int64_t r = shard_index_ * per_shard + micro * rows + i;
    fill_row(window_start(step, global_batch, r), tokens + i * row_len(), targets + i * row_len(), window);
  }
  return rows;
}

int64_t DataLoader::val_batch(int64_t index, int64_t batch_count, int64_t global_batch, int32_t* tokens,
                              int32_t* targets) const {
  const int64_t per_shard = shard_rows(global_batch);
  const int64_t total_rows = batch_count * global_batch;
  const int64_t windows = int64_t(src_.size()) - seq_;
  const data::MixedStream* mix = src_.mixed();
  std::vector<int32_t> window;
  for (int64_t i = 0; i < per_shard; i++) {
    const int64_t r = index * global_batch + shard_index_ * per_shard + i;
    // Evenly spaced windows; they overlap only if the split is short.
    const uint64_t at = mix ? mix->val_window(uint64_t(r), uint64_t(total_rows), seq_)
                            : uint64_t((__int128)r * windows / total_rows);
    fill_row(at, tokens + i * row_len(), targets + i * row_len(), window);
  }
  return per_shard;
}

namespace {

data::BucketPlan make_bucket_plan(const TrainData& d, const Config& cfg) {
  LOOM_CONFIG_CHECK(d.end_of_document >= 0, "data.bucketing = true but data.shards = '", cfg.data.shards,
                    "' mark no document ends: prepare them with a tokenizer that has an end-of-document token, "
                    "or turn data.bucketing off");
  data::BucketOptions o;
  o.seq = cfg.seq_len();
  o.buckets = cfg.data.buckets > 0 ? cfg.data.buckets : (o.seq + 7) / 8;
  o.pool = cfg.data.bucket_pool;
  o.seed = uint64_t(cfg.train.seed);
  // Context parallelism splits each padded length into 2 cp chunks (zigzag) or cp.
  if (cfg.parallel.cp > 1) o.multiple = cp_pieces(cfg.parallel.cp, cfg.parallel.cp_split);
  return data::BucketPlan(data::document_samples(*d.train, d.end_of_document, o.seq), o);
}

}  // namespace

BucketLoader::BucketLoader(const TrainData& data, const Config& cfg, int dp_rank, int dp)
    : src_(*data.train), plan_(make_bucket_plan(data, cfg)), pad_token_(data.end_of_document),
      batch_(cfg.train.batch), accum_(cfg.train.grad_accum), dp_rank_(dp_rank), dp_(dp) {}

BucketLoader::Step BucketLoader::plan(int64_t step) const {
  const std::vector<data::Sample> batch = plan_.global_batch(step, batch_);
  Step s;
  for (const data::Sample& x : batch) s.real_targets += x.length;
  for (int64_t m = 0; m < accum_; m++)
    for (int k = 0; k < dp_; k++) {  // every rank's shape, for the padding of the whole batch
      data::MicroPlan mp = plan_.micro_batch(batch, m, accum_, k, dp_);
      s.positions += int64_t(mp.rows.size()) * mp.seq;
      if (k == dp_rank_) s.micros.push_back(std::move(mp));
    }
  return s;
}

void BucketLoader::fill(const data::MicroPlan& m, int32_t* tokens, int32_t* targets) const {
  data::fill_micro_batch(src_, m, pad_token_, tokens, targets);
}

}  // namespace loom
