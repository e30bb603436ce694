// Finite-difference gradient checks, in double precision, of every reference op's
// backward (the reference is the oracle for the fast kernels, so it must be right).
// For an op y = f(x) and a fixed random R, L(x) = sum(y * R); backward with dy = R gives
// dL/dx, compared with (L(x + h e_i) - L(x - h e_i)) / 2h on sampled coordinates.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "loom/kernels/ref/ops_t.h"

namespace loom::ref::tmpl {
namespace {

using Vec = std::vector<double>;
std::mt19937 g_rng(12345);

Vec randn(size_t n, double std = 1.0) {
  std::normal_distribution<double> d(0, std);
  Vec v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// Compares analytic `grad` of loss(x) with central differences at up to 25 coordinates.
void check(const char* what, Vec& x, const Vec& grad, const std::function<double()>& loss) {
  std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
  const double h = 1e-6;
  for (int k = 0; k < 25; k++) {
    const size_t i = x.size() <= 25 ? size_t(k) % x.size() : pick(g_rng);
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double num = (lp - lm) / (2 * h);
    EXPECT_NEAR(grad[i], num, 1e-6 * std::max(1.0, std::fabs(num))) << what << " coordinate " << i;
  }
}

TEST(GradCheck, LayerNormAndRmsNorm) {
  const int64_t N = 5, C = 7;
  Vec x = randn(N * C), w = randn(C), b = randn(C), R = randn(N * C);
  Vec y(N * C), mean(N), rstd(N);
  auto ln_loss = [&] {
    layernorm_forward<double>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
    return dot(y, R);
  };
  ln_loss();
  Vec dx(N * C), dw(C), db(C);
  layernorm_backward<double>(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  check("layernorm dx", x, dx, ln_loss);
  check("layernorm dw", w, dw, ln_loss);
  check("layernorm db", b, db, ln_loss);

  auto rms_loss = [&] {
    rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    return dot(y, R);
  };
  rms_loss();
  Vec rdx(N * C), rdw(C);
  rmsnorm_backward<double>(rdx.data(), rdw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  check("rmsnorm dx", x, rdx, rms_loss);
  check("rmsnorm dw", w, rdw, rms_loss);
}

TEST(GradCheck, MatmulGeluSwiglu) {
  const int64_t N = 4, IC = 6, OC = 5;
  Vec x = randn(N * IC), w = randn(OC * IC), b = randn(OC), R = randn(N * OC), y(N * OC);
  auto mm = [&] {
    matmul_forward<double>(y.data(), x.data(), w.data(), b.data(), N, IC, OC);
    return dot(y, R);
  };
  Vec dx(N * IC), dw(OC * IC), db(OC);
  matmul_backward<double>(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
  check("matmul dx", x, dx, mm);
  check("matmul dw", w, dw, mm);
  check("matmul db", b, db, mm);

  Vec g = randn(40, 2.0), Rg = randn(40), yg(40), dg(40);
  auto gl = [&] {
    gelu_forward<double>(yg.data(), g.data(), 40);
    return dot(yg, Rg);
  };
  gelu_backward<double>(dg.data(), g.data(), Rg.data(), 40);
  check("gelu", g, dg, gl);

  const int64_t F = 6;
  Vec s = randn(N * 2 * F, 2.0), Rs = randn(N * F), ys(N * F), ds(N * 2 * F);
  auto sl = [&] {
    swiglu_forward<double>(ys.data(), s.data(), N, F);
    return dot(ys, Rs);
  };
  swiglu_backward<double>(ds.data(), s.data(), Rs.data(), N, F);
  check("swiglu", s, ds, sl);
}

TEST(GradCheck, RopeAndAttention) {
  const int64_t B = 2, T = 5, H = 4, KV = 2, hd = 6, Q = (H + 2 * KV) * hd;
  Vec qkv = randn(B * T * Q), R = randn(B * T * Q);
  auto rope_loss = [&] {
    Vec t = qkv;
    rope_forward<double>(t.data(), B, T, H, KV, hd, 10000.0);
    return dot(t, R);
  };
  Vec dr = R;
  rope_backward<double>(dr.data(), B, T, H, KV, hd, 10000.0);
  check("rope", qkv, dr, rope_loss);

  Vec Ry = randn(B * T * H * hd), y(B * T * H * hd), p(B * H * T * T);
  auto attn = [&] {
    attention_forward<double>(y.data(), p.data(), qkv.data(), B, T, H, KV, hd);
    return dot(y, Ry);
  };
  attn();
  Vec dq(B * T * Q);
  attention_backward<double>(dq.data(), Ry.data(), qkv.data(), p.data(), B, T, H, KV, hd);
  check("attention dqkv", qkv, dq, attn);
  // Document-causal: a document starts at position T/2 of every row; backward is unchanged
  // (masked probabilities are 0), and the finite differences must agree with it.
  std::vector<int32_t> starts(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; i++) starts[size_t(i)] = int32_t(i % T >= T / 2 ? T / 2 : 0);
  auto attn_doc = [&] {
    attention_forward<double>(y.data(), p.data(), qkv.data(), B, T, H, KV, hd, starts.data());
    return dot(y, Ry);
  };
  attn_doc();
  Vec dm(B * T * Q);
  attention_backward<double>(dm.data(), Ry.data(), qkv.data(), p.data(), B, T, H, KV, hd);
  check("document-causal attention dqkv", qkv, dm, attn_doc);
}

TEST(GradCheck, EmbeddingCrossEntropyHead) {
  const int64_t B = 2, T = 3, C = 4, V = 9, N = B * T;
  std::vector<int32_t> tok = {1, 4, 1, 8, 0, 4}, tgt = {3, 3, 0, 8, 2, 5};
  Vec wte = randn(V * C), wpe = randn(T * C), R = randn(N * C), y(N * C);
  auto emb = [&] {
    embedding_forward<double>(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(y, R);
  };
  Vec dwte(V * C), dwpe(T * C);
  embedding_backward<double>(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  check("embedding dwte", wte, dwte, emb);
  check("embedding dwpe", wpe, dwpe, emb);

  Vec logits = randn(N * V, 2.0), losses(N), dl(N, 0.0);
  Vec Rl = randn(N);
  auto ce = [&] {
    crossentropy_forward<double>(losses.data(), logits.data(), tgt.data(), N, V);
    return dot(losses, Rl);
  };
  Vec g = logits;
  crossentropy_backward_inplace<double>(g.data(), tgt.data(), Rl.data(), N, V);
  check("cross-entropy", logits, g, ce);

  Vec x = randn(N * C), w = randn(V * C);
  const double scale = 0.7;
  auto head = [&] {
    lm_head_loss<double>(losses.data(), nullptr, nullptr, x.data(), w.data(), tgt.data(), N, C, V, 0.0);
    double s = 0;
    for (double l : losses) s += l;
    return scale * s;
  };
  Vec dx(N * C), dw(V * C);
  lm_head_loss<double>(losses.data(), dx.data(), dw.data(), x.data(), w.data(), tgt.data(), N, C, V, scale);
  check("lm head dx", x, dx, head);
  check("lm head dw", w, dw, head);
}

}  // namespace
}  // namespace loom::ref::tmpl
