// LayerNorm / RMSNorm forward and backward. Rows are independent and split across threads;
// the weight-gradient column sums use per-chunk partials reduced in chunk order.
#include <cmath>

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

}  // namespace loom::cpu
