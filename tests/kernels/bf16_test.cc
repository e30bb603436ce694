// bf16 (issue 14): rounding to nearest-even, and the oneDNN GEMM against the fp64-summing
// reference (Note [bf16 rounding points]) and against fp64 on the unrounded inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>

#include "loom/core/bf16.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/ref/gemm_bf16.h"
#include "loom/kernels/ref/ops.h"
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
  // The last three cut M (A transposed), N and K into blocks (Note [Blocked oneDNN GEMMs]).
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {64, 48, 256}, {33, 130, 769},
                         {256, 96, 64}, {20011, 3, 5}, {3, 20011, 5}, {2, 3, 40009}}) {
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

// The bias riding in the primitive (matmul_forward_bf16_in) against the reference GEMM into
// a C holding the bias (beta = 1), within the same accumulation bound; the blocked shapes put
// the bias on each column block and on the first inner block only.
TEST(Bf16, GemmWithBiasMatchesTheReferenceIntoTheBias) {
  std::mt19937 rng(test_seed());
  std::normal_distribution<float> nd;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{33, 130, 769}, {5, 20011, 7}, {3, 5, 40009}}) {
    std::vector<bf16> a(size_t(M * K)), b(size_t(N * K));
    for (auto& x : a) x = to_bf16(nd(rng));
    for (auto& x : b) x = to_bf16(nd(rng));
    std::vector<float> bias(static_cast<size_t>(N)), c(static_cast<size_t>(M * N), NAN), cr(static_cast<size_t>(M * N));
    for (auto& x : bias) x = 1000 * nd(rng);  // far above the bound at K = 40009
    for (int64_t m = 0; m < M; m++) std::copy(bias.begin(), bias.end(), cr.begin() + m * N);
    cpu::gemm_bf16_bias_nt(M, N, K, a.data(), b.data(), bias.data(), c.data());
    ref::gemm_bf16(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 1.0f, cr.data(), N);
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += std::fabs(double(from_bf16(a[size_t(m * K + k)])) * from_bf16(b[size_t(n * K + k)]));
        const size_t at = size_t(m * N + n);
        const double bound = double(K) * 0x1p-24 * s + 0x1p-24 * (std::fabs(cr[at]) + std::fabs(bias[size_t(n)])) + 1e-30;
        ASSERT_LE(std::fabs(double(c[at]) - cr[at]), bound) << M << "x" << N << "x" << K << " at " << m << "," << n;
      }
  }
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

// Note [Norm backward from its output]. One norm (LayerNorm, or RMSNorm when rms) in fp64
// from the unrounded input: the exact gradients the kernels approximate, and each element's
// bound. With y' = bf16(y), |y' - y| <= 2^-8 |y|, so the recovered normalised input is off by
// e_c <= 2^-8 |y_c| / |w_c|; that propagates to dw_c by sum_rows |dy_c| e_c and to dx by
// rstd (e_c |m2| + (|xhat_c| + e_c) mean_c(|dy_c w_c| e_c)) (m1 and db read no xhat).
struct NormCase {
  std::vector<float> x, dy, w, b, rstd;
  std::vector<bf16> y;
  std::vector<double> dx, dw, db, dx_bound, dw_bound;
};

NormCase exact_norm(bool rms, int64_t N, int64_t C, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  NormCase k;
  k.x.resize(size_t(N * C)), k.dy.resize(k.x.size()), k.w.resize(size_t(C)), k.b.resize(size_t(C));
  for (int64_t i = 0; i < N; i++)  // rows with their own offset and spread, as a residual stream has
    for (float o = 3 * nd(rng), sc = std::exp(nd(rng)); float& v : std::span(k.x).subspan(size_t(i * C), size_t(C)))
      v = o + sc * nd(rng);
  for (auto& v : k.dy) v = nd(rng);
  for (auto& v : k.w) {  // a random w inside the clamp band |w| < eps (columns 1 and 2 test it) would
    v = 1 + 0.5f * nd(rng);  // move x_hat by the clamp itself, which the rounding bound does not cover
    if (std::fabs(v) < 1e-4f) v = std::copysign(1e-4f, v);
  }
  for (auto& v : k.b) v = rms ? 0.0f : 0.3f * nd(rng);
  k.w[1] = 0.0f, k.w[2] = -1e-9f;  // clamped to +-eps: finite, and matching the reference
  k.y.resize(k.x.size()), k.rstd.resize(size_t(N));
  k.dx.assign(k.x.size(), 0), k.dx_bound = k.dx, k.dw.assign(size_t(C), 0), k.db = k.dw, k.dw_bound = k.dw;
  for (int64_t i = 0; i < N; i++) {
    const float* x = &k.x[size_t(i * C)];
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; c++) mu += rms ? 0 : x[c];
    mu /= double(C);
    for (int64_t c = 0; c < C; c++) var += (x[c] - mu) * (x[c] - mu);
    k.rstd[size_t(i)] = float(1 / std::sqrt(var / double(C) + 1e-5));
    const double rs = k.rstd[size_t(i)];
    std::vector<double> xh(static_cast<size_t>(C)), e(static_cast<size_t>(C));
    double m1 = 0, m2 = 0, me = 0;
    for (int64_t c = 0; c < C; c++) {
      const size_t at = size_t(i * C + c);
      xh[size_t(c)] = (x[c] - mu) * rs;
      const double y = xh[size_t(c)] * k.w[size_t(c)] + k.b[size_t(c)];
      k.y[at] = to_bf16(float(y));
      e[size_t(c)] = 0x1p-8 * std::fabs(y) / std::max(std::fabs(double(k.w[size_t(c)])), 1e-5);
      const double g = double(k.dy[at]) * k.w[size_t(c)];
      m1 += g, m2 += g * xh[size_t(c)], me += std::fabs(g) * e[size_t(c)];
    }
    m1 = rms ? 0 : m1 / double(C), m2 /= double(C), me /= double(C);
    for (int64_t c = 0; c < C; c++) {
      const size_t at = size_t(i * C + c);
      k.dx[at] = rs * (double(k.dy[at]) * k.w[size_t(c)] - m1 - xh[size_t(c)] * m2);
      k.dx_bound[at] = rs * (e[size_t(c)] * std::fabs(m2) + (std::fabs(xh[size_t(c)]) + e[size_t(c)]) * me);
      k.dw[size_t(c)] += k.dy[at] * xh[size_t(c)], k.db[size_t(c)] += k.dy[at];
      k.dw_bound[size_t(c)] += std::fabs(k.dy[at]) * e[size_t(c)];
    }
  }
  return k;
}

// The cpu kernels against the reference (fp32 sums and 1/w against fp64 and a division:
// 1e-5 of each output's scale) and both against the exact fp64 gradients of the unrounded
// input within the bound above (plus 1e-5 of the scale), on odd shapes; the clamped
// columns (w = 0 and -1e-9) are checked against the reference and for being finite only.
TEST(Bf16, NormBackwardFromItsOutputStaysWithinTheRoundingBound) {
  const uint32_t seed = test_seed();
  std::mt19937 rng(seed);
  for (bool rms : {false, true})
    for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 5}, {37, 96}, {64, 77}, {9, 768}}) {
      const NormCase k = exact_norm(rms, N, C, rng);
      std::vector<float> dx(k.x.size(), 0.0f), dw(size_t(C), 0.0f), db = dw, dx_r = dx, dw_r = dw, db_r = dw;
      if (rms) {
        cpu::rmsnorm_backward_from_out(dx.data(), dw.data(), k.dy.data(), k.y.data(), k.w.data(), k.rstd.data(), N, C, 1e-5f);
        ref::rmsnorm_backward_from_out(dx_r.data(), dw_r.data(), k.dy.data(), k.y.data(), k.w.data(), k.rstd.data(), N, C,
                                       1e-5f);
      } else {
        cpu::layernorm_backward_from_out(dx.data(), dw.data(), db.data(), k.dy.data(), k.y.data(), k.w.data(),
                                         k.b.data(), k.rstd.data(), N, C, 1e-5f);
        ref::layernorm_backward_from_out(dx_r.data(), dw_r.data(), db_r.data(), k.dy.data(), k.y.data(), k.w.data(),
                                         k.b.data(), k.rstd.data(), N, C, 1e-5f);
      }
      auto scale = [](const std::vector<float>& v) {
        double m = 0;
        for (float f : v) m = std::max(m, double(std::fabs(f)));
        return m;
      };
      const double sx = scale(dx_r), sw = scale(dw_r);
      const std::string at = std::string(rms ? "rms " : "ln ") + std::to_string(N) + "x" + std::to_string(C) +
                             " (LOOM_TEST_SEED=" + std::to_string(seed) + ")";
      for (size_t i = 0; i < dx.size(); i++) {
        ASSERT_TRUE(std::isfinite(dx[i])) << at << " dx " << i;
        ASSERT_LE(std::fabs(dx[i] - dx_r[i]), 1e-5 * sx) << at << " dx " << i;
        const bool clamped = C > 2 && (i % size_t(C) == 1 || i % size_t(C) == 2);
        if (!clamped) ASSERT_LE(std::fabs(dx[i] - k.dx[i]), k.dx_bound[i] + 1e-5 * sx) << at << " dx " << i;
      }
      for (int64_t c = 0; c < C; c++) {
        // dw_c sums N products dy x_hat in fp32 with x_hat = (y - b) / w from an fp32 division:
        // within (N + 2) 2^-24 of the sum of |dy x_hat|, which a clamped column (x_hat ~ y / eps)
        // makes larger than 1e-5 of the scale.
        double abs_sum = 0;
        for (int64_t r = 0; r < N; r++) {
          const size_t at_rc = size_t(r * C + c);
          const double w_c = std::max(std::fabs(double(k.w[size_t(c)])), 1e-5);  // the clamp
          const double xh = (double(from_bf16(k.y[at_rc])) - k.b[size_t(c)]) / w_c;
          abs_sum += std::fabs(double(k.dy[at_rc]) * xh);
        }
        ASSERT_LE(std::fabs(dw[size_t(c)] - dw_r[size_t(c)]), 1e-5 * sw + double(N + 2) * 0x1p-24 * abs_sum)
            << at << " dw " << c;
        if (C <= 2 || (c != 1 && c != 2))
          ASSERT_LE(std::fabs(dw[size_t(c)] - k.dw[size_t(c)]), k.dw_bound[size_t(c)] + 1e-5 * sw) << at << " dw " << c;
        if (!rms) ASSERT_LE(std::fabs(db[size_t(c)] - k.db[size_t(c)]), 1e-5 * scale(db) + 1e-6) << at << " db " << c;
      }
    }
}

// The MLP activations' backward reading the pre-activation from its bf16 slot: identical,
// bit for bit, to the fp32 kernels on the widened values, on both kernel sets (GELU's
// overwrites its output: the fp32 kernel's sum into zeros, also in place over dout).
TEST(Bf16, ActivationBackwardReadsItsBf16InputExactly) {
  std::mt19937 rng(test_seed());
  std::normal_distribution<float> nd;
  for (auto [N, F] : {std::pair<int64_t, int64_t>{1, 3}, {7, 33}, {16, 128}}) {
    std::vector<bf16> h(size_t(N * 2 * F));
    std::vector<float> wide(h.size()), dy(size_t(N * F)), init(h.size());
    for (size_t i = 0; i < h.size(); i++) h[i] = to_bf16(3 * nd(rng)), wide[i] = from_bf16(h[i]), init[i] = nd(rng);
    for (auto& v : dy) v = nd(rng);
    const std::vector<float> zeros(init.size(), 0.0f);
    std::vector<float> a = init, b = zeros, c = init, d = zeros;
    cpu::gelu_backward_bf16_in(a.data(), h.data(), dy.data(), N * F);
    cpu::gelu_backward(b.data(), wide.data(), dy.data(), N * F);
    ref::gelu_backward_bf16_in(c.data(), h.data(), dy.data(), N * F);
    ref::gelu_backward(d.data(), wide.data(), dy.data(), N * F);
    a.resize(size_t(N * F)), b.resize(size_t(N * F)), c.resize(size_t(N * F)), d.resize(size_t(N * F));
    EXPECT_EQ(a, b) << N << "x" << F;
    EXPECT_EQ(c, d) << N << "x" << F;
    std::vector<float> in_place = dy, in_place_ref = dy;  // dinp = dout, one buffer
    cpu::gelu_backward_bf16_in(in_place.data(), h.data(), in_place.data(), N * F);
    ref::gelu_backward_bf16_in(in_place_ref.data(), h.data(), in_place_ref.data(), N * F);
    EXPECT_EQ(in_place, a) << N << "x" << F;
    EXPECT_EQ(in_place_ref, c) << N << "x" << F;
    a = b = c = d = init;
    cpu::swiglu_backward_bf16_in(a.data(), h.data(), dy.data(), N, F);
    cpu::swiglu_backward(b.data(), wide.data(), dy.data(), N, F);
    ref::swiglu_backward_bf16_in(c.data(), h.data(), dy.data(), N, F);
    ref::swiglu_backward(d.data(), wide.data(), dy.data(), N, F);
    EXPECT_EQ(a, b) << N << "x" << F;
    EXPECT_EQ(c, d) << N << "x" << F;
    EXPECT_NE(a, init);
  }
}

}  // namespace
}  // namespace loom
