// Embedding, activations, residual add, AdamW and the reductions used by grad clipping.
#include <algorithm>
#include <cmath>

#include "loom/core/adam.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const float* e = wte + int64_t(tokens[bt]) * C;
    float* y = out + bt * C;
    if (wpe) {
      const float* pe = wpe + (bt % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) y[c] = e[c] + pe[c];
    } else {
      std::copy(e, e + C, y);
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
  // Rows of dwte collide when tokens repeat, so threads own column ranges instead of rows.
  const int parts = team_size();
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int64_t c0, c1;
    chunk_range(C, parts, p, c0, c1);
    for (int64_t bt = 0; bt < B * T; bt++) {
      const float* g = dout + bt * C;
      float* dw = dwte + int64_t(tokens[bt]) * C;
      float* dp = dwpe ? dwpe + (bt % T) * C : nullptr;
#pragma omp simd
      for (int64_t c = c0; c < c1; c++) dw[c] += g[c];
      if (dp) {
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) dp[c] += g[c];
      }
    }
  }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

// 0.5 x (1 + tanh(u)) = x sigmoid(2u): no cancellation where tanh(u) is near -1.
// d/dx = s + 2 x s (1 - s) du/dx, with s = sigmoid(2u) and 1 - tanh^2 = 4 s (1 - s).
void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    out[i] = x * sigmoid_approx(2.0f * kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  }
}

namespace {

// The activations' backward on an fp32 or a bf16-stored input (Note [bf16 activation
// storage]): the same arithmetic on the same (widened) values, so the results are identical.
inline float load(float x) { return x; }
inline float load(bf16 x) { return from_bf16(x); }

// kOverwrite: dinp = g (dinp may be dout), else dinp += g; a compile-time choice, as a
// runtime one kept the loop from vectorising (9x slower).
template <bool kOverwrite = false, typename In>
void gelu_backward_t(float* dinp, const In* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float x = load(inp[i]);
    // s = 1 / (1 + e), 1 - s = e s with e = exp(-2u): no cancellation where s -> 1.
    const float e = exp_approx(-2.0f * kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    const float s = 1.0f / (1.0f + e);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    const float g = dout[i] * (s + 2.0f * x * s * (e * s) * du);
    if constexpr (kOverwrite) dinp[i] = g;
    else dinp[i] += g;
  }
}

template <typename In>
void swiglu_backward_t(float* dinp, const In* inp, const float* dout, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const In* g = inp + i * 2 * F;
    const In* u = g + F;
    const float* dy = dout + i * F;
    float* dg = dinp + i * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t f = 0; f < F; f++) {
      const float gf = load(g[f]), uf = load(u[f]);
      const float e = exp_approx(-gf);  // sig = 1/(1+e), 1 - sig = e sig
      const float sig = 1.0f / (1.0f + e);
      dg[f] += dy[f] * uf * (sig + gf * sig * (e * sig));
      du[f] += dy[f] * gf * sig;
    }
  }
}

}  // namespace

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  gelu_backward_t(dinp, inp, dout, n);
}

void gelu_backward_bf16_in(float* dinp, const bf16* inp, const float* dout, int64_t n) {
  gelu_backward_t<true>(dinp, inp, dout, n);
}

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* g = inp + i * 2 * F;
    const float* u = g + F;
    float* y = out + i * F;
#pragma omp simd
    for (int64_t f = 0; f < F; f++) y[f] = g[f] * sigmoid_approx(g[f]) * u[f];
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t F) {
  swiglu_backward_t(dinp, inp, dout, N, F);
}

void swiglu_backward_bf16_in(float* dinp, const bf16* inp, const float* dout, int64_t N, int64_t F) {
  swiglu_backward_t(dinp, inp, dout, N, F);
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

double sum_squares(const float* x, int64_t n) {
  const int parts = team_size();
  double partial[256] = {0};
  const int used = std::min(parts, 256);
#pragma omp parallel for schedule(static, 1)
  for (int p = 0; p < used; p++) {
    int64_t i0, i1;
    chunk_range(n, used, p, i0, i1);
    double s = 0;
    for (int64_t i = i0; i < i1; i += 4096) {  // float blocks, double across blocks
      float blk = 0;
      const int64_t e = std::min(i1, i + 4096);
#pragma omp simd reduction(+ : blk)
      for (int64_t j = i; j < e; j++) blk += x[j] * x[j];
      s += blk;
    }
    partial[p] = s;
  }
  double s = 0;
  for (int p = 0; p < used; p++) s += partial[p];
  return s;
}

void scale_inplace(float* x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

}  // namespace loom::cpu
