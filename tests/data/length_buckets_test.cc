// Note [Length bucketing]: document samples cover every target once, a step's global batch
// is a function of the step with lengths grouped, micro-batches split it exactly, and
// padding carries the ignored target.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <random>

#include "loom/core/error.h"
#include "loom/data/length_buckets.h"
#include "support/error_message.h"

namespace {

using loom::data::BucketOptions;
using loom::data::BucketPlan;
using loom::data::Sample;

class VectorSource final : public loom::data::TokenSource {
 public:
  explicit VectorSource(std::vector<int32_t> t) : t_(std::move(t)) {}
  uint64_t size() const override { return t_.size(); }
  void copy(uint64_t offset, int64_t n, int32_t* out) const override {
    std::copy_n(t_.begin() + int64_t(offset), n, out);
  }
  const std::vector<int32_t>& tokens() const { return t_; }

 private:
  std::vector<int32_t> t_;
};

constexpr int32_t kEnd = 0;

// `docs` documents of random lengths 1..max_len (each ending with kEnd), random other tokens.
VectorSource random_stream(std::mt19937& rng, int docs, int max_len, bool end_at_start) {
  std::vector<int32_t> t;
  if (end_at_start) t.push_back(kEnd);  // llm.c's shards start every document with the end token
  for (int d = 0; d < docs; d++) {
    const int len = 1 + int(rng() % uint32_t(max_len));
    for (int i = 0; i + 1 < len; i++) t.push_back(1 + int32_t(rng() % 99));
    t.push_back(kEnd);
  }
  return VectorSource(std::move(t));
}

TEST(LengthBuckets, DocumentSamplesCoverEveryTargetOnce) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 20; trial++) {
    const int64_t seq = 1 + int64_t(rng() % 40);
    VectorSource src = random_stream(rng, 1 + int(rng() % 200), 1 + int(rng() % 100), trial % 2 == 0);
    std::vector<int32_t> t = src.tokens();
    if (trial % 3 == 0) t.push_back(7), t.push_back(8);  // a last document without its end token
    const VectorSource s2(t);
    const std::vector<Sample> samples = loom::data::document_samples(s2, kEnd, seq);
    std::vector<int> hits(t.size(), 0);
    for (const Sample& x : samples) {
      ASSERT_GE(x.length, 1u);
      ASSERT_LE(int64_t(x.length), seq);
      for (uint64_t p = x.first_target; p < x.first_target + x.length; p++) hits[p]++;
      // No sample crosses a document end: only its last target may be the end token.
      for (uint64_t p = x.first_target; p + 1 < x.first_target + x.length; p++) ASSERT_NE(t[p], kEnd);
      // A sample starts a document (its input is the previous end token, or position 0) or
      // continues one that was cut at seq targets.
      const bool starts_doc = x.first_target == 1 || t[x.first_target - 1] == kEnd;
      if (!starts_doc) {
        const auto prev = std::find_if(samples.begin(), samples.end(), [&](const Sample& y) {
          return y.first_target + y.length == x.first_target;
        });
        ASSERT_NE(prev, samples.end());
        EXPECT_EQ(int64_t(prev->length), seq);
      }
    }
    EXPECT_EQ(hits[0], 0);
    for (size_t p = 1; p < t.size(); p++) ASSERT_EQ(hits[p], 1) << "position " << p << " seq " << seq;
  }
}

TEST(LengthBuckets, BucketLengthIsTheSmallestBucketThatHolds) {
  for (int64_t seq : {1, 7, 32, 100, 1024})
    for (int64_t buckets : {int64_t(1), int64_t(3), int64_t(8), seq}) {
      if (buckets > seq) continue;
      const BucketPlan plan({{1, 1}}, BucketOptions{seq, buckets, 1, 0});
      std::vector<int64_t> lengths;
      for (int64_t i = 1; i <= buckets; i++) lengths.push_back((i * seq + buckets - 1) / buckets);
      for (int64_t len = 1; len <= seq; len++) {
        const int64_t want = *std::lower_bound(lengths.begin(), lengths.end(), len);
        ASSERT_EQ(plan.bucket_length(len), want) << "seq " << seq << " buckets " << buckets << " length " << len;
      }
    }
}

// Context parallelism's rounding: each bucket length rounded up to the multiple (2 cp), never
// past seq; a seq that is not a multiple is refused naming both.
TEST(LengthBuckets, BucketLengthsRoundUpToTheMultiple) {
  for (int64_t multiple : {int64_t(4), int64_t(6), int64_t(8)}) {
    const int64_t seq = 48;
    const BucketPlan plan({{1, 1}}, BucketOptions{seq, 6, 1, 0, multiple});
    for (int64_t len = 1; len <= seq; len++) {
      const int64_t plain = (len + 7) / 8 * 8, want = (plain + multiple - 1) / multiple * multiple;
      ASSERT_EQ(plan.bucket_length(len), std::min(seq, want)) << "multiple " << multiple << " length " << len;
      ASSERT_EQ(plan.bucket_length(len) % multiple, 0);
    }
  }
  try {
    BucketPlan({{1, 1}}, BucketOptions{50, 5, 1, 0, 4});
    FAIL() << "seq 50 is no multiple of 4";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 4 need a sequence length that is one, not 50"), std::string::npos)
        << e.what();
  }
}

std::vector<Sample> random_samples(std::mt19937& rng, size_t n, int64_t seq) {
  std::vector<Sample> s(n);
  for (size_t i = 0; i < n; i++) s[i] = {1 + i * 1000, uint32_t(1 + rng() % uint32_t(seq))};
  return s;
}

TEST(LengthBuckets, StepsReadEverySampleOncePerEpochInLengthGroups) {
  std::mt19937 rng(std::random_device{}());
  const int64_t seq = 64, B = 8, pool = 16;
  const std::vector<Sample> samples = random_samples(rng, size_t(3 * pool * B), seq);  // 3 megabatches per epoch
  const uint64_t seed = rng();
  const BucketPlan grouped(samples, BucketOptions{seq, 8, pool, seed});
  const BucketPlan random(samples, BucketOptions{seq, 8, 1, seed});
  std::map<uint64_t, int> seen;
  double spread_grouped = 0, spread_random = 0;
  for (int64_t step = 0; step < 3 * pool; step++) {
    const std::vector<Sample> batch = grouped.global_batch(step, B);
    ASSERT_EQ(int64_t(batch.size()), B);
    for (size_t i = 1; i < batch.size(); i++) ASSERT_GE(batch[i - 1].length, batch[i].length);  // longest first
    for (const Sample& x : batch) seen[x.first_target]++;
    spread_grouped += batch.front().length - batch.back().length;
    const std::vector<Sample> r = random.global_batch(step, B);
    spread_random += r.front().length - r.back().length;
    // A function of the step alone.
    const std::vector<Sample> again = BucketPlan(samples, BucketOptions{seq, 8, pool, seed}).global_batch(step, B);
    for (size_t i = 0; i < batch.size(); i++) ASSERT_EQ(again[i].first_target, batch[i].first_target);
  }
  ASSERT_EQ(seen.size(), samples.size());
  for (const auto& [pos, n] : seen) ASSERT_EQ(n, 1) << "sample at " << pos;
  // Sorting 16 batches' worth of samples leaves ~1/16 of the length range per batch; random
  // batches of 8 span most of it.
  EXPECT_LT(spread_grouped, 0.3 * spread_random) << spread_grouped << " vs " << spread_random;
  // Another seed, another order.
  const BucketPlan other(samples, BucketOptions{seq, 8, pool, seed + 1});
  int same = 0;
  for (int64_t step = 0; step < 8; step++)
    same += other.global_batch(step, B)[0].first_target == grouped.global_batch(step, B)[0].first_target;
  EXPECT_LT(same, 8);
}

TEST(LengthBuckets, MicroBatchesSplitTheGlobalBatchOverRanks) {
  std::mt19937 rng(std::random_device{}());
  const int64_t seq = 50;
  const BucketPlan plan(random_samples(rng, 500, seq), BucketOptions{seq, 5, 4, rng()});
  for (auto [accum, dp] : {std::pair<int64_t, int>{1, 1}, {3, 2}, {2, 4}, {1, 3}}) {
    const int64_t B = 24;
    const std::vector<Sample> batch = plan.global_batch(rng() % 100, B);
    std::multiset<uint64_t> want, got;
    for (const Sample& x : batch) want.insert(x.first_target);
    for (int64_t m = 0; m < accum; m++) {
      int64_t lo = seq, hi = 0;
      for (int k = 0; k < dp; k++) {
        const loom::data::MicroPlan mp = plan.micro_batch(batch, m, accum, k, dp);
        ASSERT_EQ(int64_t(mp.rows.size()), B / (accum * dp));
        int64_t longest = 0;
        for (const Sample& x : mp.rows) got.insert(x.first_target), longest = std::max<int64_t>(longest, x.length);
        EXPECT_EQ(mp.seq, plan.bucket_length(longest));
        lo = std::min(lo, longest), hi = std::max(hi, longest);
      }
      // The ranks of one micro-batch take interleaved rows of one length group.
      EXPECT_LE(hi - lo, int64_t(batch[size_t(m * B / accum)].length) - batch[size_t((m + 1) * B / accum - 1)].length);
    }
    EXPECT_EQ(got, want);
  }
  EXPECT_NE(loom::testing_support::error_message([&] { plan.micro_batch(plan.global_batch(0, 10), 0, 3, 0, 1); }).find(
                "does not split"),
            std::string::npos);
}

TEST(LengthBuckets, FilledRowsAreTheSamplesThenIgnoredPadding) {
  std::mt19937 rng(std::random_device{}());
  const VectorSource src = random_stream(rng, 40, 30, false);
  const int64_t seq = 16;
  const BucketPlan plan(loom::data::document_samples(src, kEnd, seq), BucketOptions{seq, 4, 2, 5});
  const std::vector<Sample> batch = plan.global_batch(1, 6);
  const loom::data::MicroPlan mp = plan.micro_batch(batch, 0, 2, 0, 1);
  std::vector<int32_t> tok(mp.rows.size() * size_t(mp.seq)), tgt(tok.size());
  loom::data::fill_micro_batch(src, mp, 99, tok.data(), tgt.data());
  for (size_t r = 0; r < mp.rows.size(); r++)
    for (int64_t i = 0; i < mp.seq; i++) {
      const size_t at = r * size_t(mp.seq) + size_t(i);
      const Sample& x = mp.rows[r];
      if (i < int64_t(x.length)) {
        EXPECT_EQ(tok[at], src.tokens()[x.first_target - 1 + size_t(i)]);
        EXPECT_EQ(tgt[at], src.tokens()[x.first_target + size_t(i)]);
      } else {
        EXPECT_EQ(tok[at], 99);
        EXPECT_EQ(tgt[at], loom::data::kPadTarget);
      }
    }
}

TEST(LengthBuckets, RefusesOptionsOutOfRange) {
  using loom::testing_support::error_message;
  EXPECT_NE(error_message([] { BucketPlan({}, BucketOptions{8, 2, 1, 0}); }).find("no document"), std::string::npos);
  EXPECT_NE(error_message([] { BucketPlan({{1, 1}}, BucketOptions{8, 9, 1, 0}); }).find("data.buckets = 9"),
            std::string::npos);
  EXPECT_NE(error_message([] { BucketPlan({{1, 1}}, BucketOptions{8, 2, 0, 0}); }).find("data.bucket_pool = 0"),
            std::string::npos);
}

}  // namespace
