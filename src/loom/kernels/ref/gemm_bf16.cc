#include "loom/kernels/ref/gemm_bf16.h"

#include "loom/core/adam.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "loom/kernels/ref/ops_t.h"
#include "loom/kernels/ref/rounded.h"

namespace loom::ref {

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) {
        const float a = from_bf16(trans_a ? A[k * lda + m] : A[m * lda + k]);
        const float b = from_bf16(trans_b ? B[n * ldb + k] : B[k * ldb + n]);
        s += double(a) * double(b);
      }
      float& c = C[m * ldc + n];
      c = float(double(alpha) * s + (beta != 0.0f ? double(beta) * double(c) : 0.0));
    }
}

namespace {

std::vector<bf16> rounded(const float* x, int64_t n) {
  std::vector<bf16> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++) out[std::size_t(i)] = loom::to_bf16(x[i]);
  return out;
}

}  // namespace

void matmul_forward_bf16(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                         int64_t OC) {
  const std::vector<bf16> a = rounded(inp, N * IC), b = rounded(w, OC * IC);
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < OC; o++) out[i * OC + o] = bias ? bias[o] : 0.0f;
  gemm_bf16(false, true, N, OC, IC, 1.0f, a.data(), IC, b.data(), IC, bias ? 1.0f : 0.0f, out, OC);
}

void matmul_backward_bf16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int64_t N, int64_t IC, int64_t OC, bool fresh) {
  const std::vector<bf16> d = rounded(dout, N * OC);
  if (dinp) gemm_bf16(false, false, N, IC, OC, 1.0f, d.data(), OC, rounded(w, OC * IC).data(), IC, 0.0f, dinp, IC);
  if (dw) gemm_bf16(true, false, OC, IC, N, 1.0f, d.data(), OC, rounded(inp, N * IC).data(), IC, fresh ? 0.0f : 1.0f, dw, IC);
  if (dbias) detail::add_bias_grad(dbias, dout, N, OC, fresh);
}

namespace {

std::vector<float> widened(const bf16* x, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++) out[std::size_t(i)] = from_bf16(x[i]);
  return out;
}

}  // namespace

void matmul_forward_bf16_in(float* out, const bf16* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                            int64_t OC) {
  matmul_forward_bf16(out, widened(inp, N * IC).data(), w, bias, N, IC, OC);
}

void matmul_backward_bf16_in(float* dinp, float* dw, float* dbias, const float* dout, const bf16* inp, const float* w,
                             int64_t N, int64_t IC, int64_t OC, bool fresh) {
  matmul_backward_bf16(dinp, dw, dbias, dout, dw ? widened(inp, N * IC).data() : nullptr, w, N, IC, OC, fresh);
}

void adamw_update_bf16_moments(float* params, const float* grads, bf16* m, bf16* v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                               int64_t first) {
  // Note [bf16 optimizer moments]: ref adamw_update's fp64 step on the widened moments.
  const double bc1 = 1.0 - std::pow(double(beta1), double(step)), bc2 = 1.0 - std::pow(double(beta2), double(step));
  const uint32_t key = adam_moment_key(step);
  for (int64_t i = 0; i < n; i++) {
    const double g = float(grads[i] * grad_scale);
    const double mi = beta1 * double(from_bf16(m[i])) + (1.0 - double(beta1)) * g;
    const double vi = beta2 * double(from_bf16(v[i])) + (1.0 - double(beta2)) * g * g;
    const uint32_t r = random_bits(key, uint64_t(first + i));
    m[i] = to_bf16_stochastic(float(mi), r);
    v[i] = to_bf16_stochastic(float(vi), r >> 16);
    const double upd = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    params[i] = float(params[i] - lr * (upd + weight_decay * double(params[i])));
  }
}

void to_bf16(bf16* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = loom::to_bf16(in[i]);
}

void lm_head_loss_bf16(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets,
                       int64_t N, int64_t C, int64_t V, float dloss_scale) {
  detail::head_loss(matmul_forward_bf16, matmul_backward_bf16, losses, dx, dw, x, w, targets, N, C, V, dloss_scale);
}

}  // namespace loom::ref

namespace loom::ref {

// Note [bf16 attention probabilities]: the fp32 reference with each probability rounded
// where the forward makes it, so P V and the backward read the rounded values.
void attention_forward_bf16(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T, int64_t H,
                            int64_t KV, int64_t hd, const int32_t* doc_start) {
  std::vector<float> p(probs_h ? static_cast<std::size_t>(B * H * T * T) : 0);
  float* dst = probs_h ? p.data() : probs;
  tmpl::attention_forward<float>(out, dst, qkv, B, T, H, KV, hd, doc_start, [](float x) { return round_bf16(x); });
  if (probs_h) to_bf16(probs_h, dst, B * H * T * T);  // exact: the values are bf16 already
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* probs,
                             const bf16* probs_h, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const std::vector<float> p = probs_h ? widened(probs_h, B * H * T * T) : std::vector<float>();
  tmpl::attention_backward<float>(dqkv, dout, qkv, probs_h ? p.data() : probs, B, T, H, KV, hd);
}

void cp_attention_forward_bf16(float* out, float* probs, bf16* probs_h, const float* qkv, const float* kv,
                               const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                               int64_t hd, const int32_t* doc_start) {
  std::vector<float> p(probs_h ? static_cast<std::size_t>(B * H * Tq * Tk) : 0);
  float* dst = probs_h ? p.data() : probs;
  tmpl::cp_attention_forward<float>(out, dst, qkv, kv, q_pos, B, Tq, Tk, H, KV, hd, doc_start,
                                    [](float x) { return round_bf16(x); });
  if (probs_h) to_bf16(probs_h, dst, B * H * Tq * Tk);  // exact: the values are bf16 already
}

void cp_attention_backward_bf16(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                                const float* probs, const bf16* probs_h, const int32_t* q_pos, int64_t B, int64_t Tq,
                                int64_t Tk, int64_t H, int64_t KV, int64_t hd) {
  const std::vector<float> p = probs_h ? widened(probs_h, B * H * Tq * Tk) : std::vector<float>();
  tmpl::cp_attention_backward<float>(dqkv, dkv, dout, qkv, kv, probs_h ? p.data() : probs, q_pos, B, Tq, Tk, H, KV, hd);
}

void gelu_backward_bf16_in(float* dinp, const bf16* inp, const float* dout, int64_t n) {
  std::vector<float> g(static_cast<size_t>(n), 0.0f);  // overwrites dinp, which may be dout
  tmpl::gelu_backward<float>(g.data(), widened(inp, n).data(), dout, n);
  std::copy(g.begin(), g.end(), dinp);
}

void swiglu_backward_bf16_in(float* dinp, const bf16* inp, const float* dout, int64_t N, int64_t F) {
  tmpl::swiglu_backward<float>(dinp, widened(inp, N * 2 * F).data(), dout, N, F);
}

// Note [Norm backward from its output]: in fp64, dividing by the clamped weight.
namespace {

double clamped(float w, float eps) { return w >= 0 ? std::max(double(w), double(eps)) : std::min(double(w), -double(eps)); }

void norm_backward_from_out(bool rms, float* dinp, float* dw, float* db, const float* dout, const bf16* out,
                            const float* w, const float* b, const float* rstd, int64_t N, int64_t C, float eps) {
  std::vector<double> xhat(static_cast<std::size_t>(C));
  for (int64_t i = 0; i < N; i++) {
    const float* dy = dout + i * C;
    double m1 = 0, m2 = 0;
    for (int64_t c = 0; c < C; c++) {
      const double y = from_bf16(out[i * C + c]);
      xhat[size_t(c)] = (rms ? y : y - b[c]) / clamped(w[c], eps);
      m1 += double(dy[c]) * w[c];
      m2 += double(dy[c]) * w[c] * xhat[size_t(c)];
    }
    m1 = rms ? 0.0 : m1 / double(C);
    m2 /= double(C);
    for (int64_t c = 0; c < C; c++) {
      dw[c] += float(dy[c] * xhat[size_t(c)]);
      if (db) db[c] += dy[c];
      dinp[i * C + c] += float(rstd[i] * (double(dy[c]) * w[c] - m1 - xhat[size_t(c)] * m2));
    }
  }
}

}  // namespace

void layernorm_backward_from_out(float* dinp, float* dw, float* db, const float* dout, const bf16* out, const float* w,
                                 const float* b, const float* rstd, int64_t N, int64_t C, float eps) {
  norm_backward_from_out(false, dinp, dw, db, dout, out, w, b, rstd, N, C, eps);
}

void rmsnorm_backward_from_out(float* dinp, float* dw, const float* dout, const bf16* out, const float* w,
                               const float* rstd, int64_t N, int64_t C, float eps) {
  norm_backward_from_out(true, dinp, dw, nullptr, dout, out, w, nullptr, rstd, N, C, eps);
}

}  // namespace loom::ref
