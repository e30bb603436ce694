// Elementwise, norm, reduction and optimizer kernels of the CUDA kernel set (ops.h).
// Attention's softmax and head permutations are in attention.cu, GEMMs in blas.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "loom/core/error.h"
#include "loom/cuda/check.h"
#include "loom/cuda/ops.h"
#include "loom/cuda/util.cuh"

namespace loom::cuda {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  size_t free_b = 0, total_b = 0;
  std::string mem;
  if (e == cudaErrorMemoryAllocation && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    mem = " (the device has " + std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) +
          " MiB; lower train.batch or raise train.grad_accum)";
  throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(e) + mem + " at " + file + ":" +
              std::to_string(line));
}

void check_launch(const char* kernel, const char* file, int line) { check(cudaGetLastError(), kernel, file, line); }

namespace {

__global__ void to_bf16_k(__nv_bfloat16* out, const float* in, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void from_bf16_k(float* out, const __nv_bfloat16* in, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) out[i] = __bfloat162float(in[i]);
}

__global__ void embedding_forward_k(float* out, const int32_t* tok, const float* wte, const float* wpe, int64_t T,
                                    int64_t C, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const int64_t row = i / C, c = i % C;
    float x = wte[int64_t(tok[row]) * C + c];
    if (wpe) x += wpe[(row % T) * C + c];
    out[i] = x;
  }
}
__global__ void embedding_wte_backward_k(float* dwte, const float* dout, const int32_t* tok, int64_t C, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) atomicAdd(&dwte[int64_t(tok[i / C]) * C + i % C], dout[i]);
}
// dwpe[t, c] += sum_b dout[b, t, c]: one thread per (t, c), the batch summed in order.
__global__ void embedding_wpe_backward_k(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  for (int64_t i = gtid(); i < T * C; i += gstride()) {
    float s = 0;
    for (int64_t b = 0; b < B; b++) s += dout[b * T * C + i];
    dwpe[i] += s;
  }
}

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
// part_w / part_b [kNormWarps][C] and summed over the warps in order by col_finish_k.
constexpr int kNormWarps = 1024;
template <int CB>
__global__ void __launch_bounds__(256) norm_backward_fused_k(float* dinp, __nv_bfloat16* dinp_h, float* part_w,
                                                             float* part_b, const float* dout, const float* inp,
                                                             const float* w, const float* mean, const float* rstd,
                                                             int64_t N) {
  constexpr int64_t C = CB * 128;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const bool layer = part_b != nullptr;
  float4 wv[CB], aw[CB], ab[CB];
  for (int j = 0; j < CB; j++) {
    wv[j] = reinterpret_cast<const float4*>(w)[lane + 32 * j];
    aw[j] = ab[j] = make_float4(0, 0, 0, 0);
  }
  for (int64_t row = warp; row < N; row += kNormWarps) {
    const float4* x4 = reinterpret_cast<const float4*>(inp + row * C);
    const float4* d4 = reinterpret_cast<const float4*>(dout + row * C);
    float4 x[CB], d[CB];
    const float mu = layer ? mean[row] : 0.0f, r = rstd[row];
    float s1 = 0, s2 = 0;
    for (int j = 0; j < CB; j++) {
      x[j] = x4[lane + 32 * j], d[j] = d4[lane + 32 * j];
      x[j] = make_float4((x[j].x - mu) * r, (x[j].y - mu) * r, (x[j].z - mu) * r, (x[j].w - mu) * r);  // xhat
      const float4 e = make_float4(d[j].x * wv[j].x, d[j].y * wv[j].y, d[j].z * wv[j].z, d[j].w * wv[j].w);
      s1 += e.x + e.y + e.z + e.w;
      s2 += e.x * x[j].x + e.y * x[j].y + e.z * x[j].z + e.w * x[j].w;
      aw[j].x += d[j].x * x[j].x, aw[j].y += d[j].y * x[j].y, aw[j].z += d[j].z * x[j].z, aw[j].w += d[j].w * x[j].w;
      add4(ab[j], d[j]);
    }
    s1 = layer ? warp_sum(s1) / float(C) : 0.0f;
    s2 = warp_sum(s2) / float(C);
    float4* out = reinterpret_cast<float4*>(dinp + row * C);
    for (int j = 0; j < CB; j++) {
      float4 o = out[lane + 32 * j];
      o.x += r * (d[j].x * wv[j].x - s1 - x[j].x * s2);
      o.y += r * (d[j].y * wv[j].y - s1 - x[j].y * s2);
      o.z += r * (d[j].z * wv[j].z - s1 - x[j].z * s2);
      o.w += r * (d[j].w * wv[j].w - s1 - x[j].w * s2);
      out[lane + 32 * j] = o;
      if (dinp_h) {
        __nv_bfloat162* hp = reinterpret_cast<__nv_bfloat162*>(dinp_h + row * C + 4 * (lane + 32 * j));
        hp[0] = __floats2bfloat162_rn(o.x, o.y);
        hp[1] = __floats2bfloat162_rn(o.z, o.w);
      }
    }
  }
  for (int j = 0; j < CB; j++) {
    reinterpret_cast<float4*>(part_w + warp * C)[lane + 32 * j] = aw[j];
    if (layer) reinterpret_cast<float4*>(part_b + warp * C)[lane + 32 * j] = ab[j];
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
__global__ void col_finish_k(float* out, const float* part, int groups, int64_t C) {
  for (int64_t c = gtid(); c < C; c += gstride()) {
    float s = 0;
    for (int g = 0; g < groups; g++) s += part[int64_t(g) * C + c];
    out[c] += s;
  }
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
  col_finish_k<<<blocks_for(C), kThreads, 0, s>>>(out_a, scratch, groups, C);
  LOOM_CUDA_LAUNCHED("col_finish");
  if (!out_b) return;
  col_finish_k<<<blocks_for(C), kThreads, 0, s>>>(out_b, part_b, groups, C);
  LOOM_CUDA_LAUNCHED("col_finish");
}

template <class F>
void col_sum(float* out, int64_t N, int64_t C, float* scratch, cudaStream_t s, F f) {
  const int groups = int(std::min<int64_t>(kGroups, std::max<int64_t>(1, (N + 7) / 8)));
  col_partials_k<<<dim3(unsigned((C + 31) / 32), unsigned(groups)), dim3(32, 8), 0, s>>>(scratch, N, C, f);
  LOOM_CUDA_LAUNCHED("col_partials");
  col_finish_k<<<blocks_for(C), kThreads, 0, s>>>(out, scratch, groups, C);
  LOOM_CUDA_LAUNCHED("col_finish");
}

__device__ float gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ float gelu_grad(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float th = tanhf(u);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}
__global__ void gelu_forward_k(__nv_bfloat16* out, const __nv_bfloat16* inp, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) out[i] = __float2bfloat16_rn(gelu(__bfloat162float(inp[i])));
}
// Eight values a thread, 16-byte accesses (n % 8 == 0); backward when dout is set.
__global__ void gelu8_k(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* dout, int64_t n8) {
  for (int64_t i = gtid(); i < n8; i += gstride()) {
    const uint4 xv = reinterpret_cast<const uint4*>(inp)[i];
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
    uint4 dv = xv;
    if (dout) dv = reinterpret_cast<const uint4*>(dout)[i];
    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&dv);
    uint4 ov;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&ov);
    for (int j = 0; j < 4; j++) {
      const float2 x = __bfloat1622float2(x2[j]);
      if (dout) {
        const float2 d = __bfloat1622float2(d2[j]);
        o2[j] = __floats2bfloat162_rn(d.x * gelu_grad(x.x), d.y * gelu_grad(x.y));
      } else {
        o2[j] = __floats2bfloat162_rn(gelu(x.x), gelu(x.y));
      }
    }
    reinterpret_cast<uint4*>(out)[i] = ov;
  }
}
__global__ void gelu_backward_k(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout,
                                int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    dinp[i] = __float2bfloat16_rn(__bfloat162float(dout[i]) * gelu_grad(__bfloat162float(inp[i])));
  }
}
__global__ void swiglu_forward_k(__nv_bfloat16* out, const __nv_bfloat16* inp, int64_t N, int64_t F) {
  for (int64_t i = gtid(); i < N * F; i += gstride()) {
    const int64_t r = i / F, f = i % F;
    const float g = __bfloat162float(inp[r * 2 * F + f]), u = __bfloat162float(inp[r * 2 * F + F + f]);
    out[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
  }
}
__global__ void swiglu_backward_k(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout,
                                  int64_t N, int64_t F) {
  for (int64_t i = gtid(); i < N * F; i += gstride()) {
    const int64_t r = i / F, f = i % F;
    const float g = __bfloat162float(inp[r * 2 * F + f]), u = __bfloat162float(inp[r * 2 * F + F + f]);
    const float dy = __bfloat162float(dout[i]), sg = 1.0f / (1.0f + expf(-g));
    dinp[r * 2 * F + f] = __float2bfloat16_rn(dy * u * sg * (1.0f + g * (1.0f - sg)));
    dinp[r * 2 * F + F + f] = __float2bfloat16_rn(dy * g * sg);
  }
}
// One thread per rotated pair (row, head of the q and k parts, i < hd/2).
__global__ void rope_k(__nv_bfloat16* qkv, int64_t N, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta,
                       float sign) {
  const int64_t half = hd / 2, heads = H + KV, pairs = N * heads * half;
  for (int64_t p = gtid(); p < pairs; p += gstride()) {
    const int64_t i = p % half, h = (p / half) % heads, row = p / (half * heads);
    const double angle = double(row % T) * pow(double(theta), -2.0 * double(i) / double(hd));
    const float cs = float(cos(angle)), sn = sign * float(sin(angle));
    __nv_bfloat16* x = qkv + row * (H + 2 * KV) * hd + h * hd;
    const float a = __bfloat162float(x[i]), b = __bfloat162float(x[i + half]);
    x[i] = __float2bfloat16_rn(a * cs - b * sn);
    x[i + half] = __float2bfloat16_rn(b * cs + a * sn);
  }
}

// One block per row: an online max and sum of exponentials in one pass (each thread keeps
// its own, merged at the end), the loss, then (softmax - onehot) * dscale in bf16.
__global__ void crossentropy_k(float* losses, __nv_bfloat16* dlogits, const float* logits, const int32_t* targets,
                               int64_t V, int64_t ld, float dscale) {
  const int64_t row = blockIdx.x;
  const float* l = logits + row * ld;
  const int32_t target = targets[row];
  float mx = -INFINITY, se = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = l[j];
    if (x > mx) se = se * expf(mx - x) + 1.0f, mx = x;
    else se += expf(x - mx);
  }
  const float gmx = block_max(mx);
  se = block_sum(mx == -INFINITY ? 0.0f : se * expf(mx - gmx));
  mx = gmx;
  if (threadIdx.x == 0) losses[row] = target < 0 ? 0.0f : logf(se) + mx - l[target];
  if (!dlogits) return;
  __nv_bfloat16* d = dlogits + row * ld;
  const float inv = 1.0f / se;
  for (int64_t j = threadIdx.x; j < ld; j += blockDim.x) {  // columns past V: 0 (a padded GEMM reads them)
    const float g = target < 0 || j >= V ? 0.0f : (expf(l[j] - mx) * inv - (j == target ? 1.0f : 0.0f)) * dscale;
    d[j] = __float2bfloat16_rn(g);
  }
}

// The reference's arithmetic (kernels/ref/ops_t.h adamw_update) in fp32, the bias
// corrections computed on the host in double.
__global__ void adamw_k(float* p, __nv_bfloat16* p_h, const float* g, float* m, float* v, int64_t n, float lr, float b1,
                        float b2, float eps, float wd, float bc1, float bc2, float gs) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps);
    const float pi = p[i] - lr * (upd + wd * p[i]);
    p[i] = pi;
    p_h[i] = __float2bfloat16_rn(pi);
  }
}

__global__ void sum_squares_partial_k(double* part, const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = gtid(); i < n; i += gstride()) s += double(x[i]) * double(x[i]);
  s = block_sum_d(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void sum_partial_k(double* part, const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = gtid(); i < n; i += gstride()) s += double(x[i]);
  s = block_sum_d(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void finish_d_k(double* out, float* out_f, const double* part, int parts) {
  double s = 0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) {
    if (out) *out = s;
    if (out_f) *out_f = float(s);
  }
}

}  // namespace

void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s) {
  to_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(nv(out), in, n);
  LOOM_CUDA_LAUNCHED("to_bf16");
}
void from_bf16(float* out, const bf16* in, int64_t n, cudaStream_t s) {
  from_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(out, nv(in), n);
  LOOM_CUDA_LAUNCHED("from_bf16");
}

void embedding_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, cudaStream_t s) {
  embedding_forward_k<<<blocks_for(B * T * C), kThreads, 0, s>>>(out, tok, wte, wpe, T, C, B * T * C);
  LOOM_CUDA_LAUNCHED("embedding_forward");
}
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int64_t B, int64_t T,
                        int64_t C, cudaStream_t s) {
  if (dwte) {
    embedding_wte_backward_k<<<blocks_for(B * T * C), kThreads, 0, s>>>(dwte, dout, tok, C, B * T * C);
    LOOM_CUDA_LAUNCHED("embedding_wte_backward");
  }
  if (dwpe) {
    embedding_wpe_backward_k<<<blocks_for(T * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
    LOOM_CUDA_LAUNCHED("embedding_wpe_backward");
  }
}

void norm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                  int64_t C, float eps, cudaStream_t s) {
  norm_forward_k<<<unsigned((N + 7) / 8), 256, 0, s>>>(nv(out), mean, rstd, inp, w, b, N, C, eps);
  LOOM_CUDA_LAUNCHED("norm_forward");
}

int64_t norm_scratch_floats(int64_t N, int64_t C) { return 2 * int64_t(std::max(kGroups, kNormWarps)) * C; }

void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t C, float* scratch, cudaStream_t s,
                   bf16* dinp_h) {
  const bool layer = db != nullptr;
  if (C % 128 == 0 && C <= 1024) {
    float* part_b = layer ? scratch + int64_t(kNormWarps) * C : nullptr;
    const unsigned blocks = kNormWarps / 8;
    switch (C / 128) {
#define LOOM_NORM_FUSED(cb)                                                                                         \
  case cb:                                                                                                          \
    norm_backward_fused_k<cb><<<blocks, 256, 0, s>>>(dinp, nv(dinp_h), scratch, part_b, dout, inp, w, mean, rstd, N); \
    break;
      LOOM_NORM_FUSED(1) LOOM_NORM_FUSED(2) LOOM_NORM_FUSED(3) LOOM_NORM_FUSED(4)
      LOOM_NORM_FUSED(5) LOOM_NORM_FUSED(6) LOOM_NORM_FUSED(7) LOOM_NORM_FUSED(8)
#undef LOOM_NORM_FUSED
    }
    LOOM_CUDA_LAUNCHED("norm_backward_fused");
    col_finish_k<<<blocks_for(C), kThreads, 0, s>>>(dw, scratch, kNormWarps, C);
    LOOM_CUDA_LAUNCHED("col_finish");
    if (layer) {
      col_finish_k<<<blocks_for(C), kThreads, 0, s>>>(db, part_b, kNormWarps, C);
      LOOM_CUDA_LAUNCHED("col_finish");
    }
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
  if (C % 4 == 0) return col4_sum<float, true>(dw, db, dout, inp, layer ? mean : nullptr, rstd, N, C, scratch, s);
  col_sum(dw, N, C, scratch, s, [=] __device__(int64_t n, int64_t c) {
    const float mu = layer ? mean[n] : 0.0f;
    return dout[n * C + c] * (inp[n * C + c] - mu) * rstd[n];
  });
  if (layer) col_sum(db, N, C, scratch, s, [=] __device__(int64_t n, int64_t c) { return dout[n * C + c]; });
}

void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s) {
  if (n % 8 == 0) {
    gelu8_k<<<blocks_for(n / 8), kThreads, 0, s>>>(nv(out), nv(inp), nullptr, n / 8);
    return LOOM_CUDA_LAUNCHED("gelu8_forward");
  }
  gelu_forward_k<<<blocks_for(n), kThreads, 0, s>>>(nv(out), nv(inp), n);
  LOOM_CUDA_LAUNCHED("gelu_forward");
}
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s) {
  if (n % 8 == 0) {
    gelu8_k<<<blocks_for(n / 8), kThreads, 0, s>>>(nv(dinp), nv(inp), nv(dout), n / 8);
    return LOOM_CUDA_LAUNCHED("gelu8_backward");
  }
  gelu_backward_k<<<blocks_for(n), kThreads, 0, s>>>(nv(dinp), nv(inp), nv(dout), n);
  LOOM_CUDA_LAUNCHED("gelu_backward");
}
void swiglu_forward(bf16* out, const bf16* inp, int64_t N, int64_t F, cudaStream_t s) {
  swiglu_forward_k<<<blocks_for(N * F), kThreads, 0, s>>>(nv(out), nv(inp), N, F);
  LOOM_CUDA_LAUNCHED("swiglu_forward");
}
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F, cudaStream_t s) {
  swiglu_backward_k<<<blocks_for(N * F), kThreads, 0, s>>>(nv(dinp), nv(inp), nv(dout), N, F);
  LOOM_CUDA_LAUNCHED("swiglu_backward");
}
void rope(bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta, bool inverse,
          cudaStream_t s) {
  rope_k<<<blocks_for(B * T * (H + KV) * hd / 2), kThreads, 0, s>>>(nv(qkv), B * T, T, H, KV, hd, theta,
                                                                     inverse ? -1.0f : 1.0f);
  LOOM_CUDA_LAUNCHED("rope");
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

void crossentropy(float* losses, bf16* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t ld, float dscale, cudaStream_t s) {
  if (N == 0) return;
  crossentropy_k<<<unsigned(N), 512, 0, s>>>(losses, nv(dlogits), logits, targets, V, ld, dscale);
  LOOM_CUDA_LAUNCHED("crossentropy");
}

void adamw(float* p, bf16* p_h, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2, float eps,
           float wd, int64_t step, float grad_scale, cudaStream_t s) {
  const float bc1 = float(1.0 - std::pow(double(b1), double(step)));
  const float bc2 = float(1.0 - std::pow(double(b2), double(step)));
  adamw_k<<<blocks_for(n), kThreads, 0, s>>>(p, nv(p_h), g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale);
  LOOM_CUDA_LAUNCHED("adamw");
}

void sum_squares(double* out, const float* x, int64_t n, double* scratch, cudaStream_t s) {
  const unsigned parts = unsigned(std::min<int64_t>(1024, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
  sum_squares_partial_k<<<parts, kThreads, 0, s>>>(scratch, x, n);
  LOOM_CUDA_LAUNCHED("sum_squares_partial");
  finish_d_k<<<1, 1024, 0, s>>>(out, nullptr, scratch, int(parts));
  LOOM_CUDA_LAUNCHED("sum_squares_finish");
}
void sum(float* out, const float* x, int64_t n, double* scratch, cudaStream_t s) {
  const unsigned parts = unsigned(std::min<int64_t>(1024, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
  sum_partial_k<<<parts, kThreads, 0, s>>>(scratch, x, n);
  LOOM_CUDA_LAUNCHED("sum_partial");
  finish_d_k<<<1, 1024, 0, s>>>(nullptr, out, scratch, int(parts));
  LOOM_CUDA_LAUNCHED("sum_finish");
}

}  // namespace loom::cuda
