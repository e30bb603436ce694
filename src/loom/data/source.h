// What the training loader reads windows from, and the order it reads them in.
//
// Note [Epoch order]: a source of n tokens holds W = (n - 1) / seq windows; window w gives
// inputs [w seq, w seq + seq) and targets shifted by one. Global sample g (row r of step s
// is g = s B + r, whatever the layout) reads window permute(g mod W, W, key(seed, g div W)):
// a keyed bijection of [0, W), so each epoch reads every window exactly once, data-parallel
// ranks (disjoint row ranges) never read the same one, and the position is a function of
// the step alone: a resumed run, on any layout, continues the same sequence of batches.
// Only the tail of fewer than seq tokens is never an input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/shards.h"

namespace loom::data {

class MixedStream;

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual uint64_t size() const = 0;
  // Tokens [offset, offset + n) into out; offset + n <= size().
  virtual void copy(uint64_t offset, int64_t n, int32_t* out) const = 0;
  // Several sources drawn by weight (Note [Dataset mixtures] in data/mixture.h), or null.
  virtual const MixedStream* mixed() const { return nullptr; }
};

// Shards read as one stream, in order (documents already end with their end token).
class ShardStream final : public TokenSource {
 public:
  explicit ShardStream(std::vector<std::unique_ptr<Shard>> shards);
  uint64_t size() const override { return starts_.back(); }
  void copy(uint64_t offset, int64_t n, int32_t* out) const override;
  const std::vector<std::unique_ptr<Shard>>& shards() const { return shards_; }
  uint64_t vocab_size() const;

 private:
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<uint64_t> starts_;  // shard k holds stream tokens [starts_[k], starts_[k+1])
};

// A keyed bijection of [0, n): a 4-round Feistel network on the smallest even number of
// bits covering n, cycle-walked into range (Black & Rogaway 2002, "Ciphers with arbitrary
// finite domains"). At most 4 walks are expected; O(1) memory for any n.
uint64_t permute(uint64_t i, uint64_t n, uint64_t key);

// splitmix64 (Steele et al. 2014): the mixing function the loaders share.
uint64_t mix64(uint64_t x);

// The token shards of `dir` split by file name: names containing "val" are validation
// (loom's val_NNNNN.bin, llm.c's *_val_*.bin), the rest training. Throws naming the
// directory when either side is empty.
struct ShardSplits {
  std::unique_ptr<ShardStream> train, val;
  double val_bytes_per_token = 0;  // from prepare.json when present (for bits per byte), else 0
};
ShardSplits open_shard_splits(const std::string& dir);

}  // namespace loom::data
