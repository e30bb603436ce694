#include "loom/data/mixture.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "loom/core/error.h"

namespace loom::data {

namespace {

// `total` split in proportion to `w` (summing to 1) by the largest-remainder method: each
// share is floor(w_k total) or one more, and the shares sum to `total`. Ties go to the
// earlier source, so the split is a pure function of its inputs.
std::vector<uint64_t> largest_remainder(const std::vector<double>& w, uint64_t total) {
  std::vector<uint64_t> n(w.size());
  std::vector<double> frac(w.size());
  uint64_t given = 0;
  for (size_t k = 0; k < w.size(); k++) {
    const double exact = w[k] * double(total);
    n[k] = std::min<uint64_t>(uint64_t(std::floor(exact)), total);
    frac[k] = exact - double(n[k]);
    given += n[k];
  }
  std::vector<size_t> order(w.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return frac[a] > frac[b]; });
  for (size_t i = 0; given < total; i = (i + 1) % order.size(), given++) n[order[i]]++;
  return n;
}

uint64_t period_key(uint64_t seed, uint64_t period) { return mix64(seed ^ 0x6D6978ull) ^ mix64(period); }

// "0.7" -> 0.7; false when `s` is not wholly a number.
bool parse_weight(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size();
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

}  // namespace

std::vector<WeightedDir> parse_shard_sources(const std::string& spec) {
  std::error_code ec;
  if (std::filesystem::exists(spec, ec) || spec.find(',') == std::string::npos) {
    // One directory; "1:DIR" is that directory with its (only) weight.
    const size_t colon = spec.find(':');
    double w = 0;
    if (!std::filesystem::exists(spec, ec) && colon != std::string::npos && parse_weight(spec.substr(0, colon), w)) {
      LOOM_CONFIG_CHECK(std::isfinite(w) && w > 0, "data.shards = '", spec, "': weight ", spec.substr(0, colon),
                        " must be a finite number > 0");
      return {{1.0, trim(spec.substr(colon + 1))}};
    }
    return {{1.0, spec}};
  }
  std::vector<WeightedDir> out;
  double sum = 0;
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = trim(spec.substr(at, comma - at));
    at = comma + 1;
    const size_t colon = item.find(':');
    double w = 0;
    LOOM_CONFIG_CHECK(colon != std::string::npos && parse_weight(trim(item.substr(0, colon)), w), "data.shards = '",
                      spec, "': item '", item, "' has no weight; a mixture gives each shard directory one, "
                      "as in 0.7:web,0.3:code");
    LOOM_CONFIG_CHECK(std::isfinite(w) && w > 0, "data.shards = '", spec, "': the weight of '", item,
                      "' must be a finite number > 0");
    const std::string dir = trim(item.substr(colon + 1));
    LOOM_CONFIG_CHECK(!dir.empty(), "data.shards = '", spec, "': item '", item, "' names no directory");
    for (const WeightedDir& d : out)
      LOOM_CONFIG_CHECK(d.dir != dir, "data.shards = '", spec, "' names '", dir,
                        "' twice: give each directory once, with the sum of its weights");
    out.push_back({w, dir});
    sum += w;
  }
  for (WeightedDir& d : out) d.weight /= sum;
  return out;
}

Mixture::Mixture(std::vector<double> weights) : w_(std::move(weights)) {
  LOOM_ASSERT(!w_.empty() && w_.size() <= kMixPeriod);
  n_ = largest_remainder(w_, kMixPeriod);
  for (size_t k = 0; k < w_.size(); k++)
    LOOM_CONFIG_CHECK(n_[k] > 0, "data.shards: source ", k + 1, " has weight ", w_[k],
                      " of the total, which draws no sample in a period of ", kMixPeriod,
                      " samples: give it at least ", 1.0 / double(kMixPeriod), " or drop it");
  c_.resize(n_.size());
  std::exclusive_scan(n_.begin(), n_.end(), c_.begin(), uint64_t(0));
}

size_t Mixture::source_of(uint64_t v) const {
  return size_t(std::upper_bound(c_.begin(), c_.end(), v) - c_.begin()) - 1;
}

Mixture::Pick Mixture::pick(uint64_t g, uint64_t seed) const {
  const uint64_t p = g / kMixPeriod;
  const uint64_t v = permute(g % kMixPeriod, kMixPeriod, period_key(seed, p));
  const size_t k = source_of(v);
  return {int(k), p * n_[k] + (v - c_[k])};
}

std::vector<uint64_t> Mixture::drawn(uint64_t samples, uint64_t seed) const {
  const uint64_t full = samples / kMixPeriod;
  std::vector<uint64_t> count(n_.size());
  for (size_t k = 0; k < n_.size(); k++) count[k] = full * n_[k];
  const uint64_t key = period_key(seed, full);
  for (uint64_t j = 0; j < samples % kMixPeriod; j++) {
    const uint64_t v = permute(j, kMixPeriod, key);
    count[source_of(v)]++;
  }
  return count;
}

std::vector<uint64_t> Mixture::split(uint64_t rows) const { return largest_remainder(w_, rows); }

MixedStream::MixedStream(std::vector<std::unique_ptr<ShardStream>> parts, std::vector<std::string> names,
                         Mixture mix)
    : parts_(std::move(parts)), names_(std::move(names)), mix_(std::move(mix)) {
  LOOM_ASSERT(parts_.size() == names_.size() && parts_.size() == mix_.weights().size());
  starts_.push_back(0);
  for (const auto& p : parts_) starts_.push_back(starts_.back() + p->size());
}

void MixedStream::copy(uint64_t offset, int64_t n, int32_t* out) const {
  LOOM_ASSERT(offset + uint64_t(n) <= size());
  while (n > 0) {
    const size_t k = size_t(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
    const int64_t take = std::min<int64_t>(n, int64_t(starts_[k + 1] - offset));
    parts_[k]->copy(offset - starts_[k], take, out);
    offset += uint64_t(take), out += take, n -= take;
  }
}

void MixedStream::check_windows(int64_t seq, const char* split) const {
  for (int k = 0; k < part_count(); k++)
    LOOM_CONFIG_CHECK(part(k).size() >= uint64_t(seq + 1), "data.shards: the ", split, " split of '", name(k),
                      "' holds ", part(k).size(), " tokens, fewer than one window of train.seq + 1 = ", seq + 1,
                      ": give it more text or a shorter train.seq");
}

uint64_t MixedStream::train_window(uint64_t g, int64_t seq, uint64_t seed) const {
  const Mixture::Pick p = mix_.pick(g, seed);
  const uint64_t windows = (part(p.source).size() - 1) / uint64_t(seq);  // Note [Epoch order], per source
  const uint64_t epoch = p.index / windows;
  const uint64_t key = mix64(seed ^ 0x65706F6368ull) ^ mix64(epoch) ^ mix64(0x736F75726365ull + uint64_t(p.source));
  return starts_[size_t(p.source)] + permute(p.index % windows, windows, key) * uint64_t(seq);
}

uint64_t MixedStream::val_window(uint64_t r, uint64_t rows, int64_t seq) const {
  const std::vector<uint64_t> block = mix_.split(rows);
  size_t k = 0;
  while (r >= block[k]) r -= block[k++];
  const uint64_t windows = part(int(k)).size() - uint64_t(seq);  // valid starts
  return starts_[k] + uint64_t((unsigned __int128)r * windows / block[k]);
}

}  // namespace loom::data
