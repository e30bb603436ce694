// Adasum (Note [Adasum]) on thread ranks against an fp64 reference of its binary tree:
// orthogonal gradients give their sum, identical ones their mean, random ones the tree's
// value per tensor; every rank ends with the same bits. Odd sizes: n*20-17, n+2, 2^19.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "loom/comm/world.h"
#include "loom/parallel/compress.h"

namespace loom::parallel {
namespace {

struct Bucketed {
  std::vector<ParamSpec> specs;
  Bucket bucket;
};

// Tensors of the given sizes back to back (with one 16-float gap of padding after the first,
// as a padded layout has), one bucket over all of them.
Bucketed bucket_of(const std::vector<int64_t>& sizes) {
  Bucketed b;
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); i++) {
    ParamSpec s;
    s.shape = {sizes[i]};
    s.numel = sizes[i];
    s.offset = at;
    at += sizes[i] + (i == 0 ? 16 : 0);
    b.specs.push_back(s);
  }
  b.bucket = {0, at, 0, int(sizes.size()) - 1};
  return b;
}

// Adasum of two vectors per tensor, in fp64 (Maleki et al. 2021).
std::vector<double> combine(const std::vector<double>& a, const std::vector<double>& b, const Bucketed& l) {
  std::vector<double> out(a.size(), 0.0);
  for (const ParamSpec& s : l.specs) {
    double dot = 0, aa = 0, bb = 0;
    for (int64_t i = s.offset; i < s.offset + s.numel; i++) dot += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    const double ca = aa > 0 ? 1 - dot / (2 * aa) : 1, cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
    for (int64_t i = s.offset; i < s.offset + s.numel; i++) out[i] = ca * a[i] + cb * b[i];
  }
  return out;
}

// The tree over rank order: (0,1), (2,3), ... then their results.
std::vector<double> reference(std::vector<std::vector<double>> v, const Bucketed& l) {
  while (v.size() > 1) {
    std::vector<std::vector<double>> next;
    for (size_t i = 0; i < v.size(); i += 2) next.push_back(combine(v[i], v[i + 1], l));
    v = next;
  }
  return v[0];
}

// Runs Adasum on n thread ranks over inputs(rank); returns every rank's result.
std::vector<std::vector<float>> run(int n, const Bucketed& l, const std::function<std::vector<float>(int)>& input) {
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  CompressSpec spec;
  spec.adasum = true;
  comm::CommOptions o;
  o.timeout = std::chrono::milliseconds(60'000);
  const auto errors = comm::run_threads(n, o, [&](comm::World& w) {
    std::vector<float> g = input(w.global_rank());
    make_compressor(spec, l.bucket, l.specs, n)->reduce(w.world_group(), std::span<float>(g), 0);
    out[size_t(w.global_rank())] = g;
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (int r = 1; r < n; r++) EXPECT_EQ(0, std::memcmp(out[0].data(), out[size_t(r)].data(), out[0].size() * 4)) << r;
  return out;
}

std::vector<float> normal(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

class AdasumSizes : public ::testing::TestWithParam<int> {};

TEST_P(AdasumSizes, OrthogonalAddIdenticalAverageRandomFollowTheTree) {
  const int n = GetParam();
  for (int64_t size : {int64_t(n) * 20 - 17, int64_t(n) + 2, int64_t(1) << 19}) {
    const Bucketed l = bucket_of({size, 37});
    const size_t total = size_t(l.bucket.count);
    // Orthogonal: rank r owns the entries i with i % n == r (disjoint supports) -> the sum.
    // Padding reads zero in every gradient buffer (Note [flat state]).
    auto padded = [&](std::vector<float> x) {
      std::fill(x.begin() + size, x.begin() + size + 16, 0.0f);
      return x;
    };
    auto ortho = [&](int r) {
      std::vector<float> x = padded(normal(total, 7 + r));
      for (size_t i = 0; i < total; i++)
        if (int(i % size_t(n)) != r) x[i] = 0;
      return x;
    };
    auto out = run(n, l, ortho);
    std::vector<double> sum(total, 0.0);
    for (int r = 0; r < n; r++) {
      const std::vector<float> x = ortho(r);
      for (size_t i = 0; i < total; i++) sum[i] += x[i];
    }
    for (size_t i = 0; i < total; i++)
      ASSERT_NEAR(out[0][i], sum[i], 1e-6 * (1 + std::fabs(sum[i]))) << "orthogonal, size " << size << " i " << i;
    // Identical: the mean, i.e. the gradient itself.
    const std::vector<float> same = padded(normal(total, 99));
    out = run(n, l, [&](int) { return same; });
    for (size_t i = 0; i < total; i++) ASSERT_NEAR(out[0][i], same[i], 1e-6 * (1 + std::fabs(same[i]))) << i;
    // Random: the fp64 tree, tensor by tensor; the padding stays zero.
    std::vector<std::vector<double>> in;
    for (int r = 0; r < n; r++) {
      const std::vector<float> x = padded(normal(total, 1000 + r));
      in.emplace_back(x.begin(), x.end());
    }
    out = run(n, l, [&](int r) { return std::vector<float>(in[size_t(r)].begin(), in[size_t(r)].end()); });
    const std::vector<double> want = reference(in, l);
    for (size_t i = 0; i < total; i++)
      ASSERT_NEAR(out[0][i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "random, size " << size << " i " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AdasumSizes, ::testing::Values(1, 2, 4, 8));

TEST(Adasum, TrafficIsARingAllReducePlusTheTriples) {
  const Bucketed l = bucket_of({1000, 24});
  CompressSpec spec;
  spec.adasum = true;
  const double ring = 2.0 * 3 / 4 * 4 * double(l.bucket.count);
  EXPECT_NEAR(make_compressor(spec, l.bucket, l.specs, 4)->wire_bytes(), ring + 3 * 24.0 * 2 * 2, 1e-9);
}

}  // namespace
}  // namespace loom::parallel
