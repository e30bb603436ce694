// Attention pieces of the CUDA kernel set (ops.h): the causal softmax and its backward,
// one warp per score row, and the head permutations around cuBLAS's batched GEMMs
// (Note [CUDA attention] in cuda/model.cc).
#include <cuda_bf16.h>

#include "loom/cuda/check.h"
#include "loom/cuda/ops.h"
#include "loom/cuda/util.cuh"

namespace loom::cuda {
namespace {

// Row r = (bh, t): P[j] = exp(S[j] - max) / sum for j <= t, rounded to bf16; 0 for j > t.
__global__ void softmax_causal_forward_k(__nv_bfloat16* P, const float* S, int64_t rows, int64_t T) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int64_t t = r % T;
  const float* s = S + r * T;
  __nv_bfloat16* p = P + r * T;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= t; j += 32) mx = fmaxf(mx, s[j]);
  mx = warp_max(mx);
  float se = 0;
  for (int64_t j = lane; j <= t; j += 32) se += expf(s[j] - mx);
  const float inv = 1.0f / warp_sum(se);
  for (int64_t j = lane; j < T; j += 32) p[j] = __float2bfloat16_rn(j <= t ? expf(s[j] - mx) * inv : 0.0f);
}

// dS[j] = P[j] (dP[j] - sum_k P[k] dP[k]) scale for j <= t, with the bf16 P (Note [bf16
// attention probabilities]); 0 above the diagonal.
__global__ void softmax_causal_backward_k(__nv_bfloat16* dS, const __nv_bfloat16* P, const float* dP, int64_t rows,
                                          int64_t T, float scale) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int64_t t = r % T;
  const __nv_bfloat16* p = P + r * T;
  const float* dp = dP + r * T;
  float dot = 0;
  for (int64_t j = lane; j <= t; j += 32) dot += __bfloat162float(p[j]) * dp[j];
  dot = warp_sum(dot);
  __nv_bfloat16* ds = dS + r * T;
  for (int64_t j = lane; j < T; j += 32)
    ds[j] = __float2bfloat16_rn(j <= t ? __bfloat162float(p[j]) * (dp[j] - dot) * scale : 0.0f);
}

// One thread per element of q (B,H,T,hd): it also writes k and v of its query head (the
// key/value head h / (H/KV), repeated).
__global__ void split_heads_k(__nv_bfloat16* q, __nv_bfloat16* k, __nv_bfloat16* v, const __nv_bfloat16* qkv,
                              int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const int64_t d = i % hd, t = (i / hd) % T, h = (i / (hd * T)) % H, b = i / (hd * T * H);
    const __nv_bfloat16* row = qkv + (b * T + t) * (H + 2 * KV) * hd;
    const int64_t kvh = h / (H / KV);
    q[i] = row[h * hd + d];
    k[i] = row[(H + kvh) * hd + d];
    v[i] = row[(H + KV + kvh) * hd + d];
  }
}
// One thread per element of dqkv (B,T,(H+2KV)*hd).
__global__ void merge_heads_k(__nv_bfloat16* qkv, const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t n) {
  const int64_t Q = (H + 2 * KV) * hd, group = H / KV;
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const int64_t col = i % Q, row = i / Q, b = row / T, t = row % T;
    const int64_t head = col / hd, d = col % hd;
    if (head < H) {
      qkv[i] = q[((b * H + head) * T + t) * hd + d];
      continue;
    }
    const bool is_k = head < H + KV;
    const int64_t kvh = is_k ? head - H : head - H - KV;
    const __nv_bfloat16* src = is_k ? k : v;
    float s = 0;
    for (int64_t g = 0; g < group; g++) s += __bfloat162float(src[((b * H + kvh * group + g) * T + t) * hd + d]);
    qkv[i] = __float2bfloat16_rn(s);
  }
}
__global__ void heads_rows_k(__nv_bfloat16* out, const __nv_bfloat16* in, int64_t T, int64_t H, int64_t hd, int64_t n,
                             bool to_rows) {
  for (int64_t i = gtid(); i < n; i += gstride()) {  // i indexes the (B,H,T,hd) layout
    const int64_t d = i % hd, t = (i / hd) % T, h = (i / (hd * T)) % H, b = i / (hd * T * H);
    const int64_t j = ((b * T + t) * H + h) * hd + d;
    if (to_rows) out[j] = in[i];
    else out[i] = in[j];
  }
}

}  // namespace

void softmax_causal_forward(bf16* P, const float* S, int64_t BH, int64_t T, cudaStream_t s) {
  const int64_t rows = BH * T;
  softmax_causal_forward_k<<<unsigned((rows + 7) / 8), 256, 0, s>>>(nv(P), S, rows, T);
  LOOM_CUDA_LAUNCHED("softmax_causal_forward");
}
void softmax_causal_backward(bf16* dS, const bf16* P, const float* dP, int64_t BH, int64_t T, float scale,
                             cudaStream_t s) {
  const int64_t rows = BH * T;
  softmax_causal_backward_k<<<unsigned((rows + 7) / 8), 256, 0, s>>>(nv(dS), nv(P), dP, rows, T, scale);
  LOOM_CUDA_LAUNCHED("softmax_causal_backward");
}
void split_heads(bf16* q, bf16* k, bf16* v, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                 cudaStream_t s) {
  const int64_t n = B * H * T * hd;
  split_heads_k<<<blocks_for(n), kThreads, 0, s>>>(nv(q), nv(k), nv(v), nv(qkv), T, H, KV, hd, n);
  LOOM_CUDA_LAUNCHED("split_heads");
}
void merge_heads(bf16* qkv, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                 int64_t hd, cudaStream_t s) {
  const int64_t n = B * T * (H + 2 * KV) * hd;
  merge_heads_k<<<blocks_for(n), kThreads, 0, s>>>(nv(qkv), nv(q), nv(k), nv(v), T, H, KV, hd, n);
  LOOM_CUDA_LAUNCHED("merge_heads");
}
void heads_to_rows(bf16* out, const bf16* in, int64_t B, int64_t T, int64_t H, int64_t hd, cudaStream_t s) {
  const int64_t n = B * H * T * hd;
  heads_rows_k<<<blocks_for(n), kThreads, 0, s>>>(nv(out), nv(in), T, H, hd, n, true);
  LOOM_CUDA_LAUNCHED("heads_to_rows");
}
void rows_to_heads(bf16* out, const bf16* in, int64_t B, int64_t T, int64_t H, int64_t hd, cudaStream_t s) {
  const int64_t n = B * H * T * hd;
  heads_rows_k<<<blocks_for(n), kThreads, 0, s>>>(nv(out), nv(in), T, H, hd, n, false);
  LOOM_CUDA_LAUNCHED("rows_to_heads");
}

}  // namespace loom::cuda
