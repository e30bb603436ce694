// Context-parallel attention (Note [Context-parallel attention], kernels/ops.inc): a rank's
// query rows against the whole sequence's gathered keys and values.
//
// The local rows come in runs of consecutive positions (a zig-zag or plain chunk, rank/
// cp_chunks.h). Per (batch, head) and run [t0, t1) whose last position is hi, the keys
// [0, hi] are the only ones any of its rows sees, so the GEMMs are (t1 - t0) x (hi + 1): a
// chunk early in the sequence reads few keys, one late in it many. Parallel over heads as
// in attention.cc (OpenBLAS single-threaded inside the OpenMP loop).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/position_runs.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::cpu {

namespace {

// One (batch, head): S = scale Q K^T per run, the row softmax over lo .. q_pos[t], O = P V.
// q rows at stride row, k and v at stride kvrow, o at stride C; p (Tq, Tk). round: each
// probability rounded to bf16 before P V reads it (Note [bf16 attention probabilities]),
// kept in `keep` (Tq, Tk) when given.
void cp_attend_head(float* o, float* p, bool round, bf16* keep, const float* q, const float* k, const float* v,
                    const int32_t* q_pos, const std::vector<std::pair<int64_t, int64_t>>& runs, int64_t Tk, int64_t hd,
                    int64_t row, int64_t kvrow, int64_t C, const int32_t* doc_start) {
  const float scale = 1.0f / std::sqrt(float(hd));
  for (auto [t0, t1] : runs) {
    const int64_t keys = q_pos[t1 - 1] + 1;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0, keys, hd, scale, q + t0 * row, row, k, kvrow, 0.0f,
                p + t0 * Tk, Tk);
    for (int64_t t = t0; t < t1; t++) {
      float* pr = p + t * Tk;
      softmax_window(pr, doc_start ? doc_start[t] : 0, q_pos[t], Tk);
      if (round)
        for (int64_t j = 0; j < Tk; j++) {
          const bf16 h = loom::to_bf16(pr[j]);
          pr[j] = loom::from_bf16(h);
          if (keep) keep[t * Tk + j] = h;
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1 - t0, hd, keys, 1.0f, p + t0 * Tk, Tk, v, kvrow, 0.0f,
                o + t0 * C, C);
  }
}

}  // namespace

namespace {

void cp_attend(float* out, float* probs, bool round, bf16* keep, const float* qkv, const float* kv,
               const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd,
               const int32_t* doc_start) {
  const int64_t row = (H + 2 * KV) * hd, kvrow = 2 * KV * hd, group = H / KV, C = H * hd;
  const std::vector<std::pair<int64_t, int64_t>> runs = position_runs(q_pos, Tq);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H, kh = h / group;
    const float* keys = kv + b * Tk * kvrow;
    float* p = keep ? scratch_floats(size_t(Tq) * size_t(Tk)) : probs + bh * Tq * Tk;
    cp_attend_head(out + b * Tq * C + h * hd, p, round, keep ? keep + bh * Tq * Tk : nullptr, qkv + b * Tq * row + h * hd,
                   keys + kh * hd, keys + (KV + kh) * hd, q_pos, runs, Tk, hd, row, kvrow, C,
                   doc_start ? doc_start + b * Tq : nullptr);
  }
}

}  // namespace

void cp_attention_forward(float* out, float* probs, const float* qkv, const float* kv, const int32_t* q_pos, int64_t B,
                          int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start) {
  cp_attend(out, probs, false, nullptr, qkv, kv, q_pos, B, Tq, Tk, H, KV, hd, doc_start);
}

void cp_attention_forward_bf16(float* out, float* probs, bf16* probs_h, const float* qkv, const float* kv,
                               const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                               int64_t hd, const int32_t* doc_start) {
  cp_attend(out, probs_h ? nullptr : probs, true, probs_h, qkv, kv, q_pos, B, Tq, Tk, H, KV, hd, doc_start);
}

namespace {

// Over (batch, kv head) tasks: the query heads of one group add into the same dK, dV rows.
// Each head's P is probs (fp32) or kept (bf16, widened into scratch).
void cp_attend_backward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                        const float* probs, const bf16* kept, const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk,
                        int64_t H, int64_t KV, int64_t hd) {
  const int64_t row = (H + 2 * KV) * hd, kvrow = 2 * KV * hd, group = H / KV, C = H * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::vector<std::pair<int64_t, int64_t>> runs = position_runs(q_pos, Tq);
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < B * KV; bk++) {
    const int64_t b = bk / KV, kh = bk % KV;
    float* ds = scratch_floats(size_t(Tq) * size_t(Tk));
    const float* k = kv + b * Tk * kvrow + kh * hd;
    const float* v = kv + b * Tk * kvrow + (KV + kh) * hd;
    float* dk = dkv + b * Tk * kvrow + kh * hd;
    float* dv = dkv + b * Tk * kvrow + (KV + kh) * hd;
    for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
      const float* p = probs ? probs + (b * H + h) * Tq * Tk : nullptr;
      if (kept) {
        float* w = scratch_floats(size_t(Tq) * size_t(Tk), 1);
        const bf16* kr = kept + (b * H + h) * Tq * Tk;
#pragma omp simd
        for (int64_t i = 0; i < Tq * Tk; i++) w[i] = loom::from_bf16(kr[i]);
        p = w;
      }
      const float* dy = dout + b * Tq * C + h * hd;
      const float* q = qkv + b * Tq * row + h * hd;
      float* dq = dqkv + b * Tq * row + h * hd;
      for (auto [t0, t1] : runs) {
        const int64_t keys = q_pos[t1 - 1] + 1, n = t1 - t0;
        // dP = dO V^T ; dV += P^T dO over the run's keys
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, hd, 1.0f, dy + t0 * C, C, v, kvrow, 0.0f,
                    ds + t0 * Tk, Tk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hd, n, 1.0f, p + t0 * Tk, Tk, dy + t0 * C, C, 1.0f,
                    dv, kvrow);
        // dS = P * (dP - rowsum(P * dP)) * scale (0 where P is: the masked keys)
        for (int64_t t = t0; t < t1; t++) {
          const float* pr = p + t * Tk;
          float* d = ds + t * Tk;
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < keys; j++) s += pr[j] * d[j];
#pragma omp simd
          for (int64_t j = 0; j < keys; j++) d[j] = pr[j] * (d[j] - s) * scale;
        }
        // dQ += dS K ; dK += dS^T Q
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, keys, 1.0f, ds + t0 * Tk, Tk, k, kvrow, 1.0f,
                    dq + t0 * row, row);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hd, n, 1.0f, ds + t0 * Tk, Tk, q + t0 * row, row,
                    1.0f, dk, kvrow);
      }
    }
  }
}

}  // namespace

void cp_attention_backward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                           const float* probs, const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                           int64_t KV, int64_t hd) {
  cp_attend_backward(dqkv, dkv, dout, qkv, kv, probs, nullptr, q_pos, B, Tq, Tk, H, KV, hd);
}

void cp_attention_backward_bf16(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                                const float* probs, const bf16* probs_h, const int32_t* q_pos, int64_t B, int64_t Tq,
                                int64_t Tk, int64_t H, int64_t KV, int64_t hd) {
  cp_attend_backward(dqkv, dkv, dout, qkv, kv, probs_h ? nullptr : probs, probs_h, q_pos, B, Tq, Tk, H, KV, hd);
}

}  // namespace loom::cpu
