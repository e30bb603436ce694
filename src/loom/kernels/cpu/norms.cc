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

// LayerNorm's backward from the normalised input, and RMSNorm's from its output (Note [Norm
// backward from its output] in ops_bf16.inc): rows split in chunks, the weight-gradient
// column sums per chunk reduced in chunk order.
namespace {

// xhat_of(i) gives row i's normalised input as a callable c -> xhat_c. rms: RMSNorm (no mean
// term, no bias gradient; db null).
template <bool rms, typename RowXhat>
void norm_backward_rows(float* dinp, float* dw, float* db, const float* dout, const float* w, const float* rstd,
                        int64_t N, int64_t C, float* partial, RowXhat xhat_of) {
  const int parts = team_size();
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int64_t r0, r1;
    chunk_range(N, parts, p, r0, r1);
    float* pdw = partial + size_t(p) * 2 * C;
    float* pdb = pdw + C;
    for (int64_t c = 0; c < C; c++) pdw[c] = pdb[c] = 0.0f;
    for (int64_t i = r0; i < r1; i++) {
      const auto xhat = xhat_of(i);
      const float* dy = dout + i * C;
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

// Scratch for the per-chunk [dw | db] partials, and 1 / w (C) with |w| clamped to >= eps
// (w = 0 counts as +eps), both in one thread-local block.
struct FromOut {
  float *partial, *inv;
};
FromOut partials_and_inverse(const float* w, int64_t C, float eps) {
  const size_t parts = size_t(team_size());
  float* partial = scratch_floats(parts * 2 * size_t(C) + size_t(C));
  float* inv = partial + parts * 2 * size_t(C);
  for (int64_t c = 0; c < C; c++) inv[c] = 1.0f / (w[c] >= 0 ? std::max(w[c], eps) : std::min(w[c], -eps));
  return {partial, inv};
}

}  // namespace

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  float* partial = scratch_floats(size_t(team_size()) * 2 * size_t(C));
  norm_backward_rows<false>(dinp, dw, db, dout, w, rstd, N, C, partial, [=](int64_t i) {
    return [x = inp + i * C, mu = mean[i], rs = rstd[i]](int64_t c) { return (x[c] - mu) * rs; };
  });
}

void layernorm_backward_from_out(float* dinp, float* dw, float* db, const float* dout, const bf16* out, const float* w,
                                 const float* b, const float* rstd, int64_t N, int64_t C, float eps) {
  const auto [partial, inv] = partials_and_inverse(w, C, eps);
  norm_backward_rows<false>(dinp, dw, db, dout, w, rstd, N, C, partial, [=](int64_t i) {
    return [y = out + i * C, b, inv](int64_t c) { return (from_bf16(y[c]) - b[c]) * inv[c]; };
  });
}

void rmsnorm_backward_from_out(float* dinp, float* dw, const float* dout, const bf16* out, const float* w,
                               const float* rstd, int64_t N, int64_t C, float eps) {
  const auto [partial, inv] = partials_and_inverse(w, C, eps);
  norm_backward_rows<true>(dinp, dw, nullptr, dout, w, rstd, N, C, partial, [=](int64_t i) {
    return [y = out + i * C, inv](int64_t c) { return from_bf16(y[c]) * inv[c]; };
  });
}

}  // namespace loom::cpu
