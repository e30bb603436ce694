#include "loom/data/length_buckets.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::data {

namespace {

// Appends the pieces of the document whose targets are [first, end).
void add_document(std::vector<Sample>& out, uint64_t first, uint64_t end, int64_t seq) {
  for (uint64_t t = first; t < end; t += uint64_t(seq))
    out.push_back({t, uint32_t(std::min<uint64_t>(uint64_t(seq), end - t))});
}

uint64_t key(uint64_t seed, uint64_t salt, uint64_t index) { return mix64(mix64(seed ^ salt) ^ mix64(index)); }

}  // namespace

std::vector<Sample> document_samples(const TokenSource& src, int32_t end_token, int64_t seq) {
  LOOM_CHECK(seq > 0 && seq <= int64_t(UINT32_MAX), "sequence length ", seq, " is out of range");
  const uint64_t n = src.size();
  std::vector<Sample> out;
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<int32_t> buf(static_cast<size_t>(kChunk));
  uint64_t first = 1;  // the current document's first target
  for (uint64_t at = 0; at < n; at += uint64_t(kChunk)) {
    const int64_t len = int64_t(std::min<uint64_t>(uint64_t(kChunk), n - at));
    src.copy(at, len, buf.data());
    for (int64_t i = 0; i < len; i++) {
      const uint64_t p = at + uint64_t(i);
      if (buf[size_t(i)] != end_token || p == 0) continue;
      add_document(out, first, p + 1, seq);  // the end token is the document's last target
      first = p + 1;
    }
  }
  if (first < n) add_document(out, first, n, seq);  // a last document without its end token
  return out;
}

BucketPlan::BucketPlan(std::vector<Sample> samples, const BucketOptions& opt) : samples_(std::move(samples)), opt_(opt) {
  LOOM_CHECK(!samples_.empty(), "the token stream holds no document with a target to train on");
  LOOM_CHECK(opt.seq > 0 && opt.buckets >= 1 && opt.buckets <= opt.seq, "data.buckets = ", opt.buckets,
             " must be between 1 and the sequence length ", opt.seq);
  LOOM_CHECK(opt.pool >= 1, "data.bucket_pool = ", opt.pool, " must be at least 1");
  LOOM_CHECK(opt.multiple >= 1 && opt.seq % opt.multiple == 0, "padded lengths in multiples of ", opt.multiple,
             " need a sequence length that is one, not ", opt.seq);
}

int64_t BucketPlan::bucket_length(int64_t length) const {
  LOOM_ASSERT(length >= 1 && length <= opt_.seq);
  // ceil(i seq / b) >= length  <=>  i seq / b > length - 1  <=>  i > (length - 1) b / seq,
  // so the smallest such i is floor((length - 1) b / seq) + 1.
  const int64_t i = (length - 1) * opt_.buckets / opt_.seq + 1;
  const int64_t bucket = (i * opt_.seq + opt_.buckets - 1) / opt_.buckets;
  return std::min(opt_.seq, (bucket + opt_.multiple - 1) / opt_.multiple * opt_.multiple);
}

std::vector<Sample> BucketPlan::global_batch(int64_t step, int64_t B) const {
  LOOM_CHECK(step >= 0 && B > 0, "step ", step, " batch ", B, " out of range");
  const uint64_t S = samples_.size(), P = uint64_t(opt_.pool), M = P * uint64_t(B);
  const uint64_t mega = uint64_t(step) / P;
  // Stream positions of megabatch `mega`, each mapped to its sample (Note [Epoch order]).
  std::vector<std::pair<uint64_t, const Sample*>> pool(M);
  for (uint64_t j = 0; j < M; j++) {
    const uint64_t g = mega * M + j, epoch = g / S;
    pool[j] = {g, &samples_[permute(g % S, S, key(opt_.seed, 0x627563686574ull, epoch))]};
  }
  std::sort(pool.begin(), pool.end(), [](const auto& a, const auto& b) {
    return a.second->length != b.second->length ? a.second->length > b.second->length : a.first < b.first;
  });
  const uint64_t pick = permute(uint64_t(step) % P, P, key(opt_.seed, 0x6D656761ull, mega));
  std::vector<Sample> out;
  out.reserve(size_t(B));
  for (uint64_t j = pick * uint64_t(B); j < (pick + 1) * uint64_t(B); j++) out.push_back(*pool[j].second);
  return out;
}

MicroPlan BucketPlan::micro_batch(const std::vector<Sample>& batch, int64_t micro, int64_t accum, int rank,
                                  int dp) const {
  const int64_t B = int64_t(batch.size());
  LOOM_CHECK(accum > 0 && dp > 0 && B % (accum * dp) == 0, "global batch ", B, " does not split into ", accum,
             " micro-batches x ", dp, " data-parallel ranks");
  LOOM_ASSERT(micro >= 0 && micro < accum && rank >= 0 && rank < dp);
  const int64_t group = B / accum;
  MicroPlan m;
  for (int64_t i = micro * group + rank; i < (micro + 1) * group; i += dp) m.rows.push_back(batch[size_t(i)]);
  int64_t longest = 0;
  for (const Sample& s : m.rows) longest = std::max<int64_t>(longest, s.length);
  m.seq = bucket_length(longest);
  return m;
}

void fill_micro_batch(const TokenSource& src, const MicroPlan& plan, int32_t pad_token, int32_t* tokens,
                      int32_t* targets) {
  const int64_t T = plan.seq;
  for (size_t r = 0; r < plan.rows.size(); r++) {
    const Sample& s = plan.rows[r];
    int32_t* tok = tokens + int64_t(r) * T;
    int32_t* tgt = targets + int64_t(r) * T;
    LOOM_ASSERT(s.first_target >= 1 && int64_t(s.length) <= T && s.first_target + s.length <= src.size());
    src.copy(s.first_target - 1, s.length, tok);
    src.copy(s.first_target, s.length, tgt);
    std::fill(tok + s.length, tok + T, pad_token);
    std::fill(tgt + s.length, tgt + T, kPadTarget);
  }
}

}  // namespace loom::data
