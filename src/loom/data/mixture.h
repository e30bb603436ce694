// Dataset mixtures: several shard directories drawn from by weight (data.shards =
// "0.7:web,0.3:code"), the pretraining blend of Megatron-LM's BlendedDataset, torchtitan's
// and nanotron's mixtures.
//
// Note [Dataset mixtures]: global sample g (row r of step s is g = s B + r, whatever the
// layout) lies in period p = g div P of P = kMixPeriod samples at position j = g mod P.
// Source k owns n_k of each period's positions (n_k = w_k P by largest remainder, so the
// n_k sum to P and each is within one of w_k P) as the value range [c_k, c_k + n_k) of
// v = permute(j, P, key(seed, p)), a keyed bijection of [0, P) (data/source.h). So g reads
// source k when v lies in its range, as that source's sample i = p n_k + (v - c_k): a
// bijection from source k's positions onto the naturals, and source k then reads its
// window by Note [Epoch order] over its own windows (a small source repeats more often, as
// in Megatron). Everything is O(1) per row and a function of g alone: every layout and every
// resume draws the same rows. Every period holds exactly n_k samples of source k, so the
// proportions drawn over any whole number of periods are the weights (to 1 / P) and over
// any prefix within n_k / (prefix) of them.
// Validation: of `rows` validation rows, source k takes a contiguous block of rows in
// proportion to its weight (largest remainder), evenly spaced over its own validation split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/source.h"

namespace loom::data {

inline constexpr uint64_t kMixPeriod = 10000;

struct WeightedDir {
  double weight = 1;  // normalised: the weights of a mixture sum to 1
  std::string dir;
};

// data.shards as sources: "DIR" (one, weight 1), or "W:DIR,W:DIR,..." with every weight
// given, finite and > 0 (normalised to sum 1). A string naming an existing path is one
// directory even if it holds ',' or ':'. Throws ConfigError naming the item and the fix.
std::vector<WeightedDir> parse_shard_sources(const std::string& spec);

// The slots of each source in a period, and the draw itself (pure; no data).
class Mixture {
 public:
  explicit Mixture(std::vector<double> weights);  // normalised, each >= 1 / kMixPeriod
  struct Pick {
    int source = 0;
    uint64_t index = 0;  // the sample's number among that source's draws
  };
  Pick pick(uint64_t g, uint64_t seed) const;
  // How many of the global samples [0, samples) each source got: O(kMixPeriod).
  std::vector<uint64_t> drawn(uint64_t samples, uint64_t seed) const;
  // `rows` split into one contiguous block per source, in proportion to the weights.
  std::vector<uint64_t> split(uint64_t rows) const;
  const std::vector<double>& weights() const { return w_; }
  uint64_t slots(int k) const { return n_[size_t(k)]; }

 private:
  size_t source_of(uint64_t v) const;  // the source whose slots [c_k, c_k + n_k) hold v
  std::vector<double> w_;
  std::vector<uint64_t> n_, c_;  // slots per period and their first value
};

// The training (or validation) split of every source, read as one stream with the
// sources back to back; windows never cross a source's end.
class MixedStream final : public TokenSource {
 public:
  MixedStream(std::vector<std::unique_ptr<ShardStream>> parts, std::vector<std::string> names, Mixture mix);
  uint64_t size() const override { return starts_.back(); }
  void copy(uint64_t offset, int64_t n, int32_t* out) const override;
  const MixedStream* mixed() const override { return this; }

  const Mixture& mixture() const { return mix_; }
  int part_count() const { return int(parts_.size()); }
  const ShardStream& part(int k) const { return *parts_[size_t(k)]; }
  const std::string& name(int k) const { return names_[size_t(k)]; }
  // Throws ConfigError naming the source whose split holds no window of seq + 1 tokens.
  void check_windows(int64_t seq, const char* split) const;
  // The start of the (seq + 1)-token window global sample g reads (training order).
  uint64_t train_window(uint64_t g, int64_t seq, uint64_t seed) const;
  // The start of validation row r of `rows` (see the Note).
  uint64_t val_window(uint64_t r, uint64_t rows, int64_t seq) const;

 private:
  std::vector<std::unique_ptr<ShardStream>> parts_;
  std::vector<std::string> names_;
  Mixture mix_;
  std::vector<uint64_t> starts_;  // part k holds stream tokens [starts_[k], starts_[k+1])
};

}  // namespace loom::data
