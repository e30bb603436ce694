// LayerNorm / RMSNorm forward and backward. Rows are independent and split across threads;
// the weight-gradient column sums use per-chunk partials reduced in chunk order.
#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/cpu/parallel.h"

namespace loom::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* x = inp + i * C;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += x[c];
    const float mu = s / float(C);
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; c++) v += (x[c] - mu) * (x[c] - mu);
    const float rs = 1.0f / std::sqrt(v / float(C) + eps);
    float* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) y[c] = (x[c] - mu) * rs * w[c] + b[c];
    mean[i] = mu;
    rstd[i] = rs;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int parts = team_size();
  float* partial = scratch_floats(size_t(parts) * 2 * C);  // per chunk: [dw | db]
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int64_t r0, r1;
    chunk_range(N, parts, p, r0, r1);
    float* pdw = partial + size_t(p) * 2 * C;
    float* pdb = pdw + C;
    for (int64_t c = 0; c < C; c++) pdw[c] = pdb[c] = 0.0f;
    for (int64_t i = r0; i < r1; i++) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float mu = mean[i], rs = rstd[i];
      float m1 = 0, m2 = 0;
#pragma omp simd reduction(+ : m1, m2)
      for (int64_t c = 0; c < C; c++) {
        const float xhat = (x[c] - mu) * rs;
        const float dxhat = dy[c] * w[c];
        m1 += dxhat;
        m2 += dxhat * xhat;
      }
      m1 /= float(C);
      m2 /= float(C);
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) {
        const float xhat = (x[c] - mu) * rs;
        pdw[c] += dy[c] * xhat;
        pdb[c] += dy[c];
        dx[c] += rs * (dy[c] * w[c] - m1 - xhat * m2);
      }
    }
  }
  for (int p = 0; p < parts; p++) {
    const float* pdw = partial + size_t(p) * 2 * C;
    for (int64_t c = 0; c < C; c++) {
      dw[c] += pdw[c];
      db[c] += pdw[C + c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* x = inp + i * C;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; c++) ss += x[c] * x[c];
    const float rs = 1.0f / std::sqrt(ss / float(C) + eps);
    float* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) y[c] = x[c] * rs * w[c];
    rstd[i] = rs;
  }
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C) {
  const int parts = team_size();
  float* partial = scratch_floats(size_t(parts) * C);
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int64_t r0, r1;
    chunk_range(N, parts, p, r0, r1);
    float* pdw = partial + size_t(p) * C;
    for (int64_t c = 0; c < C; c++) pdw[c] = 0.0f;
    for (int64_t i = r0; i < r1; i++) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float r = rstd[i];
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; c++) dot += dy[c] * w[c] * x[c];
      const float k = r * r * r * dot / float(C);
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) {
        pdw[c] += dy[c] * x[c] * r;
        dx[c] += r * dy[c] * w[c] - x[c] * k;
      }
    }
  }
  for (int p = 0; p < parts; p++)
    for (int64_t c = 0; c < C; c++) dw[c] += partial[size_t(p) * C + c];
}

// Note [Norm backward from its output] (ops_bf16.inc): one pass over the rows per chunk,
// the normalised input recovered from the bf16 output with 1 / clamp(w) computed once.
namespace {

// 1 / w with |w| clamped to >= eps (w = 0 counts as +eps), into inv (C).
void clamped_inverse(float* inv, const float* w, int64_t C, float eps) {
  for (int64_t c = 0; c < C; c++) {
    const float a = w[c] >= 0 ? std::max(w[c], eps) : std::min(w[c], -eps);
    inv[c] = 1.0f / a;
  }
}

// rms = false: LayerNorm (b the bias, db its gradient); true: RMSNorm (b, db unused).
template <bool rms>
void norm_backward_from_out(float* dinp, float* dw, float* db, const float* dout, const bf16* out, const float* w,
                            const float* b, const float* rstd, int64_t N, int64_t C, float eps) {
  const int parts = team_size();
  float* partial = scratch_floats(size_t(parts) * 2 * C + size_t(C));  // per chunk [dw | db], then 1 / w
  float* inv = partial + size_t(parts) * 2 * C;
  clamped_inverse(inv, w, C, eps);
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int64_t r0, r1;
    chunk_range(N, parts, p, r0, r1);
    float* pdw = partial + size_t(p) * 2 * C;
    float* pdb = pdw + C;
    for (int64_t c = 0; c < C; c++) pdw[c] = pdb[c] = 0.0f;
    for (int64_t i = r0; i < r1; i++) {
      const bf16* y = out + i * C;
      const float* dy = dout + i * C;
      auto xhat = [&](int64_t c) { return rms ? from_bf16(y[c]) * inv[c] : (from_bf16(y[c]) - b[c]) * inv[c]; };
      float m1 = 0, m2 = 0;
#pragma omp simd reduction(+ : m1, m2)
      for (int64_t c = 0; c < C; c++) {
        const float dxhat = dy[c] * w[c];
        m1 += dxhat;
        m2 += dxhat * xhat(c);
      }
      m1 = rms ? 0.0f : m1 / float(C);
      m2 /= float(C);
      const float rs = rstd[i];
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) {
        const float xh = xhat(c);
        pdw[c] += dy[c] * xh;
        pdb[c] += dy[c];
        dx[c] += rs * (dy[c] * w[c] - m1 - xh * m2);
      }
    }
  }
  for (int p = 0; p < parts; p++) {
    const float* pdw = partial + size_t(p) * 2 * C;
    for (int64_t c = 0; c < C; c++) dw[c] += pdw[c];
    if (db)
      for (int64_t c = 0; c < C; c++) db[c] += pdw[C + c];
  }
}

}  // namespace

void layernorm_backward_from_out(float* dinp, float* dw, float* db, const float* dout, const bf16* out, const float* w,
                                 const float* b, const float* rstd, int64_t N, int64_t C, float eps) {
  norm_backward_from_out<false>(dinp, dw, db, dout, out, w, b, rstd, N, C, eps);
}

void rmsnorm_backward_from_out(float* dinp, float* dw, const float* dout, const bf16* out, const float* w,
                               const float* rstd, int64_t N, int64_t C, float eps) {
  norm_backward_from_out<true>(dinp, dw, nullptr, dout, out, w, nullptr, rstd, N, C, eps);
}

}  // namespace loom::cpu
