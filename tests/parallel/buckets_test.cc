#include "loom/parallel/buckets.h"

#include <gtest/gtest.h>

#include <random>

#include "loom/core/error.h"

namespace loom::parallel {
namespace {

// Five tensors of 100, 300, 50, 400, 10 elements, packed with 4-element padding after each:
// offsets 0, 104, 408, 462, 866 (ends 100, 404, 458, 862, 876).
std::vector<TensorExtent> five() { return {{0, 100}, {104, 300}, {408, 50}, {462, 400}, {866, 10}}; }

TEST(Buckets, HandSizedCaseShowsItsArithmetic) {
  // first cap 64 elements (256 B), the rest 500 elements (2000 B).
  const auto b = assign_buckets(five(), {256, 2000, 4});
  ASSERT_EQ(b.size(), 3u);
  // Bucket 0 (launched first): tensor 4 alone, range [862, 876) = its 4 padding + 10 elements;
  // adding tensor 3 would span [458, 876) = 418 > 64.
  EXPECT_EQ(b[0].offset, 862);
  EXPECT_EQ(b[0].count, 14);
  EXPECT_EQ(b[0].first_tensor, 4);
  // Bucket 1: tensors 3 and 2, [404, 862) = 458 <= 500; adding tensor 1 gives [100, 862) = 762.
  EXPECT_EQ(b[1].offset, 404);
  EXPECT_EQ(b[1].count, 458);
  EXPECT_EQ(b[1].first_tensor, 2);
  EXPECT_EQ(b[1].last_tensor, 3);
  // Bucket 2: tensor 1, [100, 404) = 304; with tensor 0: [0, 404) = 404 <= 500, so both.
  EXPECT_EQ(b[2].offset, 0);
  EXPECT_EQ(b[2].count, 404);
  EXPECT_EQ(b[2].first_tensor, 0);
  EXPECT_EQ(b[2].last_tensor, 1);
}

// Random layouts: buckets tile the span in reverse order, respect the caps unless a single
// tensor is larger, and are the same on every call.
TEST(Buckets, RandomLayoutsTileAndRespectCaps) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TensorExtent> t;
    int64_t off = 0;
    const int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const int64_t numel = int64_t(rng() % 5000);
      t.push_back({off, numel});
      off += (numel + 15) / 16 * 16;
    }
    const BucketCaps caps{int64_t(4) * (1 + rng() % 2000), int64_t(4) * (1 + rng() % 20000), 4};
    const auto b = assign_buckets(t, caps);
    ASSERT_EQ(b, assign_buckets(t, caps));
    int64_t expect_end = t.back().offset + t.back().numel;
    int expect_hi = n - 1;
    for (size_t k = 0; k < b.size(); ++k) {
      EXPECT_EQ(b[k].offset + b[k].count, expect_end);
      EXPECT_EQ(b[k].last_tensor, expect_hi);
      const int64_t cap = (k == 0 ? caps.first_cap_bytes : caps.cap_bytes) / 4;
      if (b[k].first_tensor != b[k].last_tensor) EXPECT_LE(b[k].count, cap);
      expect_end = b[k].offset;
      expect_hi = b[k].first_tensor - 1;
    }
    EXPECT_EQ(expect_end, 0);
    EXPECT_EQ(expect_hi, -1);
  }
}

TEST(Buckets, BadCapsAndLayoutsAreRefused) {
  EXPECT_THROW(assign_buckets(five(), {2, 2000, 4}), Error);
  EXPECT_THROW(assign_buckets({{0, 10}, {5, 10}}), Error);
  EXPECT_TRUE(assign_buckets({}).empty());
}

}  // namespace

bool operator==(const Bucket& a, const Bucket& b) {
  return a.offset == b.offset && a.count == b.count && a.first_tensor == b.first_tensor && a.last_tensor == b.last_tensor;
}

}  // namespace loom::parallel
