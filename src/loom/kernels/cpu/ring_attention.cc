// Ring attention's steps (Note [Ring attention], kernels/ops.inc): a rank's query rows
// against one block of keys and values with the online softmax, and the block's backward,
// which recomputes the block's probabilities from the scores and the row's log-sum-exp.
// Queries and keys come in runs of consecutive positions (position_runs.h); per (batch, head)
// the GEMMs run over each (query run, key run) pair that has a visible key (the key run
// starts at or before the query run's last position): a zig-zag rank's late chunk meets a
// block's early one whole, its early chunk never meets the late one, so about half the
// block's products are skipped. Masked entries inside a pair are dropped before the
// rescaled softmax weights are multiplied into V. Parallel over heads as in attention.cc
// (OpenBLAS single-threaded inside the OpenMP loop).
#include <cblas.h>

#include <cmath>

#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/position_runs.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::cpu {

namespace {

// A query run [t0, t1) and a key run [u0, u1) of which some key is visible to some query.
struct Pair {
  int64_t t0, t1, u0, u1;
};

std::vector<Pair> visible_pairs(const int32_t* q_pos, int64_t Tq, const int32_t* k_pos, int64_t Tb) {
  std::vector<Pair> out;
  for (auto [t0, t1] : position_runs(q_pos, Tq))
    for (auto [u0, u1] : position_runs(k_pos, Tb))
      if (k_pos[u0] <= q_pos[t1 - 1]) out.push_back({t0, t1, u0, u1});
  return out;
}

}  // namespace

void ring_attention_step(float* acc, float* ml, const float* qkv, const float* kv, const int32_t* q_pos,
                         const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tb, int64_t H, int64_t KV, int64_t hd,
                         const int32_t* doc_start) {
  const int64_t row = (H + 2 * KV) * hd, kvrow = 2 * KV * hd, group = H / KV, C = H * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::vector<Pair> pairs = visible_pairs(q_pos, Tq, k_pos, Tb);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H, kh = h / group;
    float* s = scratch_floats(size_t(Tq) * size_t(Tb));
    const float* k = kv + b * Tb * kvrow + kh * hd;
    const float* v = kv + b * Tb * kvrow + (KV + kh) * hd;
    const float* q = qkv + b * Tq * row + h * hd;
    float* a = acc + b * Tq * C + h * hd;
    for (const Pair& x : pairs)  // S = scale Q K^T where a key is visible; the rest is never read
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, x.t1 - x.t0, x.u1 - x.u0, hd, scale, q + x.t0 * row, row,
                  k + x.u0 * kvrow, kvrow, 0.0f, s + x.t0 * Tb + x.u0, Tb);
    for (int64_t t = 0; t < Tq; t++) {
      const int64_t lo = doc_start ? doc_start[b * Tq + t] : 0, hi = q_pos[t];
      float* sr = s + t * Tb;
      float mx = -INFINITY;
      for (int64_t u = 0; u < Tb; u++)
        if (k_pos[u] >= lo && k_pos[u] <= hi) mx = std::max(mx, sr[u]);
      if (mx == -INFINITY) {  // nothing visible: the row adds nothing
        for (int64_t u = 0; u < Tb; u++) sr[u] = 0.0f;
        continue;
      }
      float* st = ml + (bh * Tq + t) * 2;
      const float m = std::max(st[0], mx), c = std::exp(st[0] - m);
      float l = st[1] * c;
      for (int64_t e = 0; e < hd; e++) a[t * C + e] *= c;
      for (int64_t u = 0; u < Tb; u++) {  // exp_approx vectorises (vecmath.h), as the softmax's does
        sr[u] = k_pos[u] < lo || k_pos[u] > hi ? 0.0f : exp_approx(sr[u] - m);
        l += sr[u];
      }
      st[0] = m, st[1] = l;
    }
    for (const Pair& x : pairs)  // acc += P V
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, x.t1 - x.t0, hd, x.u1 - x.u0, 1.0f, s + x.t0 * Tb + x.u0, Tb,
                  v + x.u0 * kvrow, kvrow, 1.0f, a + x.t0 * C, C);
  }
}

void ring_attention_finish(float* out, float* lse, const float* acc, const float* ml, int64_t B, int64_t Tq, int64_t H,
                           int64_t hd) {
  const int64_t C = H * hd;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t t = 0; t < Tq; t++) {
      const float m = ml[(bh * Tq + t) * 2], l = ml[(bh * Tq + t) * 2 + 1], inv = 1.0f / l;
      lse[bh * Tq + t] = m + std::log(l);
      const int64_t at = (b * Tq + t) * C + h * hd;
      for (int64_t e = 0; e < hd; e++) out[at + e] = acc[at + e] * inv;
    }
  }
}

// Over (batch, kv head) tasks: the query heads of one group add into the same dK, dV rows.
void ring_attention_backward_step(float* dqkv, float* dkv, const float* dout, const float* D, const float* qkv,
                                  const float* kv, const float* lse, const int32_t* q_pos, const int32_t* k_pos,
                                  int64_t B, int64_t Tq, int64_t Tb, int64_t H, int64_t KV, int64_t hd,
                                  const int32_t* doc_start) {
  const int64_t row = (H + 2 * KV) * hd, kvrow = 2 * KV * hd, group = H / KV, C = H * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::vector<Pair> pairs = visible_pairs(q_pos, Tq, k_pos, Tb);
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < B * KV; bk++) {
    const int64_t b = bk / KV, kh = bk % KV;
    float* pb = scratch_floats(size_t(Tq) * size_t(Tb), 0);
    float* ds = scratch_floats(size_t(Tq) * size_t(Tb), 1);
    const float* k = kv + b * Tb * kvrow + kh * hd;
    const float* v = kv + b * Tb * kvrow + (KV + kh) * hd;
    float* dk = dkv + b * Tb * kvrow + kh * hd;
    float* dv = dkv + b * Tb * kvrow + (KV + kh) * hd;
    for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
      const float* dy = dout + b * Tq * C + h * hd;
      const float* q = qkv + b * Tq * row + h * hd;
      const float* Dh = D + (b * H + h) * Tq;
      const float* Lh = lse + (b * H + h) * Tq;
      float* dq = dqkv + b * Tq * row + h * hd;
      for (const Pair& x : pairs) {
        const int64_t n = x.t1 - x.t0, m = x.u1 - x.u0;
        float* P = pb + x.t0 * Tb + x.u0;
        float* dS = ds + x.t0 * Tb + x.u0;
        // The pair's P recomputed: e^(scale q.k - lse) where visible, else 0.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, hd, scale, q + x.t0 * row, row, k + x.u0 * kvrow,
                    kvrow, 0.0f, P, Tb);
        for (int64_t t = x.t0; t < x.t1; t++) {
          const int64_t lo = doc_start ? doc_start[b * Tq + t] : 0;
          for (int64_t u = x.u0; u < x.u1; u++)
            pb[t * Tb + u] = k_pos[u] >= lo && k_pos[u] <= q_pos[t] ? exp_approx(pb[t * Tb + u] - Lh[t]) : 0.0f;
        }
        // dP = dO V^T ; dV += P^T dO
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, hd, 1.0f, dy + x.t0 * C, C, v + x.u0 * kvrow, kvrow,
                    0.0f, dS, Tb);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, hd, n, 1.0f, P, Tb, dy + x.t0 * C, C, 1.0f,
                    dv + x.u0 * kvrow, kvrow);
        // dS = P (dP - D) / sqrt(hd)
        for (int64_t t = x.t0; t < x.t1; t++)
          for (int64_t u = x.u0; u < x.u1; u++) ds[t * Tb + u] = pb[t * Tb + u] * (ds[t * Tb + u] - Dh[t]) * scale;
        // dQ += dS K ; dK += dS^T Q
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, m, 1.0f, dS, Tb, k + x.u0 * kvrow, kvrow, 1.0f,
                    dq + x.t0 * row, row);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, hd, n, 1.0f, dS, Tb, q + x.t0 * row, row, 1.0f,
                    dk + x.u0 * kvrow, kvrow);
      }
    }
  }
}

}  // namespace loom::cpu
