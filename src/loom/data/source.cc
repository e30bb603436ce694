#include "loom/data/source.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace fs = std::filesystem;

namespace loom::data {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t permute(uint64_t i, uint64_t n, uint64_t key) {
  LOOM_ASSERT(i < n);
  int half = 1;
  while ((uint64_t(1) << (2 * half)) < n) half++;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  do {
    uint64_t l = i >> half, r = i & mask;
    for (uint64_t round = 0; round < 4; round++) {
      const uint64_t f = mix64(r ^ mix64(key + round)) & mask;
      const uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    i = (l << half) | r;
  } while (i >= n);  // cycle-walk: the permutation of [0, 4^half) restricted to [0, n)
  return i;
}

ShardStream::ShardStream(std::vector<std::unique_ptr<Shard>> shards) : shards_(std::move(shards)) {
  starts_.push_back(0);
  for (const auto& s : shards_) starts_.push_back(starts_.back() + s->size());
}

uint64_t ShardStream::vocab_size() const {
  uint64_t v = 0;
  for (const auto& s : shards_) v = std::max(v, s->header().vocab_size);
  return v;
}

void ShardStream::copy(uint64_t offset, int64_t n, int32_t* out) const {
  LOOM_ASSERT(offset + uint64_t(n) <= size());
  size_t k = size_t(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  for (int64_t t = 0; t < n; t++, offset++) {
    while (offset >= starts_[k + 1]) k++;
    out[t] = int32_t(shards_[k]->token(offset - starts_[k]));
  }
}

ShardSplits open_shard_splits(const std::string& dir) {
  std::vector<std::unique_ptr<Shard>> train, val;
  for (auto& s : open_shards(dir)) {
    const std::string name = fs::path(s->path()).filename().string();
    (name.find("val") != std::string::npos ? val : train).push_back(std::move(s));
  }
  LOOM_CONFIG_CHECK(!train.empty() && !val.empty(), "data.shards = '", dir, "' holds ", train.size(),
                    " training and ", val.size(), " validation shards; it needs both (file names holding \"val\" "
                    "are validation: loom data prepare writes train_NNNNN.bin and val_NNNNN.bin)");
  ShardSplits out{std::make_unique<ShardStream>(std::move(train)), std::make_unique<ShardStream>(std::move(val))};
  const fs::path meta = fs::path(dir) / "prepare.json";
  std::error_code ec;
  if (fs::is_regular_file(meta, ec)) {
    try {
      const auto j = nlohmann::json::parse(read_file_bytes(meta.string()));
      const double bytes = j.at("val").at("bytes").get<double>(), tokens = j.at("val").at("tokens").get<double>();
      if (bytes > 0 && tokens > 0) out.val_bytes_per_token = bytes / tokens;
    } catch (const nlohmann::json::exception& e) {
      throw Error("'" + meta.string() + "' is damaged (" + e.what() + "): re-run loom data prepare");
    }
  }
  return out;
}

}  // namespace loom::data
