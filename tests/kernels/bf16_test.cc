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

}  // namespace
}  // namespace loom
