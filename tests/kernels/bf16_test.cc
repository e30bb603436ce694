// bf16 (issue 14): rounding to nearest-even, and the oneDNN GEMM against the fp64-summing
// reference (Note [bf16 rounding points]) and against fp64 on the unrounded inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <tuple>

#include "loom/core/bf16.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/ref/gemm_bf16.h"
#include <vector>

namespace loom {
namespace {

uint32_t test_seed() {
  return std::getenv("LOOM_TEST_SEED") ? uint32_t(std::stoul(std::getenv("LOOM_TEST_SEED"))) : std::random_device{}();
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-7f + 0x1p-8f), 1.0f + 0x1p-6f);  // odd mantissa: up
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above halfway: up
  EXPECT_EQ(round_bf16(-3.0f), -3.0f);
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::max())));  // overflow to inf
  EXPECT_TRUE(std::isinf(round_bf16(-INFINITY)) && round_bf16(-INFINITY) < 0);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::bit_cast<float>(0x7f800001u)))));  // a NaN whose top bits read inf
  EXPECT_EQ(round_bf16(0x1p-130f), 0x1p-130f);  // subnormals keep their top bits
  // Every float maps to the nearer of its two bf16 neighbours (relative error <= 2^-8).
  std::mt19937 rng(test_seed());
  for (int i = 0; i < 200000; i++) {
    const float x = std::bit_cast<float>(uint32_t(rng()) & 0xbfffffffu);  // finite, |x| < 2
    const float lo = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u);
    const float hi = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & 0xffff0000u) + 0x10000u);
    const float r = round_bf16(x);
    ASSERT_TRUE(r == lo || r == hi) << x;
    ASSERT_LE(std::fabs(double(r) - x), std::fabs(double(lo == r ? hi : lo) - x)) << x;
    if (std::isnormal(x)) {
      ASSERT_LE(std::fabs(double(r) - x), 0x1p-8 * std::fabs(double(x))) << x;
    }
  }
  std::vector<float> v(1000);
  for (auto& x : v) x = std::normal_distribution<float>()(rng);
  std::vector<bf16> h(v.size());
  cpu::to_bf16(h.data(), v.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); i++) ASSERT_EQ(h[i], to_bf16(v[i]));
}

// Bounds, with S = sum_k |a_k b_k| of the bf16 inputs and u = 2^-24 (fp32 accumulation):
//   fast vs reference: |C - C_ref| <= K u S (plus the output rounding, u |C_ref|);
//   vs fp64 on the unrounded inputs: each bf16 input is within 2^-8 relative, so each
//   product within (2 2^-8 + 2^-16), giving (2^-7 + 2^-16 + K u) S_exact.
TEST(Bf16, GemmMatchesTheReferenceWithinTheAccumulationBound) {
  std::mt19937 rng(test_seed());
  std::normal_distribution<float> nd;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {64, 48, 256}, {33, 130, 769},
                         {256, 96, 64}}) {
    for (int trans = 0; trans < 4; trans++)
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = trans & 1, tb = trans & 2;
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
        std::vector<float> af(size_t((ta ? K : M) * lda)), bf(size_t((tb ? N : K) * ldb));
        for (auto& x : af) x = nd(rng);
        for (auto& x : bf) x = nd(rng);
        std::vector<bf16> a(af.size()), b(bf.size());
        for (size_t i = 0; i < af.size(); i++) a[i] = to_bf16(af[i]);
        for (size_t i = 0; i < bf.size(); i++) b[i] = to_bf16(bf[i]);
        std::vector<float> c0(size_t(M * ldc));
        for (auto& x : c0) x = nd(rng);
        auto c = c0, cr = c0;
        const float alpha = 0.75f;
        cpu::gemm_bf16(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        ref::gemm_bf16(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, cr.data(), ldc);
        for (int64_t m = 0; m < M; m++)
          for (int64_t n = 0; n < N; n++) {
            double s = 0, s_exact = 0, exact = 0;
            for (int64_t k = 0; k < K; k++) {
              const size_t ia = size_t(ta ? k * lda + m : m * lda + k), ib = size_t(tb ? n * ldb + k : k * ldb + n);
              s += std::fabs(double(from_bf16(a[ia])) * from_bf16(b[ib]));
              s_exact += std::fabs(double(af[ia]) * bf[ib]);
              exact += double(af[ia]) * bf[ib];
            }
            const size_t at = size_t(m * ldc + n);
            const double prior = beta * double(c0[at]);
            const double bound = alpha * (double(K) * 0x1p-24 * s) + 0x1p-24 * (std::fabs(cr[at]) + std::fabs(prior)) + 1e-30;
            ASSERT_LE(std::fabs(double(c[at]) - cr[at]), bound)
                << M << "x" << N << "x" << K << " trans " << trans << " beta " << beta << " at " << m << "," << n;
            const double bound64 = alpha * (0x1p-7 + 0x1p-16 + double(K) * 0x1p-24) * s_exact +
                                   0x1p-23 * (std::fabs(alpha * exact) + std::fabs(prior)) + 1e-30;
            ASSERT_LE(std::fabs(double(c[at]) - (alpha * exact + prior)), bound64) << M << "x" << N << "x" << K;
          }
        for (int64_t m = 0; m < M; m++)  // the padding between rows is untouched
          for (int64_t n = N; n < ldc; n++) ASSERT_EQ(c[size_t(m * ldc + n)], c0[size_t(m * ldc + n)]);
      }
  }
  std::cout << "oneDNN bf16 GEMM ISA: " << cpu::gemm_bf16_isa() << "\n";
}

// Note [bf16 attention probabilities]: the cpu kernel against the reference. The scores
// and softmax differ by fp32 vs fp64 arithmetic (~1e-6 relative), which can flip the bf16
// rounding of a probability by one bf16 step (one ulp, at most 2^-7 relative): every kept P
// is a bf16 value within 2^-7 of the reference's (plus 1e-6), each output within 2^-7
// sum_j |p_j v_j| + 1e-5. Given the same kept P, the backward matches the reference to fp32
// rounding (1e-5 of the scale), and fp32 storage of the rounded P gives the bf16 storage's
// results bit for bit.
TEST(Bf16, AttentionRoundsItsProbabilitiesLikeTheReference) {
  std::mt19937 rng(test_seed());
  std::normal_distribution<float> nd;
  for (auto [B, T, H, KV, hd] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 1, 2, 2, 8}, {2, 13, 4, 4, 9},
                                 {2, 13, 6, 2, 10}, {1, 64, 3, 1, 16}, {2, 33, 8, 4, 12}}) {
    const int64_t Q = (H + 2 * KV) * hd, N = B * T, P = B * H * T * T, C = H * hd;
    std::vector<float> qkv(size_t(N * Q)), dy(size_t(N * C));
    for (auto& x : qkv) x = nd(rng);
    for (auto& x : dy) x = nd(rng);
    std::vector<int32_t> starts(static_cast<size_t>(N));  // random document boundaries
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0, s = 0; t < T; t++) {
        if (t > 0 && nd(rng) > 1.0f) s = t;
        starts[size_t(b * T + t)] = int32_t(s);
      }
    const int32_t* docs[2] = {nullptr, starts.data()};
    for (const int32_t* doc : docs) {
      std::vector<float> y(size_t(N * C)), y_f(y.size()), y_ref(y.size()), p_f(static_cast<size_t>(P)), p_ref(p_f.size());
      std::vector<bf16> p(p_f.size());
      cpu::attention_forward_bf16(y.data(), nullptr, p.data(), qkv.data(), B, T, H, KV, hd, doc);
      cpu::attention_forward_bf16(y_f.data(), p_f.data(), nullptr, qkv.data(), B, T, H, KV, hd, doc);
      ref::attention_forward_bf16(y_ref.data(), p_ref.data(), nullptr, qkv.data(), B, T, H, KV, hd, doc);
      ASSERT_EQ(y, y_f);
      for (int64_t i = 0; i < P; i++) {
        ASSERT_EQ(from_bf16(p[size_t(i)]), p_f[size_t(i)]);
        ASSERT_LE(std::fabs(p_f[size_t(i)] - p_ref[size_t(i)]), 0x1p-7 * std::fabs(p_ref[size_t(i)]) + 1e-6) << i;
      }
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
          for (int64_t h = 0; h < H; h++)
            for (int64_t e = 0; e < hd; e++) {
              double s = 0;
              for (int64_t j = 0; j <= t; j++)
                s += std::fabs(double(p_ref[size_t(((b * H + h) * T + t) * T + j)]) *
                               qkv[size_t((b * T + j) * Q + (H + KV + h / (H / KV)) * hd + e)]);
              const size_t at = size_t((b * T + t) * C + h * hd + e);
              ASSERT_LE(std::fabs(y[at] - y_ref[at]), 0x1p-7 * s + 1e-5) << B << "x" << T << " at " << at;
            }
      std::vector<float> d(size_t(N * Q), 0.3f), d_f = d, d_ref = d;
      cpu::attention_backward_bf16(d.data(), dy.data(), qkv.data(), nullptr, p.data(), B, T, H, KV, hd);
      cpu::attention_backward_bf16(d_f.data(), dy.data(), qkv.data(), p_f.data(), nullptr, B, T, H, KV, hd);
      ref::attention_backward_bf16(d_ref.data(), dy.data(), qkv.data(), nullptr, p.data(), B, T, H, KV, hd);
      ASSERT_EQ(d, d_f);
      double scale = 0;
      for (float x : d_ref) scale = std::max(scale, double(std::fabs(x)));
      for (size_t i = 0; i < d.size(); i++) ASSERT_LE(std::fabs(d[i] - d_ref[i]), 1e-5 * scale) << i;
    }
  }
}

}  // namespace
}  // namespace loom
