// Norm and column-sum kernels of the CUDA kernel set (ops.h): LayerNorm / RMSNorm forward
// and backward, and the deterministic column sums behind the bias and norm weight
// gradients.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "loom/cuda/check.h"
#include "loom/cuda/ops.h"
#include "loom/cuda/util.cuh"

namespace loom::cuda {
namespace {
// One warp per row. LayerNorm: var = mean((x - mean)^2) (biased, as torch); RMSNorm
// (b == nullptr): rstd = 1/sqrt(mean(x^2) + eps).
__global__ void norm_forward_k(__nv_bfloat16* out, float* mean, float* rstd, const float* inp, const float* w,
                               const float* b, int64_t N, int64_t C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  float mu = 0;
  if (b) {
    float s = 0;
    for (int64_t c = lane; c < C; c += 32) s += x[c];
    mu = warp_sum(s) / float(C);
  }
  float v = 0;
  for (int64_t c = lane; c < C; c += 32) v += (x[c] - mu) * (x[c] - mu);
  const float r = rsqrtf(warp_sum(v) / float(C) + eps);
  for (int64_t c = lane; c < C; c += 32) {
    const float y = (x[c] - mu) * r * w[c] + (b ? b[c] : 0.0f);
    out[row * C + c] = __float2bfloat16_rn(y);
  }
  if (lane == 0) {
    if (mean) mean[row] = mu;
    rstd[row] = r;
  }
}

// The same for C = 128 CB (CB <= 8) with 16-byte loads: lane l holds the float4 columns
// l + 32 j (j < CB) of its row in registers, so the row is read from memory once.
template <int CB>
__global__ void __launch_bounds__(256) norm_forward4_k(__nv_bfloat16* out, float* mean, float* rstd, const float* inp,
                                                       const float* w, const float* b, int64_t N, float eps) {
  constexpr int64_t C = CB * 128;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float4* x4 = reinterpret_cast<const float4*>(inp + row * C);
  float4 x[CB];
  float sum = 0;
#pragma unroll
  for (int j = 0; j < CB; j++) {
    x[j] = x4[lane + 32 * j];
    sum += (x[j].x + x[j].y) + (x[j].z + x[j].w);
  }
  const float mu = b ? warp_sum(sum) / float(C) : 0.0f;
  float var = 0;
#pragma unroll
  for (int j = 0; j < CB; j++) {
    const float4 d = make_float4(x[j].x - mu, x[j].y - mu, x[j].z - mu, x[j].w - mu);
    var += (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
  }
  const float r = rsqrtf(warp_sum(var) / float(C) + eps);
#pragma unroll
  for (int j = 0; j < CB; j++) {
    const float4 wv = reinterpret_cast<const float4*>(w)[lane + 32 * j];
    const float4 bv = b ? reinterpret_cast<const float4*>(b)[lane + 32 * j] : make_float4(0, 0, 0, 0);
    uint2 packed;
    *reinterpret_cast<__nv_bfloat162*>(&packed.x) =
        __floats2bfloat162_rn((x[j].x - mu) * r * wv.x + bv.x, (x[j].y - mu) * r * wv.y + bv.y);
    *reinterpret_cast<__nv_bfloat162*>(&packed.y) =
        __floats2bfloat162_rn((x[j].z - mu) * r * wv.z + bv.z, (x[j].w - mu) * r * wv.w + bv.w);
    reinterpret_cast<uint2*>(out + row * C)[lane + 32 * j] = packed;
  }
  if (lane == 0) {
    if (mean) mean[row] = mu;
    rstd[row] = r;
  }
}

// dinp += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dout w (RMSNorm:
// without the mean(dxhat) term and with mean 0). One warp per row.
__global__ void norm_backward_input_k(float* dinp, const float* dout, const float* inp, const float* w,
                                      const float* mean, const float* rstd, int64_t N, int64_t C, bool layer) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float mu = layer ? mean[row] : 0.0f, r = rstd[row];
  float s1 = 0, s2 = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float dxh = dy[c] * w[c];
    s1 += dxh;
    s2 += dxh * (x[c] - mu) * r;
  }
  s1 = layer ? warp_sum(s1) / float(C) : 0.0f;
  s2 = warp_sum(s2) / float(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float dxh = dy[c] * w[c];
    dinp[row * C + c] += r * (dxh - s1 - (x[c] - mu) * r * s2);
  }
}

// The same, four columns a lane with 16-byte loads (C % 4 == 0), also storing the updated
// dinp in bf16 when dinp_h is set (the next GEMM's input).
__global__ void norm_backward_input4_k(float* dinp, __nv_bfloat16* dinp_h, const float* dout, const float* inp,
                                       const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                                       bool layer) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float4* x = reinterpret_cast<const float4*>(inp + row * C);
  const float4* dy = reinterpret_cast<const float4*>(dout + row * C);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const float mu = layer ? mean[row] : 0.0f, r = rstd[row];
  float s1 = 0, s2 = 0;
  for (int64_t c = lane; c < C / 4; c += 32) {
    const float4 d = dy[c], xv = x[c], wv = w4[c];
    const float e[4] = {d.x * wv.x, d.y * wv.y, d.z * wv.z, d.w * wv.w}, xs[4] = {xv.x, xv.y, xv.z, xv.w};
    for (int i = 0; i < 4; i++) s1 += e[i], s2 += e[i] * (xs[i] - mu) * r;
  }
  s1 = layer ? warp_sum(s1) / float(C) : 0.0f;
  s2 = warp_sum(s2) / float(C);
  float4* out = reinterpret_cast<float4*>(dinp + row * C);
  for (int64_t c = lane; c < C / 4; c += 32) {
    const float4 d = dy[c], xv = x[c], wv = w4[c];
    float4 o = out[c];
    o.x += r * (d.x * wv.x - s1 - (xv.x - mu) * r * s2);
    o.y += r * (d.y * wv.y - s1 - (xv.y - mu) * r * s2);
    o.z += r * (d.z * wv.z - s1 - (xv.z - mu) * r * s2);
    o.w += r * (d.w * wv.w - s1 - (xv.w - mu) * r * s2);
    out[c] = o;
    if (dinp_h) {
      __nv_bfloat162* hp = reinterpret_cast<__nv_bfloat162*>(dinp_h + row * C + 4 * c);
      hp[0] = __floats2bfloat162_rn(o.x, o.y);
      hp[1] = __floats2bfloat162_rn(o.z, o.w);
    }
  }
}

__device__ inline float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ inline float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ inline void add4(float4& acc, float4 v, float s = 1.0f) {
  acc.x += v.x * s, acc.y += v.y * s, acc.z += v.z * s, acc.w += v.w * s;
}
// A norm's whole backward in one pass over dout and inp when C = 128 CB (CB <= 8): warp
// w of kNormWarps takes rows w, w + kNormWarps, ...; lane l owns the float4 columns
// l + 32 j (j < CB), keeps w, and sums its dw and db terms in registers, written per warp to
// part_w / part_b [kNormWarps][C] and summed over the warps in a fixed order by col_finish_k;
// part_s (when set) gets the column sums of the updated dinp the same way (the bias gradient
// of the linear layer whose output dinp is the gradient of: GPT's projections).
constexpr int kNormWarps = 1024;
template <int CB>
__global__ void __launch_bounds__(256) norm_backward_fused_k(float* dinp, __nv_bfloat16* dinp_h, float* part_w,
                                                             float* part_b, float* part_s, const float* dout,
                                                             const float* inp, const float* w, const float* mean,
                                                             const float* rstd, int64_t N) {
  constexpr int64_t C = CB * 128;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const bool layer = part_b != nullptr;
  float4 wv[CB], aw[CB], ab[CB], as[CB];
  for (int j = 0; j < CB; j++) {
    wv[j] = reinterpret_cast<const float4*>(w)[lane + 32 * j];
    aw[j] = ab[j] = as[j] = make_float4(0, 0, 0, 0);
  }
  for (int64_t row = warp; row < N; row += kNormWarps) {
    const float4* x4 = reinterpret_cast<const float4*>(inp + row * C);
    const float4* d4 = reinterpret_cast<const float4*>(dout + row * C);
    float4* out = reinterpret_cast<float4*>(dinp + row * C);
    float4 x[CB], d[CB], o[CB];  // dinp read with x and dout, not after the reductions
    const float mu = layer ? mean[row] : 0.0f, r = rstd[row];
    float s1 = 0, s2 = 0;
    for (int j = 0; j < CB; j++) {
      x[j] = x4[lane + 32 * j], d[j] = d4[lane + 32 * j], o[j] = out[lane + 32 * j];
      x[j] = make_float4((x[j].x - mu) * r, (x[j].y - mu) * r, (x[j].z - mu) * r, (x[j].w - mu) * r);  // xhat
      const float4 e = make_float4(d[j].x * wv[j].x, d[j].y * wv[j].y, d[j].z * wv[j].z, d[j].w * wv[j].w);
      s1 += e.x + e.y + e.z + e.w;
      s2 += e.x * x[j].x + e.y * x[j].y + e.z * x[j].z + e.w * x[j].w;
      aw[j].x += d[j].x * x[j].x, aw[j].y += d[j].y * x[j].y, aw[j].z += d[j].z * x[j].z, aw[j].w += d[j].w * x[j].w;
      add4(ab[j], d[j]);
    }
    s1 = layer ? warp_sum(s1) / float(C) : 0.0f;
    s2 = warp_sum(s2) / float(C);
    for (int j = 0; j < CB; j++) {
      o[j].x += r * (d[j].x * wv[j].x - s1 - x[j].x * s2);
      o[j].y += r * (d[j].y * wv[j].y - s1 - x[j].y * s2);
      o[j].z += r * (d[j].z * wv[j].z - s1 - x[j].z * s2);
      o[j].w += r * (d[j].w * wv[j].w - s1 - x[j].w * s2);
      out[lane + 32 * j] = o[j];
      add4(as[j], o[j]);
      if (dinp_h) {
        uint2 h;
        *reinterpret_cast<__nv_bfloat162*>(&h.x) = __floats2bfloat162_rn(o[j].x, o[j].y);
        *reinterpret_cast<__nv_bfloat162*>(&h.y) = __floats2bfloat162_rn(o[j].z, o[j].w);
        reinterpret_cast<uint2*>(dinp_h + row * C)[lane + 32 * j] = h;
      }
    }
  }
  for (int j = 0; j < CB; j++) {
    reinterpret_cast<float4*>(part_w + warp * C)[lane + 32 * j] = aw[j];
    if (layer) reinterpret_cast<float4*>(part_b + warp * C)[lane + 32 * j] = ab[j];
    if (part_s) reinterpret_cast<float4*>(part_s + warp * C)[lane + 32 * j] = as[j];
  }
}

// Column sums in two deterministic passes: block (32, 8) of group g sums column c over
// rows g*8 + ty, stepping by G*8, into part[g, c]; then out[c] += sum over g in order.
constexpr int kGroups = 256;  // row groups: enough blocks to fill the GPU at C = 768
template <class F>
__global__ void col_partials_k(float* part, int64_t N, int64_t C, F f) {
  __shared__ float sh[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0;
  if (c < C)
    for (int64_t n = int64_t(blockIdx.y) * 8 + threadIdx.y; n < N; n += int64_t(gridDim.y) * 8) acc += f(n, c);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0;
    for (int i = 0; i < 8; i++) s += sh[i][threadIdx.x];
    part[int64_t(blockIdx.y) * C + c] = s;
  }
}
// out[c] += sum over g of part[g, c]. A block (32, 32) takes 32 columns: thread (x, y)
// sums rows y, y + 32, ... in order, then thread (x, 0) adds the 32 sums in order (a
// fixed order, so deterministic; enough threads that the latency of the serial sums is
// hidden, where one thread per column summing 1,024 partials was not).
__global__ void col_finish_k(float* out, const float* part, int groups, int64_t C) {
  __shared__ float sh[32][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0;
  if (c < C)
    for (int g = int(threadIdx.y); g < groups; g += 32) acc += part[int64_t(g) * C + c];
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float total = 0;
  for (int i = 0; i < 32; i++) total += sh[i][threadIdx.x];
  out[c] += total;
}
void col_finish(float* out, const float* part, int groups, int64_t C, cudaStream_t s) {
  col_finish_k<<<unsigned((C + 31) / 32), dim3(32, 32), 0, s>>>(out, part, groups, C);
  LOOM_CUDA_LAUNCHED("col_finish");
}
// The same four columns a thread (C % 4 == 0) with 16- or 8-byte loads, for a bias
// gradient (sums of dout) or a norm's two (sums of dout xhat and of dout; kNorm).
template <class T, bool kNorm>
__global__ void col4_partials_k(float* part_a, float* part_b, const T* dout, const float* inp, const float* mean,
                                const float* rstd, int64_t N, int64_t C) {
  __shared__ float4 sa[8][32], sb[8][32];
  const int64_t c = (int64_t(blockIdx.x) * 32 + threadIdx.x) * 4;
  float4 a = make_float4(0, 0, 0, 0), b = a;
  if (c < C)
    for (int64_t n = int64_t(blockIdx.y) * 8 + threadIdx.y; n < N; n += int64_t(gridDim.y) * 8) {
      const float4 d = load4(dout + n * C + c);
      if constexpr (kNorm) {
        const float4 x = load4(inp + n * C + c);
        const float mu = mean ? mean[n] : 0.0f, r = rstd[n];
        a.x += d.x * (x.x - mu) * r, a.y += d.y * (x.y - mu) * r, a.z += d.z * (x.z - mu) * r,
            a.w += d.w * (x.w - mu) * r;
        add4(b, d);
      } else {
        add4(a, d);
      }
    }
  sa[threadIdx.y][threadIdx.x] = a, sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float4 ta = make_float4(0, 0, 0, 0), tb = ta;
  for (int i = 0; i < 8; i++) add4(ta, sa[i][threadIdx.x]), add4(tb, sb[i][threadIdx.x]);
  *reinterpret_cast<float4*>(part_a + int64_t(blockIdx.y) * C + c) = ta;
  if (part_b) *reinterpret_cast<float4*>(part_b + int64_t(blockIdx.y) * C + c) = tb;
}
int col4_groups(int64_t N) { return int(std::min<int64_t>(kGroups, std::max<int64_t>(1, (N + 7) / 8))); }
template <class T, bool kNorm>
void col4_sum(float* out_a, float* out_b, const T* dout, const float* inp, const float* mean, const float* rstd,
              int64_t N, int64_t C, float* scratch, cudaStream_t s) {
  const int groups = col4_groups(N);
  float* part_b = out_b ? scratch + int64_t(groups) * C : nullptr;
  col4_partials_k<T, kNorm><<<dim3(unsigned((C / 4 + 31) / 32), unsigned(groups)), dim3(32, 8), 0, s>>>(
      scratch, part_b, dout, inp, mean, rstd, N, C);
  LOOM_CUDA_LAUNCHED("col4_partials");
  col_finish(out_a, scratch, groups, C, s);
  if (!out_b) return;
  col_finish(out_b, part_b, groups, C, s);
}

template <class F>
void col_sum(float* out, int64_t N, int64_t C, float* scratch, cudaStream_t s, F f) {
  const int groups = int(std::min<int64_t>(kGroups, std::max<int64_t>(1, (N + 7) / 8)));
  col_partials_k<<<dim3(unsigned((C + 31) / 32), unsigned(groups)), dim3(32, 8), 0, s>>>(scratch, N, C, f);
  LOOM_CUDA_LAUNCHED("col_partials");
  col_finish(out, scratch, groups, C, s);
}

}  // namespace

void norm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                  int64_t C, float eps, cudaStream_t s) {
  const unsigned blocks = unsigned((N + 7) / 8);
  if (C % 128 == 0 && C <= 1024) {
    switch (C / 128) {
#define LOOM_NORM4(cb)                                                                   \
  case cb:                                                                               \
    norm_forward4_k<cb><<<blocks, 256, 0, s>>>(nv(out), mean, rstd, inp, w, b, N, eps); \
    break;
      LOOM_NORM4(1) LOOM_NORM4(2) LOOM_NORM4(3) LOOM_NORM4(4) LOOM_NORM4(5) LOOM_NORM4(6) LOOM_NORM4(7) LOOM_NORM4(8)
#undef LOOM_NORM4
    }
  } else {
    norm_forward_k<<<blocks, 256, 0, s>>>(nv(out), mean, rstd, inp, w, b, N, C, eps);
  }
  LOOM_CUDA_LAUNCHED("norm_forward");
}

int64_t norm_scratch_floats(int64_t N, int64_t C) { return 3 * int64_t(std::max(kGroups, kNormWarps)) * C; }

void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t C, float* scratch, cudaStream_t s,
                   bf16* dinp_h, float* dsum) {
  const bool layer = db != nullptr;
  if (C % 128 == 0 && C <= 1024) {
    float* part_b = layer ? scratch + int64_t(kNormWarps) * C : nullptr;
    float* part_s = dsum ? scratch + 2 * int64_t(kNormWarps) * C : nullptr;
    const unsigned blocks = kNormWarps / 8;
    switch (C / 128) {
#define LOOM_NORM_FUSED(cb)                                                                                         \
  case cb:                                                                                                          \
    norm_backward_fused_k<cb><<<blocks, 256, 0, s>>>(dinp, nv(dinp_h), scratch, part_b, part_s, dout, inp, w, mean, \
                                                     rstd, N);                                                     \
    break;
      LOOM_NORM_FUSED(1) LOOM_NORM_FUSED(2) LOOM_NORM_FUSED(3) LOOM_NORM_FUSED(4)
      LOOM_NORM_FUSED(5) LOOM_NORM_FUSED(6) LOOM_NORM_FUSED(7) LOOM_NORM_FUSED(8)
#undef LOOM_NORM_FUSED
    }
    LOOM_CUDA_LAUNCHED("norm_backward_fused");
    col_finish(dw, scratch, kNormWarps, C, s);
    if (layer) col_finish(db, part_b, kNormWarps, C, s);
    if (dsum) col_finish(dsum, part_s, kNormWarps, C, s);
    return;
  }
  if (C % 4 == 0) {
    norm_backward_input4_k<<<unsigned((N + 7) / 8), 256, 0, s>>>(dinp, nv(dinp_h), dout, inp, w, mean, rstd, N, C,
                                                                layer);
  } else {
    norm_backward_input_k<<<unsigned((N + 7) / 8), 256, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C, layer);
    if (dinp_h) to_bf16(dinp_h, dinp, N * C, s);
  }
  LOOM_CUDA_LAUNCHED("norm_backward_input");
  if (C % 4 == 0) {
    col4_sum<float, true>(dw, db, dout, inp, layer ? mean : nullptr, rstd, N, C, scratch, s);
  } else {
    col_sum(dw, N, C, scratch, s, [=] __device__(int64_t n, int64_t c) {
      const float mu = layer ? mean[n] : 0.0f;
      return dout[n * C + c] * (inp[n * C + c] - mu) * rstd[n];
    });
    if (layer) col_sum(db, N, C, scratch, s, [=] __device__(int64_t n, int64_t c) { return dout[n * C + c]; });
  }
  if (dsum) bias_backward(dsum, dinp, N, C, scratch, s);
}

int64_t bias_scratch_floats(int64_t N, int64_t OC) { return int64_t(kGroups) * OC; }
void bias_backward(float* db, const float* dout, int64_t N, int64_t OC, float* scratch, cudaStream_t s) {
  if (OC % 4 == 0) return col4_sum<float, false>(db, nullptr, dout, nullptr, nullptr, nullptr, N, OC, scratch, s);
  col_sum(db, N, OC, scratch, s, [=] __device__(int64_t n, int64_t c) { return dout[n * OC + c]; });
}
void bias_backward(float* db, const bf16* dout, int64_t N, int64_t OC, float* scratch, cudaStream_t s) {
  const __nv_bfloat16* d = nv(dout);
  if (OC % 4 == 0) return col4_sum<__nv_bfloat16, false>(db, nullptr, d, nullptr, nullptr, nullptr, N, OC, scratch, s);
  col_sum(db, N, OC, scratch, s, [=] __device__(int64_t n, int64_t c) { return __bfloat162float(d[n * OC + c]); });
}

}  // namespace loom::cuda
