// Linear layers and the fused LM head + cross-entropy, on OpenBLAS sgemm (fp32, and fp16:
// sgemm on fp16-rounded copies) or oneDNN (bf16, Note [bf16 rounding points]).
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "loom/core/fp16.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/gemm_fp16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::cpu {

namespace {

// dbias(OC) += sum over the N rows of dout(N,OC) (fresh: dbias = that sum), in fixed
// per-thread chunks (deterministic). With `rounded`, also rounded = to_bf16(dout) in the
// same pass (one read of dout; the same sums in the same order).
void add_bias_grad(float* dbias, const float* dout, int64_t N, int64_t OC, bool fresh, bf16* rounded = nullptr) {
  const int parts = team_size();
  float* partial = scratch_floats(size_t(parts) * OC);
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int64_t r0, r1;
    chunk_range(N, parts, p, r0, r1);
    float* acc = partial + size_t(p) * OC;
    std::fill(acc, acc + OC, 0.0f);
    for (int64_t i = r0; i < r1; i++) {
      const float* d = dout + i * OC;
      if (bf16* h = rounded ? rounded + i * OC : nullptr) {
#pragma omp simd
        for (int64_t o = 0; o < OC; o++) acc[o] += d[o], h[o] = loom::to_bf16(d[o]);
      } else {
#pragma omp simd
        for (int64_t o = 0; o < OC; o++) acc[o] += d[o];
      }
    }
  }
  if (fresh) std::fill(dbias, dbias + OC, 0.0f);  // 0 + x = x: the bits of a zeroed dbias
  for (int p = 0; p < parts; p++)
    for (int64_t o = 0; o < OC; o++) dbias[o] += partial[size_t(p) * OC + o];
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N,
                    int64_t IC, int64_t OC) {
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) std::copy(bias, bias + OC, out + i * OC);
    beta = 1.0f;
  }
  // out(N,OC) = inp(N,IC) @ w(OC,IC)^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t N, int64_t IC, int64_t OC, bool fresh) {
  // dinp(N,IC) = dout(N,OC) @ w(OC,IC)
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dinp, IC);
  // dw(OC,IC) (+)= dout^T(OC,N) @ inp(N,IC)
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, fresh ? 0.0f : 1.0f, dw,
                IC);
  if (dbias) add_bias_grad(dbias, dout, N, OC, fresh);
}

void matmul_forward_bf16_in(float* out, const bf16* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                            int64_t OC) {
  bf16* b = scratch_bf16(size_t(OC * IC), 1);
  to_bf16(b, w, OC * IC);
  if (bias) gemm_bf16_bias_nt(N, OC, IC, inp, b, bias, out);
  else gemm_bf16(false, true, N, OC, IC, 1.0f, inp, IC, b, IC, 0.0f, out, OC);
}

void matmul_forward_bf16(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                         int64_t OC) {
  bf16* a = scratch_bf16(size_t(N * IC), 0);
  to_bf16(a, inp, N * IC);
  matmul_forward_bf16_in(out, a, w, bias, N, IC, OC);
}

void matmul_backward_bf16_in(float* dinp, float* dw, float* dbias, const float* dout, const bf16* inp, const float* w,
                             int64_t N, int64_t IC, int64_t OC, bool fresh) {
  bf16* d = scratch_bf16(size_t(N * OC), 0);
  bf16* b = scratch_bf16(size_t(OC * IC), 2);
  if (dbias) add_bias_grad(dbias, dout, N, OC, fresh, d);
  else to_bf16(d, dout, N * OC);
  if (dinp) {
    to_bf16(b, w, OC * IC);
    gemm_bf16(false, false, N, IC, OC, 1.0f, d, OC, b, IC, 0.0f, dinp, IC);  // dinp = dout w
  }
  if (dw) gemm_bf16(true, false, OC, IC, N, 1.0f, d, OC, inp, IC, fresh ? 0.0f : 1.0f, dw, IC);  // dw (+)= dout^T inp
}

void matmul_backward_bf16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int64_t N, int64_t IC, int64_t OC, bool fresh) {
  bf16* a = scratch_bf16(size_t(N * IC), 1);
  if (dw) to_bf16(a, inp, N * IC);
  matmul_backward_bf16_in(dinp, dw, dbias, dout, a, w, N, IC, OC, fresh);
}

namespace {

// out[i] = round_fp16(in[i]) (out may be in).
void round_fp16(float* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = loom::round_fp16(in[i]);
}

}  // namespace

void matmul_forward_fp16(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                         int64_t OC) {
  float* a = scratch_floats(size_t(N * IC), 2);
  float* b = scratch_floats(size_t(OC * IC), 3);
  round_fp16(a, inp, N * IC);
  round_fp16(b, w, OC * IC);
  matmul_forward(out, a, b, bias, N, IC, OC);
}

void matmul_backward_fp16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int64_t N, int64_t IC, int64_t OC, bool fresh) {
  float* d = scratch_floats(size_t(N * OC), 1);
  float* a = scratch_floats(size_t(N * IC), 2);
  float* b = scratch_floats(size_t(OC * IC), 3);
  round_fp16(d, dout, N * OC);
  if (dw) round_fp16(a, inp, N * IC);
  if (dinp) round_fp16(b, w, OC * IC);
  matmul_backward(dinp, dw, nullptr, d, a, b, N, IC, OC, fresh);
  if (dbias) add_bias_grad(dbias, dout, N, OC, fresh);  // from the unrounded upstream gradient
}

namespace {

// One row: returns loss; if grad, overwrites l with (softmax - onehot) * scale, or, with
// out_h, writes that gradient rounded to bf16 there (what the bf16 head's GEMMs read; the
// same bits as rounding l afterwards) and leaves l as scratch.
inline float softmax_xent_row(float* l, int32_t target, int64_t V, bool grad, float scale, bf16* out_h = nullptr) {
  if (target < 0) {  // ignored (padding): no loss, no gradient
    if (grad && out_h) std::fill(out_h, out_h + V, bf16(0));
    else if (grad) std::fill(l, l + V, 0.0f);
    return 0.0f;
  }
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < V; j++) mx = std::max(mx, l[j]);
  const float target_logit = l[target];
  // loss = log z + mx - target with z = sum exp(l - mx) = ties + z_rest, where the `ties`
  // entries equal to mx contribute exactly 1 each. log1p(ties - 1 + z_rest) keeps full
  // relative precision when the model is confident (z -> 1, loss -> 0), where log of a
  // float z rounded near 1 would lose it.
  float z_rest = 0, ties = 0;
  if (grad) {
    // z_other (everything but the target) gives the target's gradient -scale * z_other / z
    // without the cancellation of (e_target / z - 1) when p -> 1.
    float z_other = 0;
#pragma omp simd reduction(+ : z_other, z_rest, ties)
    for (int64_t j = 0; j < V; j++) {
      const bool top = l[j] == mx;
      const float e = exp_approx(l[j] - mx);
      l[j] = e;
      z_other += j == target ? 0.0f : e;
      z_rest += top ? 0.0f : e;
      ties += top ? 1.0f : 0.0f;
    }
    const float z = z_other + l[target];
    const float k = scale / z;
    if (out_h) {
#pragma omp simd
      for (int64_t j = 0; j < V; j++) out_h[j] = loom::to_bf16(l[j] * k);
      out_h[target] = loom::to_bf16(-scale * (z_other / z));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < V; j++) l[j] *= k;
      l[target] = -scale * (z_other / z);
    }
    return std::log1p((ties - 1.0f) + z_rest) + (mx - target_logit);
  }
#pragma omp simd reduction(+ : z_rest, ties)
  for (int64_t j = 0; j < V; j++) {
    const bool top = l[j] == mx;
    const float e = exp_approx(l[j] - mx);
    z_rest += top ? 0.0f : e;
    ties += top ? 1.0f : 0.0f;
  }
  return std::log1p((ties - 1.0f) + z_rest) + (mx - target_logit);
}

// Rows per chunk so the (rows, V) logits stay within ~32 Mi floats (128 MiB), with the
// rows spread evenly over the chunks: a short last chunk would run the dW GEMM
// (V x C += dlogits^T x) with a tiny inner dimension, re-reading all of dW for little work.
int64_t head_chunk_rows(int64_t N, int64_t V) {
  constexpr int64_t kBudgetFloats = int64_t(128) << 20;
  const int64_t cap = std::clamp<int64_t>(kBudgetFloats / V, 1, N);
  const int64_t chunks = (N + cap - 1) / cap;
  return (N + chunks - 1) / chunks;
}

}  // namespace

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++)
    losses[i] = softmax_xent_row(const_cast<float*>(logits + i * V), targets[i], V, false, 0.0f);
}

void crossentropy_backward_inplace(float* logits, const int32_t* targets, const float* dloss,
                                   int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) softmax_xent_row(logits + i * V, targets[i], V, true, dloss[i]);
}

namespace {

enum class HeadGemm { kFp32, kBf16, kFp16 };

// lm_head_loss in row chunks; bf16 / fp16: the GEMM inputs (x, w, dlogits) rounded.
void head_loss(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets, int64_t N,
               int64_t C, int64_t V, float dloss_scale, HeadGemm g) {
  const int64_t R = head_chunk_rows(N, V);
  float* logits = scratch_floats(size_t(R) * V, 1);
  const bool grad = dx != nullptr;
  const bool bf = g == HeadGemm::kBf16, half = g == HeadGemm::kFp16;
  bf16 *wh = nullptr, *xh = nullptr, *dh = nullptr;
  if (bf) {
    wh = scratch_bf16(size_t(V * C), 0);
    xh = scratch_bf16(size_t(R * C), 1);
    dh = scratch_bf16(size_t(R * V), 2);
    to_bf16(wh, w, V * C);
  }
  float* xr = nullptr;  // fp16: the rounded chunk of x
  if (half) {
    float* wr = scratch_floats(size_t(V * C), 2);
    round_fp16(wr, w, V * C);
    w = wr;
    xr = scratch_floats(size_t(R * C), 3);
  }
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const float* xc = x + r0 * C;
    if (half) {
      round_fp16(xr, xc, rows * C);
      xc = xr;
    }
    // logits(rows,V) = x(rows,C) @ w(V,C)^T
    if (bf) {
      to_bf16(xh, xc, rows * C);
      gemm_bf16(false, true, rows, V, C, 1.0f, xh, C, wh, C, 0.0f, logits, V);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, V, C, 1.0f, xc, C, w, C, 0.0f, logits, V);
    }
    // bf16: the gradient is stored rounded straight from the softmax (dh), skipping an fp32 pass.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; i++)
      losses[r0 + i] = softmax_xent_row(logits + i * V, targets[r0 + i], V, grad, dloss_scale,
                                        bf && grad ? dh + i * V : nullptr);
    if (!grad) continue;
    // dx(rows,C) = dlogits(rows,V) @ w(V,C); dw(V,C) += dlogits^T @ x(rows,C)
    if (bf) {
      gemm_bf16(false, false, rows, C, V, 1.0f, dh, V, wh, C, 0.0f, dx + r0 * C, C);
      gemm_bf16(true, false, V, C, rows, 1.0f, dh, V, xh, C, 1.0f, dw, C);
    } else {
      if (half) round_fp16(logits, logits, rows * V);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, V, 1.0f, logits, V, w, C, 0.0f, dx + r0 * C, C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, rows, 1.0f, logits, V, xc, C, 1.0f, dw, C);
    }
  }
}

}  // namespace

void lm_head_loss(float* losses, float* dx, float* dw, const float* x, const float* w,
                  const int32_t* targets, int64_t N, int64_t C, int64_t V, float dloss_scale) {
  head_loss(losses, dx, dw, x, w, targets, N, C, V, dloss_scale, HeadGemm::kFp32);
}

void lm_head_loss_bf16(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets,
                       int64_t N, int64_t C, int64_t V, float dloss_scale) {
  head_loss(losses, dx, dw, x, w, targets, N, C, V, dloss_scale, HeadGemm::kBf16);
}

void lm_head_loss_fp16(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets,
                       int64_t N, int64_t C, int64_t V, float dloss_scale) {
  head_loss(losses, dx, dw, x, w, targets, N, C, V, dloss_scale, HeadGemm::kFp16);
}

void softmax_exp_rows(float* z, const float* mx, float* sums, int64_t rows, int64_t V, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; i++) {
    float* r = z + i * V;
    const float m = mx[i];
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < valid; v++) {
      const float e = exp_approx(r[v] - m);
      r[v] = e;
      sum += e;
    }
    std::fill(r + valid, r + V, 0.0f);
    sums[i] = sum;
  }
}

void lm_head_logits_row(float* logits, const float* x, const float* w, int64_t C, int64_t V) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, w, C, x, 1, 0.0f, logits, 1);
}

}  // namespace loom::cpu
