// Causal (grouped-query) attention and RoPE; the bf16 attention of Note [bf16 attention
// probabilities] (kernels/ops_bf16.inc) shares the per-head code.
//
// Per (batch, head) the work is small GEMMs (T x T x hd) done by OpenBLAS inside an OpenMP
// loop over heads; OpenBLAS runs single-threaded when called from a parallel region, so
// the parallelism is across heads.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::cpu {

namespace {

// Note [Causal blocks]
// Causal attention needs only the lower triangle of S = Q K^T, P V, dP = dO V^T and their
// transposes: with the T rows cut into kCausalBlocks blocks, query block [t0, t1) takes keys
// [0, t1) (and key block [j0, j1) the queries [j0, T)), so the GEMMs do (n + 1) / 2n of the
// full T x T work (5/8 at n = 4). Entries above the diagonal are never computed; the softmax
// and dS loops zero them as before. Only the fp32 summation order can change.
constexpr int64_t kCausalBlocks = 4;

// Rows per causal block: T / kCausalBlocks rounded up to a multiple of 16 (at least 16).
int64_t causal_block(int64_t T) {
  return std::max<int64_t>(16, ((T + kCausalBlocks - 1) / kCausalBlocks + 15) / 16 * 16);
}

// One (batch, head) of causal attention: S = scale Q K^T into p (T,T), softmax over each
// row's document window, then O = P V. round (Note [bf16 attention probabilities]): round
// each probability to bf16 before P V reads it, and keep the bf16 values in `keep` when set.
void attend_head(float* o, float* p, bool round, bf16* keep, const float* q, const float* k, const float* v,
                 int64_t T, int64_t hd, int64_t row, int64_t C, const int32_t* doc_start) {
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t R = causal_block(T);
  for (int64_t t0 = 0; t0 < T; t0 += R) {  // S[t0:t1, 0:t1] = scale Q[t0:t1] K[0:t1]^T (Note [Causal blocks])
    const int64_t t1 = std::min(T, t0 + R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0, t1, hd, scale, q + t0 * row, row, k, row, 0.0f,
                p + t0 * T, T);
  }
  for (int64_t t = 0; t < T; t++) {
    float* pr = p + t * T;
    softmax_window(pr, doc_start ? doc_start[t] : 0, t, T);  // from the first key of row t's document
    if (round)
      for (int64_t j = 0; j < T; j++) {
        const bf16 h = loom::to_bf16(pr[j]);
        pr[j] = loom::from_bf16(h);
        if (keep) keep[t * T + j] = h;
      }
  }
  for (int64_t t0 = 0; t0 < T; t0 += R) {  // O[t0:t1] = P[t0:t1, 0:t1] V[0:t1]
    const int64_t t1 = std::min(T, t0 + R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1 - t0, hd, t1, 1.0f, p + t0 * T, T, v, row, 0.0f,
                o + t0 * C, C);
  }
}

// B*H (batch, head) tasks over OpenMP; probs (B,H,T,T) fp32, or per-thread scratch when the
// probabilities are kept in bf16 (keep).
void attend(float* out, float* probs, bool round, bf16* keep, const float* qkv, int64_t B, int64_t T, int64_t H,
            int64_t KV, int64_t hd, const int32_t* doc_start) {
  const int64_t row = (H + 2 * KV) * hd, group = H / KV, C = H * hd;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H, kh = h / group;
    const float* base = qkv + b * T * row;
    float* p = keep ? scratch_floats(size_t(T) * T) : probs + bh * T * T;
    attend_head(out + b * T * C + h * hd, p, round, keep ? keep + bh * T * T : nullptr, base + h * hd,
                base + (H + kh) * hd, base + (H + KV + kh) * hd, T, hd, row, C, doc_start ? doc_start + b * T : nullptr);
  }
}

// Backward over (batch, kv head) tasks (the query heads of one group all add into the same
// dK, dV); each head's P is probs (fp32) or kept (bf16, widened into scratch).
void attend_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, const bf16* kept,
                     int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t row = (H + 2 * KV) * hd, group = H / KV, C = H * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t R = causal_block(T);
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < B * KV; bk++) {
    const int64_t b = bk / KV, kh = bk % KV;
    float* ds = scratch_floats(size_t(T) * T);
    const float* k = qkv + b * T * row + (H + kh) * hd;
    const float* v = qkv + b * T * row + (H + KV + kh) * hd;
    float* dk = dqkv + b * T * row + (H + kh) * hd;
    float* dv = dqkv + b * T * row + (H + KV + kh) * hd;
    for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
      const float* p = probs ? probs + (b * H + h) * T * T : nullptr;
      if (kept) {
        float* w = scratch_floats(size_t(T) * T, 1);
        const bf16* kr = kept + (b * H + h) * T * T;
#pragma omp simd
        for (int64_t i = 0; i < T * T; i++) w[i] = loom::from_bf16(kr[i]);
        p = w;
      }
      const float* dy = dout + b * T * C + h * hd;
      const float* q = qkv + b * T * row + h * hd;
      float* dq = dqkv + b * T * row + h * hd;
      // dP(T,T) = dO(T,hd) V^T ; dV += P^T dO, by causal blocks (Note [Causal blocks]): query
      // block [t0, t1) against keys [0, t1), key block [j0, j1) against queries [j0, T).
      for (int64_t t0 = 0; t0 < T; t0 += R) {
        const int64_t t1 = std::min(T, t0 + R);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0, t1, hd, 1.0f, dy + t0 * C, C, v, row, 0.0f,
                    ds + t0 * T, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0, hd, T - t0, 1.0f, p + t0 * T + t0, T, dy + t0 * C,
                    C, 1.0f, dv + t0 * row, row);
      }
      // dS = P * (dP - rowsum(P * dP)) * scale, zero above the diagonal
      for (int64_t t = 0; t < T; t++) {
        const float* pr = p + t * T;
        float* d = ds + t * T;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j <= t; j++) s += pr[j] * d[j];
#pragma omp simd
        for (int64_t j = 0; j <= t; j++) d[j] = pr[j] * (d[j] - s) * scale;
        for (int64_t j = t + 1; j < T; j++) d[j] = 0.0f;
      }
      // dQ += dS K ; dK += dS^T Q, by the same blocks
      for (int64_t t0 = 0; t0 < T; t0 += R) {
        const int64_t t1 = std::min(T, t0 + R);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1 - t0, hd, t1, 1.0f, ds + t0 * T, T, k, row, 1.0f,
                    dq + t0 * row, row);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0, hd, T - t0, 1.0f, ds + t0 * T + t0, T,
                    q + t0 * row, row, 1.0f, dk + t0 * row, row);
      }
    }
  }
}

}  // namespace

void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd, const int32_t* doc_start) {
  attend(out, probs, false, nullptr, qkv, B, T, H, KV, hd, doc_start);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  attend_backward(dqkv, dout, qkv, probs, nullptr, B, T, H, KV, hd);
}

void attention_forward_bf16(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T, int64_t H,
                            int64_t KV, int64_t hd, const int32_t* doc_start) {
  attend(out, probs_h ? nullptr : probs, true, probs_h, qkv, B, T, H, KV, hd, doc_start);
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* probs,
                             const bf16* probs_h, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  attend_backward(dqkv, dout, qkv, probs_h ? nullptr : probs, probs_h, B, T, H, KV, hd);
}

namespace {

// cos/sin table (T, hd/2), computed in double then rounded: angle = t * theta^(-2i/hd).
struct RopeTable {
  int64_t T = 0, hd = 0;
  float theta = 0;
  std::vector<float> cos, sin;
};

const RopeTable& rope_table(int64_t T, int64_t hd, float theta) {
  thread_local RopeTable tab;
  if (tab.T != T || tab.hd != hd || tab.theta != theta) {
    const int64_t half = hd / 2;
    tab.T = T, tab.hd = hd, tab.theta = theta;
    tab.cos.resize(T * half);
    tab.sin.resize(T * half);
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < half; i++) {
        const double a = double(t) * std::pow(double(theta), -2.0 * double(i) / double(hd));
        tab.cos[t * half + i] = float(std::cos(a));
        tab.sin[t * half + i] = float(std::sin(a));
      }
  }
  return tab;
}

void rope_apply(float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta,
                float sign, const int32_t* pos) {
  const RopeTable& tab = rope_table(pos ? int64_t(*std::max_element(pos, pos + T)) + 1 : T, hd, theta);
  const int64_t row = (H + 2 * KV) * hd, half = hd / 2;
  const float* cs = tab.cos.data();
  const float* sn = tab.sin.data();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t t = pos ? pos[bt % T] : bt % T;
    const float* c = cs + t * half;
    const float* s = sn + t * half;
    for (int64_t h = 0; h < H + KV; h++) {
      float* x = qkv + bt * row + h * hd;
#pragma omp simd
      for (int64_t i = 0; i < half; i++) {
        const float x1 = x[i], x2 = x[i + half], si = sign * s[i];
        x[i] = x1 * c[i] - x2 * si;
        x[i + half] = x2 * c[i] + x1 * si;
      }
    }
  }
}

}  // namespace

void rope_forward(float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta, const int32_t* pos) {
  rope_apply(qkv, B, T, H, KV, hd, theta, 1.0f, pos);
}

void rope_backward(float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta, const int32_t* pos) {
  rope_apply(dqkv, B, T, H, KV, hd, theta, -1.0f, pos);
}

}  // namespace loom::cpu
