// Every fast kernel (loom::cpu) against its naive reference (loom::ref) on fresh random
// inputs, including odd sizes: T = 1 and 13, C not a multiple of 16, V = 50257.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/ref/ops.h"
#include "loom/kernels/cpu/gemm_fp16.h"
#include "loom/kernels/kernels.h"
#include "loom/kernels/ref/gemm_fp16.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/ref/gemm_bf16.h"

namespace loom {
namespace {

class Rand {
 public:
  // LOOM_TEST_SEED reproduces a failure's printed seed.
  Rand() : seed_(std::getenv("LOOM_TEST_SEED") ? uint32_t(std::stoul(std::getenv("LOOM_TEST_SEED")))
                                               : std::random_device{}()),
           rng_(seed_) {}
  std::vector<float> normal(size_t n, float std = 1.0f) {
    std::normal_distribution<float> d(0.0f, std);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  std::vector<int32_t> ints(size_t n, int32_t hi) {
    std::uniform_int_distribution<int32_t> d(0, hi - 1);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  uint32_t seed() const { return seed_; }

 private:
  uint32_t seed_;
  std::mt19937 rng_;
};

// max |a-b| / max(|b|): error relative to the reference's scale (floored at 1e-2 so a
// lone near-zero output, e.g. GELU(-10), is judged by its absolute error). A NaN on
// either side is an infinite error (std::max would drop it).
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-2;
  for (size_t i = 0; i < b.size(); i++) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

#define EXPECT_CLOSE(a, b, tol) EXPECT_LT(rel(a, b), tol) << "seed " << rnd.seed()

struct Dims {
  int64_t B, T, C;
};
const Dims kDims[] = {{1, 1, 8}, {2, 13, 36}, {3, 17, 50}, {2, 64, 128}};

TEST(Kernels, Embedding) {
  Rand rnd;
  for (auto [B, T, C] : kDims) {
    const int64_t V = 300;
    auto wte = rnd.normal(V * C), wpe = rnd.normal(T * C), dout = rnd.normal(B * T * C);
    auto tok = rnd.ints(B * T, 7);  // few distinct ids: repeated rows in backward
    std::vector<float> o1(B * T * C), o2(B * T * C);
    ref::embedding_forward(o1.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    cpu::embedding_forward(o2.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    EXPECT_CLOSE(o2, o1, 1e-7);
    std::vector<float> dw1(V * C, 0.5f), dw2 = dw1, dp1(T * C, 0.25f), dp2 = dp1;
    ref::embedding_backward(dw1.data(), dp1.data(), dout.data(), tok.data(), B, T, C);
    cpu::embedding_backward(dw2.data(), dp2.data(), dout.data(), tok.data(), B, T, C);
    EXPECT_CLOSE(dw2, dw1, 1e-6);
    EXPECT_CLOSE(dp2, dp1, 1e-6);
  }
}

TEST(Kernels, LayerNormAndRmsNorm) {
  Rand rnd;
  for (auto [B, T, C] : kDims) {
    const int64_t N = B * T;
    auto x = rnd.normal(N * C, 2.0f), w = rnd.normal(C), b = rnd.normal(C), dy = rnd.normal(N * C);
    for (auto& v : x) v += 3.0f;  // a mean offset
    std::vector<float> y1(N * C), y2(N * C), m1(N), m2(N), r1(N), r2(N);
    ref::layernorm_forward(y1.data(), m1.data(), r1.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    cpu::layernorm_forward(y2.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    EXPECT_CLOSE(y2, y1, 1e-5);
    EXPECT_CLOSE(r2, r1, 1e-5);
    std::vector<float> dx1(N * C, 0.1f), dx2 = dx1, dw1(C, 0.2f), dw2 = dw1, db1(C), db2(C);
    ref::layernorm_backward(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), m1.data(), r1.data(), N, C);
    cpu::layernorm_backward(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), m1.data(), r1.data(), N, C);
    EXPECT_CLOSE(dx2, dx1, 1e-4);
    EXPECT_CLOSE(dw2, dw1, 1e-5);
    EXPECT_CLOSE(db2, db1, 1e-5);

    ref::rmsnorm_forward(y1.data(), r1.data(), x.data(), w.data(), N, C, 1e-5f);
    cpu::rmsnorm_forward(y2.data(), r2.data(), x.data(), w.data(), N, C, 1e-5f);
    EXPECT_CLOSE(y2, y1, 1e-5);
    std::fill(dx1.begin(), dx1.end(), 0.f), std::fill(dx2.begin(), dx2.end(), 0.f);
    ref::rmsnorm_backward(dx1.data(), dw1.data(), dy.data(), x.data(), w.data(), r1.data(), N, C);
    cpu::rmsnorm_backward(dx2.data(), dw2.data(), dy.data(), x.data(), w.data(), r1.data(), N, C);
    EXPECT_CLOSE(dx2, dx1, 1e-4);
    EXPECT_CLOSE(dw2, dw1, 1e-5);
  }
}

// Note [Fresh gradients]: with fresh, dw and db are overwritten (their NaNs never read), the
// same bits as accumulating into zeros; the reference agrees within tol.
using MatmulBackwardFn = void (*)(float*, float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                  int64_t, bool);
void expect_fresh_overwrites(MatmulBackwardFn fast, MatmulBackwardFn ref, const std::vector<float>& dy,
                             const std::vector<float>& x, const std::vector<float>& w, int64_t N, int64_t IC,
                             int64_t OC, double tol) {
  std::vector<float> dx(N * IC), zw(OC * IC, 0.0f), zb(OC, 0.0f), fw(OC * IC, NAN), fb(OC, NAN), rw = fw, rb = fb;
  fast(dx.data(), zw.data(), zb.data(), dy.data(), x.data(), w.data(), N, IC, OC, false);
  fast(dx.data(), fw.data(), fb.data(), dy.data(), x.data(), w.data(), N, IC, OC, true);
  ref(dx.data(), rw.data(), rb.data(), dy.data(), x.data(), w.data(), N, IC, OC, true);
  EXPECT_EQ(fw, zw);
  EXPECT_EQ(fb, zb);
  EXPECT_LT(rel(rw, zw), tol);
  EXPECT_LT(rel(rb, zb), 1e-5);
}

TEST(Kernels, Matmul) {
  Rand rnd;
  for (auto [B, T, C] : kDims) {
    const int64_t N = B * T, OC = 3 * C + 1;
    auto x = rnd.normal(N * C), w = rnd.normal(OC * C), bias = rnd.normal(OC), dy = rnd.normal(N * OC);
    std::vector<float> y1(N * OC), y2(N * OC);
    ref::matmul_forward(y1.data(), x.data(), w.data(), bias.data(), N, C, OC);
    cpu::matmul_forward(y2.data(), x.data(), w.data(), bias.data(), N, C, OC);
    EXPECT_CLOSE(y2, y1, 1e-5);
    cpu::matmul_forward(y2.data(), x.data(), w.data(), nullptr, N, C, OC);
    ref::matmul_forward(y1.data(), x.data(), w.data(), nullptr, N, C, OC);
    EXPECT_CLOSE(y2, y1, 1e-5);
    // dx is overwritten (its NaN must not reach the result); dw, db accumulate.
    std::vector<float> dx1(N * C, 1.f), dx2(N * C, NAN), dw1(OC * C, -1.f), dw2 = dw1, db1(OC, 2.f), db2 = db1;
    ref::matmul_backward(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), N, C, OC, false);
    cpu::matmul_backward(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), N, C, OC, false);
    EXPECT_CLOSE(dx2, dx1, 1e-5);
    EXPECT_CLOSE(dw2, dw1, 1e-5);
    EXPECT_CLOSE(db2, db1, 1e-5);
    expect_fresh_overwrites(cpu::matmul_backward, ref::matmul_backward, dy, x, w, N, C, OC, 1e-5);
  }
}

TEST(Kernels, GeluAndSwiglu) {
  Rand rnd;
  for (int64_t n : {1, 13, 1000, 4099}) {
    auto x = rnd.normal(n, 3.0f), dy = rnd.normal(n);
    std::vector<float> y1(n), y2(n), d1(n, 0.5f), d2 = d1;
    ref::gelu_forward(y1.data(), x.data(), n);
    cpu::gelu_forward(y2.data(), x.data(), n);
    EXPECT_CLOSE(y2, y1, 1e-5);
    ref::gelu_backward(d1.data(), x.data(), dy.data(), n);
    cpu::gelu_backward(d2.data(), x.data(), dy.data(), n);
    EXPECT_CLOSE(d2, d1, 1e-5);
  }
  for (auto [B, T, C] : kDims) {
    const int64_t N = B * T, F = C + 3;
    auto x = rnd.normal(N * 2 * F, 3.0f), dy = rnd.normal(N * F);
    std::vector<float> y1(N * F), y2(N * F), d1(N * 2 * F, 0.1f), d2 = d1;
    ref::swiglu_forward(y1.data(), x.data(), N, F);
    cpu::swiglu_forward(y2.data(), x.data(), N, F);
    EXPECT_CLOSE(y2, y1, 1e-5);
    ref::swiglu_backward(d1.data(), x.data(), dy.data(), N, F);
    cpu::swiglu_backward(d2.data(), x.data(), dy.data(), N, F);
    EXPECT_CLOSE(d2, d1, 1e-5);
  }
}

struct AttnDims {
  int64_t B, T, H, KV, hd;
};
const AttnDims kAttn[] = {{1, 1, 2, 2, 8}, {2, 13, 4, 4, 9}, {2, 13, 6, 2, 10}, {1, 64, 3, 1, 16}, {2, 33, 8, 4, 12}};

TEST(Kernels, RopeAndAttention) {
  Rand rnd;
  for (auto [B, T, H, KV, hd] : kAttn) {
    const int64_t Q = (H + 2 * KV) * hd, N = B * T;
    auto qkv = rnd.normal(N * Q), dy = rnd.normal(N * H * hd);
    if (hd % 2 == 0) {
      auto r1 = qkv, r2 = qkv;
      ref::rope_forward(r1.data(), B, T, H, KV, hd, 10000.f, nullptr);
      cpu::rope_forward(r2.data(), B, T, H, KV, hd, 10000.f, nullptr);
      EXPECT_CLOSE(r2, r1, 1e-5);
      cpu::rope_backward(r2.data(), B, T, H, KV, hd, 10000.f, nullptr);  // inverse rotation
      EXPECT_CLOSE(r2, qkv, 1e-5);
      ref::rope_backward(r1.data(), B, T, H, KV, hd, 10000.f, nullptr);
      EXPECT_CLOSE(r1, qkv, 1e-5);
    }
    std::vector<float> y1(N * H * hd), y2(y1.size()), p1(B * H * T * T), p2(p1.size());
    ref::attention_forward(y1.data(), p1.data(), qkv.data(), B, T, H, KV, hd, nullptr);
    cpu::attention_forward(y2.data(), p2.data(), qkv.data(), B, T, H, KV, hd, nullptr);
    EXPECT_CLOSE(y2, y1, 1e-5);
    EXPECT_CLOSE(p2, p1, 1e-5);
    {  // document-causal: random document boundaries in each row
      std::vector<int32_t> starts(static_cast<size_t>(N));
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0, s = 0; t < T; t++) {
          if (t > 0 && rnd.normal(1)[0] > 0.8f) s = int32_t(t);
          starts[size_t(b * T + t)] = int32_t(s);
        }
      std::vector<float> m1(y1.size()), m2(y1.size()), q1(p1.size()), q2(p1.size());
      ref::attention_forward(m1.data(), q1.data(), qkv.data(), B, T, H, KV, hd, starts.data());
      cpu::attention_forward(m2.data(), q2.data(), qkv.data(), B, T, H, KV, hd, starts.data());
      EXPECT_CLOSE(m2, m1, 1e-5);
      EXPECT_CLOSE(q2, q1, 1e-5);
      for (int64_t b = 0; b < B; b++)  // no probability crosses a document start
        for (int64_t h = 0; h < H; h++)
          for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < starts[size_t(b * T + t)]; j++)
              ASSERT_EQ(q2[size_t(((b * H + h) * T + t) * T + j)], 0.0f);
    }
    std::vector<float> d1(N * Q, 0.3f), d2 = d1;
    ref::attention_backward(d1.data(), dy.data(), qkv.data(), p1.data(), B, T, H, KV, hd);
    cpu::attention_backward(d2.data(), dy.data(), qkv.data(), p1.data(), B, T, H, KV, hd);
    EXPECT_CLOSE(d2, d1, 1e-5);
  }
}

// Note [Vocabulary-parallel softmax]: one rank's columns exponentiated against the agreed
// row maxima, padding zeroed, and the row sums; a rank holding only padding sums to 0.
TEST(Kernels, SoftmaxExpRowsOfOneRanksColumns) {
  Rand rnd;
  for (auto [rows, V, valid] : {std::tuple<int64_t, int64_t, int64_t>{7, 25129, 25128}, {5, 300, 300}, {3, 16, 0}}) {
    auto z = rnd.normal(rows * V, 4.0f);
    std::vector<float> mx(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; i++)  // the group's maximum may exceed this rank's
      mx[size_t(i)] = valid == 0 ? -INFINITY : *std::max_element(z.begin() + i * V, z.begin() + i * V + valid) + 0.5f * float(i);
    auto e1 = z, e2 = z;
    std::vector<float> s1(static_cast<size_t>(rows), -1.0f), s2 = s1;
    ref::softmax_exp_rows(e1.data(), mx.data(), s1.data(), rows, V, valid);
    cpu::softmax_exp_rows(e2.data(), mx.data(), s2.data(), rows, V, valid);
    EXPECT_CLOSE(e2, e1, 1e-6);
    EXPECT_CLOSE(s2, s1, 1e-5);  // float sums over ~25k terms
    for (int64_t i = 0; i < rows; i++) {
      for (int64_t v = valid; v < V; v++) ASSERT_EQ(e2[size_t(i * V + v)], 0.0f) << "padding column " << v;
      if (valid == 0) EXPECT_EQ(s2[size_t(i)], 0.0f);
      else EXPECT_NEAR(e1[size_t(i * V)], std::exp(double(z[size_t(i * V)]) - mx[size_t(i)]), 1e-6);
    }
  }
}

TEST(Kernels, CrossEntropyAndFusedHeadAtGpt2Vocab) {
  Rand rnd;
  for (auto [N, C, V] : {std::tuple<int64_t, int64_t, int64_t>{5, 20, 50257}, {13, 36, 256}, {1, 8, 7}}) {
    // Float sums over K = V terms carry ~sqrt(K) * 2^-24 relative error, amplified by the
    // cancellation in sum_j (p_j - y_j) w_j; at V = 50257 that reaches ~5e-5 of the scale.
    // Small V: a confident row has loss ~1e-4 = log(z ~ 1.0001), where float rounding of z
    // alone is 6e-8 absolute.
    const double tol = V > 1000 ? 2e-4 : 3e-5;
    auto x = rnd.normal(N * C), w = rnd.normal(V * C, 0.5f);
    auto tgt = rnd.ints(N, int32_t(V));
    std::vector<float> l1(N), l2(N), dx1(N * C, 0.1f), dx2(N * C, NAN), dw1(V * C, -0.1f), dw2 = dw1;
    ref::lm_head_loss(l1.data(), dx1.data(), dw1.data(), x.data(), w.data(), tgt.data(), N, C, V, 0.37f);
    cpu::lm_head_loss(l2.data(), dx2.data(), dw2.data(), x.data(), w.data(), tgt.data(), N, C, V, 0.37f);
    EXPECT_CLOSE(l2, l1, tol);
    EXPECT_CLOSE(dx2, dx1, tol);
    EXPECT_CLOSE(dw2, dw1, tol);
    std::vector<float> l3(N);
    cpu::lm_head_loss(l3.data(), nullptr, nullptr, x.data(), w.data(), tgt.data(), N, C, V, 0.f);
    EXPECT_CLOSE(l3, l1, tol);

    auto logits = rnd.normal(N * V, 4.0f);
    ref::crossentropy_forward(l1.data(), logits.data(), tgt.data(), N, V);
    cpu::crossentropy_forward(l2.data(), logits.data(), tgt.data(), N, V);
    EXPECT_CLOSE(l2, l1, tol);
    auto g1 = logits, g2 = logits;
    auto dl = rnd.normal(N);
    ref::crossentropy_backward_inplace(g1.data(), tgt.data(), dl.data(), N, V);
    cpu::crossentropy_backward_inplace(g2.data(), tgt.data(), dl.data(), N, V);
    EXPECT_CLOSE(g2, g1, tol);

    std::vector<float> r1(V), r2(V);
    ref::lm_head_logits_row(r1.data(), x.data(), w.data(), C, V);
    cpu::lm_head_logits_row(r2.data(), x.data(), w.data(), C, V);
    EXPECT_CLOSE(r2, r1, tol);
  }
}

// Padding targets (kIgnoreTarget) add nothing: the losses and gradients over a batch with
// ignored rows equal those over the real rows alone, in both kernel sets.
TEST(Kernels, IgnoredTargetsAddNoLossAndNoGradient) {
  Rand rnd;
  for (auto [N, C, V] : {std::tuple<int64_t, int64_t, int64_t>{9, 16, 300}, {6, 8, 7}}) {
    auto x = rnd.normal(N * C), w = rnd.normal(V * C, 0.5f);
    auto tgt = rnd.ints(N, int32_t(V));
    std::vector<int64_t> real;
    for (int64_t i = 0; i < N; i++) {
      // Row 0 is always ignored, the last row never (so some row is real whatever the draw).
      if ((rnd.ints(1, 3)[0] == 0 || i == 0) && i + 1 < N) tgt[size_t(i)] = kIgnoreTarget;
      else real.push_back(i);
    }
    ASSERT_FALSE(real.empty());
    const int64_t R = int64_t(real.size());
    std::vector<float> xr, dxr(size_t(R * C), 0.0f), dwr(size_t(V * C), 0.0f), lr(static_cast<size_t>(R));
    std::vector<int32_t> tr;
    for (int64_t i : real) {
      xr.insert(xr.end(), x.begin() + i * C, x.begin() + (i + 1) * C);
      tr.push_back(tgt[size_t(i)]);
    }
    ref::lm_head_loss(lr.data(), dxr.data(), dwr.data(), xr.data(), w.data(), tr.data(), R, C, V, 0.5f);
    for (bool fast : {false, true}) {
      std::vector<float> l(size_t(N), 7.0f), dx(size_t(N * C), 0.0f), dw(size_t(V * C), 0.0f);
      (fast ? cpu::lm_head_loss : ref::lm_head_loss)(l.data(), dx.data(), dw.data(), x.data(), w.data(), tgt.data(),
                                                     N, C, V, 0.5f);
      for (int64_t i = 0, k = 0; i < N; i++) {
        if (tgt[size_t(i)] == kIgnoreTarget) {
          EXPECT_EQ(l[size_t(i)], 0.0f) << "row " << i;
          for (int64_t c = 0; c < C; c++) EXPECT_EQ(dx[size_t(i * C + c)], 0.0f);
          continue;
        }
        EXPECT_NEAR(l[size_t(i)], lr[size_t(k)], 1e-5 * (1 + lr[size_t(k)]));
        for (int64_t c = 0; c < C; c++) EXPECT_NEAR(dx[size_t(i * C + c)], dxr[size_t(k * C + c)], 1e-5);
        k++;
      }
      EXPECT_CLOSE(dw, dwr, 1e-5);
    }
    auto logits = rnd.normal(N * V, 4.0f);
    auto dl = rnd.normal(N);
    for (bool fast : {false, true}) {
      auto g = logits;
      (fast ? cpu::crossentropy_backward_inplace : ref::crossentropy_backward_inplace)(g.data(), tgt.data(), dl.data(),
                                                                                      N, V);
      std::vector<float> l(size_t(N), 7.0f);
      (fast ? cpu::crossentropy_forward : ref::crossentropy_forward)(l.data(), logits.data(), tgt.data(), N, V);
      for (int64_t i = 0; i < N; i++) {  // row 0 is always ignored
        if (tgt[size_t(i)] != kIgnoreTarget) continue;
        EXPECT_EQ(l[size_t(i)], 0.0f);
        for (int64_t v = 0; v < V; v++) EXPECT_EQ(g[size_t(i * V + v)], 0.0f);
      }
    }
  }
}

// train.precision = bf16 (Note [bf16 rounding points]): the fast linear and LM-head kernels
// against the reference with the same rounding points. Both sum the same exact products of
// bf16 inputs; they differ by fp32 accumulation, <= K 2^-24 sum |a b| per output: at most
// ~3e-5 of the output scale for K <= 512 here, so 1e-4 (vs rel()'s scale) is the bound.
// Against the fp32 kernels they differ by the inputs' bf16 rounding (2^-8 each): more than
// 1e-4 of the scale and at most 2^-6 of it.
TEST(Kernels, Bf16LinearAndHeadMatchTheirReference) {
  Rand rnd;
  for (auto [N, IC, OC] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 4}, {26, 36, 50}, {128, 128, 512}, {64, 512, 96}}) {
    auto x = rnd.normal(N * IC), w = rnd.normal(OC * IC, 0.3f), b = rnd.normal(OC), dout = rnd.normal(N * OC);
    std::vector<float> y1(N * OC), y2 = y1, y32 = y1;
    ref::matmul_forward_bf16(y1.data(), x.data(), w.data(), b.data(), N, IC, OC);
    cpu::matmul_forward_bf16(y2.data(), x.data(), w.data(), b.data(), N, IC, OC);
    ref::matmul_forward(y32.data(), x.data(), w.data(), b.data(), N, IC, OC);
    EXPECT_CLOSE(y2, y1, 1e-4);
    if (IC > 8) {
      EXPECT_GT(rel(y1, y32), 1e-4) << "the bf16 kernels must round their inputs";
    }
    EXPECT_LT(rel(y1, y32), 0x1p-6);
    std::vector<float> dx1(N * IC, 0.5f), dx2(N * IC, NAN), dw1(OC * IC, -0.25f), dw2 = dw1, db1(OC, 1.0f), db2 = db1;
    ref::matmul_backward_bf16(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), N, IC, OC, false);
    cpu::matmul_backward_bf16(dx2.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(), N, IC, OC, false);
    expect_fresh_overwrites(cpu::matmul_backward_bf16, ref::matmul_backward_bf16, dout, x, w, N, IC, OC, 1e-4);
    EXPECT_CLOSE(dx2, dx1, 1e-4);
    EXPECT_CLOSE(dw2, dw1, 1e-4);
    EXPECT_CLOSE(db2, db1, 1e-5);  // fp32 sums of fp32 dout
    // The head: logits GEMM and both backward GEMMs in bf16, softmax in fp32.
    const int64_t V = OC * 3 + 1;
    auto wh = rnd.normal(V * IC, 0.3f);
    auto tgt = rnd.ints(N, int32_t(V));
    std::vector<float> l1(N), l2(N), hx1(N * IC, 0.5f), hx2(N * IC, NAN), hw1(V * IC, 0.0f), hw2 = hw1;
    ref::lm_head_loss_bf16(l1.data(), hx1.data(), hw1.data(), x.data(), wh.data(), tgt.data(), N, IC, V, 0.5f);
    cpu::lm_head_loss_bf16(l2.data(), hx2.data(), hw2.data(), x.data(), wh.data(), tgt.data(), N, IC, V, 0.5f);
    EXPECT_CLOSE(l2, l1, 1e-4);
    // The head's dlogits come from each side's fp32 softmax (the fast one uses exp_approx,
    // ~1e-6 relative apart); an element next to a bf16 rounding boundary rounds the other
    // way, moving it by up to 2^-8 of itself. Bound 2^-7 of the scale (observed up to 2.4e-3).
    EXPECT_CLOSE(hx2, hx1, 0x1p-7);
    EXPECT_CLOSE(hw2, hw1, 0x1p-7);
  }
  // The kernel table swaps exactly these three.
  const Kernels& k = kernels(KernelBackend::kCpu, Precision::kBf16);
  EXPECT_EQ(k.matmul_forward, &cpu::matmul_forward_bf16);
  EXPECT_EQ(k.lm_head_loss, &cpu::lm_head_loss_bf16);
  EXPECT_EQ(k.attention_forward, &cpu::attention_forward);
  EXPECT_EQ(kernels(KernelBackend::kRef, Precision::kBf16).matmul_backward, &ref::matmul_backward_bf16);
}

// train.precision = fp16: the same contract with fp16 rounding (2^-11 per input) and fp32
// GEMMs on the rounded copies. Fast vs reference: fp32 vs fp64 sums of the same exact
// products, the bf16 test's bound (1e-4; the head 2^-9, as a dlogit next to an fp16 rounding
// boundary may round the other way, moving it by 2^-11 of itself). Against fp32: more than
// 1e-6 and less than 2^-8 of the scale. An input past fp16's range (65504) is infinite.
TEST(Kernels, Fp16LinearAndHeadMatchTheirReference) {
  Rand rnd;
  for (auto [N, IC, OC] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 4}, {26, 36, 50}, {64, 512, 96}}) {
    auto x = rnd.normal(N * IC), w = rnd.normal(OC * IC, 0.3f), b = rnd.normal(OC), dout = rnd.normal(N * OC);
    std::vector<float> y1(N * OC), y2 = y1, y32 = y1;
    ref::matmul_forward_fp16(y1.data(), x.data(), w.data(), b.data(), N, IC, OC);
    cpu::matmul_forward_fp16(y2.data(), x.data(), w.data(), b.data(), N, IC, OC);
    ref::matmul_forward(y32.data(), x.data(), w.data(), b.data(), N, IC, OC);
    EXPECT_CLOSE(y2, y1, 1e-4);
    if (IC > 8) {
      EXPECT_GT(rel(y1, y32), 1e-6) << "the fp16 kernels must round their inputs";
    }
    EXPECT_LT(rel(y1, y32), 0x1p-8);
    std::vector<float> dx1(N * IC, 0.5f), dx2(N * IC, NAN), dw1(OC * IC, -0.25f), dw2 = dw1, db1(OC, 1.0f), db2 = db1;
    ref::matmul_backward_fp16(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), N, IC, OC, false);
    cpu::matmul_backward_fp16(dx2.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(), N, IC, OC, false);
    expect_fresh_overwrites(cpu::matmul_backward_fp16, ref::matmul_backward_fp16, dout, x, w, N, IC, OC, 1e-4);
    EXPECT_CLOSE(dx2, dx1, 1e-4);
    EXPECT_CLOSE(dw2, dw1, 1e-4);
    EXPECT_CLOSE(db2, db1, 1e-5);
    const int64_t V = OC * 3 + 1;
    auto wh = rnd.normal(V * IC, 0.3f);
    auto tgt = rnd.ints(N, int32_t(V));
    std::vector<float> l1(N), l2(N), hx1(N * IC, 0.5f), hx2(N * IC, NAN), hw1(V * IC, 0.0f), hw2 = hw1;
    ref::lm_head_loss_fp16(l1.data(), hx1.data(), hw1.data(), x.data(), wh.data(), tgt.data(), N, IC, V, 0.5f);
    cpu::lm_head_loss_fp16(l2.data(), hx2.data(), hw2.data(), x.data(), wh.data(), tgt.data(), N, IC, V, 0.5f);
    EXPECT_CLOSE(l2, l1, 1e-4);
    EXPECT_CLOSE(hx2, hx1, 0x1p-9);
    EXPECT_CLOSE(hw2, hw1, 0x1p-9);
    // Overflow: one upstream gradient of 1e5 is infinite in fp16, and so are the outputs it reaches.
    dout[0] = 1e5f;
    for (bool fast : {false, true}) {
      std::vector<float> dx(N * IC, 0.0f), dw(OC * IC, 0.0f);
      (fast ? cpu::matmul_backward_fp16 : ref::matmul_backward_fp16)(dx.data(), dw.data(), nullptr, dout.data(),
                                                                     x.data(), w.data(), N, IC, OC, false);
      EXPECT_FALSE(std::isfinite(dw[0])) << (fast ? "cpu" : "ref");
      EXPECT_FALSE(std::isfinite(dx[0])) << (fast ? "cpu" : "ref");
    }
  }
  const Kernels& k = kernels(KernelBackend::kCpu, Precision::kFp16);
  EXPECT_EQ(k.matmul_forward, &cpu::matmul_forward_fp16);
  EXPECT_EQ(k.matmul_backward, &cpu::matmul_backward_fp16);
  EXPECT_EQ(k.lm_head_loss, &cpu::lm_head_loss_fp16);
  EXPECT_EQ(k.attention_forward, &cpu::attention_forward);
  EXPECT_EQ(kernels(KernelBackend::kRef, Precision::kFp16).lm_head_loss, &ref::lm_head_loss_fp16);
}

TEST(Kernels, AdamWAndReductions) {
  Rand rnd;
  for (int64_t n : {1, 17, 10007}) {
    auto p = rnd.normal(n), g = rnd.normal(n), m = rnd.normal(n, 0.1f), v = rnd.normal(n, 0.1f);
    for (auto& x : v) x = x * x;
    auto p1 = p, p2 = p, m1 = m, m2 = m, v1 = v, v2 = v;
    for (int64_t step : {1, 2, 50}) {
      ref::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
      cpu::adamw_update(p2.data(), g.data(), m2.data(), v2.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
    EXPECT_CLOSE(p2, p1, 1e-5);
    EXPECT_CLOSE(m2, m1, 1e-6);
    EXPECT_CLOSE(v2, v1, 1e-6);
    // grad_scale (the clipping coefficient) gives the bits of scaling the gradients first.
    for (bool fast : {true, false}) {
      auto pa = p, pb = p, ma = m, mb = m, va = v, vb = v, gs = g;
      (fast ? cpu::scale_inplace : ref::scale_inplace)(gs.data(), n, 0.37f);
      auto adamw = fast ? cpu::adamw_update : ref::adamw_update;
      adamw(pa.data(), g.data(), ma.data(), va.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.37f);
      adamw(pb.data(), gs.data(), mb.data(), vb.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 1.0f);
      EXPECT_EQ(pa, pb) << n << (fast ? " cpu" : " ref");
      EXPECT_EQ(ma, mb) << n;
      EXPECT_EQ(va, vb) << n;
      EXPECT_NE(pa, p) << n;
    }
    EXPECT_NEAR(cpu::sum_squares(g.data(), n), ref::sum_squares(g.data(), n), 1e-5 * ref::sum_squares(g.data(), n));
    auto s1 = g, s2 = g;
    ref::scale_inplace(s1.data(), n, 0.3f);
    cpu::scale_inplace(s2.data(), n, 0.3f);
    EXPECT_CLOSE(s2, s1, 1e-7);
    std::vector<float> r1(n), r2(n);
    ref::residual_forward(r1.data(), p.data(), g.data(), n);
    cpu::residual_forward(r2.data(), p.data(), g.data(), n);
    EXPECT_CLOSE(r2, r1, 1e-7);
  }
}

}  // namespace
}  // namespace loom
