// Elementwise, loss, reduction and optimizer kernels of the CUDA kernel set (ops.h). Norms
// and column sums are in norm.cu, attention in attention.cu and flash.cu, GEMMs in blas.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// A block per row: an online max and sum of exponentials in one pass (each thread keeps its
// own over eight bf16 columns at a time, one 16-byte load, merged at the end), the loss,
// then (softmax - onehot) * dscale in bf16, written over the logits where dlogits aliases
// them (each thread rewrites only the columns it read, after the block's reductions).
// Exponentials are exp2 of x log2 e - m (m the max in the same units), one fused
// multiply-add and one exp2 per element; columns past V count as -inf (their gradient is 0:
// a padded GEMM reads them). kStash: the first pass also keeps the row in shared memory
// (each thread the 16-byte groups it will read again, so no barrier is needed) and the
// second pass reads it there, so the logits are read from memory once; the blocks walk the
// rows, two per SM for GPT-2 (a row of 50,304 bf16 is 98 KB), so one block's loads overlap
// the other's reductions and writes. Otherwise (rows wider than a block's shared memory) a
// block per row reads it twice.
__device__ inline void ce_unpack8(float (&x)[8], uint4 raw, int64_t j, int64_t V) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x, x[2 * i + 1] = f.y;
  }
  if (j + 8 > V) {
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = j + i < V ? x[i] : -INFINITY;
  }
}
template <bool kStash>
__device__ void crossentropy_row(float* losses, __nv_bfloat16* dlogits, const __nv_bfloat16* logits,
                                 const int32_t* targets, int64_t row, int64_t V, int64_t ld, float dscale,
                                 uint4* stash) {
  constexpr float kLog2e = 1.4426950408889634f;
  const __nv_bfloat16* l = logits + row * ld;
  const int32_t target = targets[row];
  // Read before the reductions' barriers: an in-place gradient may overwrite it after them.
  const float target_logit = threadIdx.x == 0 && target >= 0 ? __bfloat162float(l[target]) : 0.0f;
  float mx = -INFINITY, se = 0;  // mx in log2 units: max of x log2 e
#pragma unroll 4
  for (int64_t j = 8 * int64_t(threadIdx.x); j < (kStash ? ld : V); j += 8 * int64_t(blockDim.x)) {
    const uint4 raw = *reinterpret_cast<const uint4*>(l + j);
    if constexpr (kStash) {
      stash[j / 8] = raw;
      if (j >= V) continue;  // all eight -inf (with mx still -inf, x - mx would be NaN)
    }
    float x[8];
    ce_unpack8(x, raw, j, V);
    float m8 = x[0];
#pragma unroll
    for (int i = 1; i < 8; i++) m8 = fmaxf(m8, x[i]);
    m8 *= kLog2e;
    if (m8 > mx) se *= exp2f(mx - m8), mx = m8;  // exp2(-inf) = 0 on the first
#pragma unroll
    for (int i = 0; i < 8; i++) se += exp2f(fmaf(x[i], kLog2e, -mx));
  }
  const float gmx = block_max(mx);
  se = block_sum(mx == -INFINITY ? 0.0f : se * exp2f(mx - gmx));
  mx = gmx;
  if (threadIdx.x == 0) losses[row] = target < 0 ? 0.0f : logf(se) + mx / kLog2e - target_logit;
  if (!dlogits) return;
  __nv_bfloat16* d = dlogits + row * ld;
  const float inv = (target < 0 ? 0.0f : dscale) / se;
  for (int64_t j = 8 * int64_t(threadIdx.x); j < ld; j += 8 * int64_t(blockDim.x)) {
    float x[8];
    ce_unpack8(x, kStash ? stash[j / 8] : *reinterpret_cast<const uint4*>(l + j), j, V);
    uint4 packed;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float g0 = exp2f(fmaf(x[2 * i], kLog2e, -mx)) * inv, g1 = exp2f(fmaf(x[2 * i + 1], kLog2e, -mx)) * inv;
      g0 -= target == j + 2 * i ? dscale : 0.0f;  // (no indexing by a runtime value)
      g1 -= target == j + 2 * i + 1 ? dscale : 0.0f;
      h[i] = __floats2bfloat162_rn(g0, g1);
    }
    *reinterpret_cast<uint4*>(d + j) = packed;
  }
}
__global__ void __launch_bounds__(512) crossentropy_k(float* losses, __nv_bfloat16* dlogits,
                                                      const __nv_bfloat16* logits, const int32_t* targets, int64_t V,
                                                      int64_t ld, float dscale) {
  crossentropy_row<false>(losses, dlogits, logits, targets, blockIdx.x, V, ld, dscale, nullptr);
}
__global__ void __launch_bounds__(512, 2) crossentropy_stash_k(float* losses, __nv_bfloat16* dlogits,
                                                               const __nv_bfloat16* logits, const int32_t* targets,
                                                               int64_t N, int64_t V, int64_t ld, float dscale) {
  extern __shared__ uint4 stash[];  // ld / 8
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x)  // block_max / block_sum open with a barrier
    crossentropy_row<true>(losses, dlogits, logits, targets, row, V, ld, dscale, stash);
}

// The reference's arithmetic (kernels/ref/ops_t.h adamw_update) in fp32, the bias
// corrections computed on the host in double. The gradient scale is gs, or, where the
// squared gradient norm is given on the device, clip_coef's min(1, max / (norm + 1e-6)) in
// double (optim/optimizer.cc; IEEE double sqrt and division, so the host's bits).
struct AdamArgs {
  float lr, b1, b2, eps, wd, bc1, bc2, gs;
  const double* norm_sq;  // null: gs as given
  double max_norm;
};
__device__ inline float adam_scale(const AdamArgs& a) {
  if (!a.norm_sq || a.max_norm <= 0) return a.gs;
  const double coef = a.max_norm / (sqrt(*a.norm_sq) + 1e-6);
  return float(coef < 1.0 ? coef : 1.0);
}
__device__ inline void adam_one(float& p, float& m, float& v, float g, float gs, float wd, const AdamArgs& a) {
  const float gi = g * gs;
  const float mi = a.b1 * m + (1.0f - a.b1) * gi;
  const float vi = a.b2 * v + (1.0f - a.b2) * gi * gi;
  m = mi;
  v = vi;
  const float upd = (mi / a.bc1) / (sqrtf(vi / a.bc2) + a.eps);
  p = p - a.lr * (upd + wd * p);
}
__global__ void adamw_k(float* p, __nv_bfloat16* p_h, const float* g, float* m, float* v, int64_t n, AdamArgs a) {
  const float gs = adam_scale(a);
  for (int64_t i = gtid(); i < n; i += gstride()) {
    float pi = p[i], mi = m[i], vi = v[i];
    adam_one(pi, mi, vi, g[i], gs, a.wd, a);
    p[i] = pi, m[i] = mi, v[i] = vi;
    p_h[i] = __float2bfloat16_rn(pi);
  }
}
// The same four elements a thread with 16-byte loads (8-byte bf16 stores). With a run
// table (starts ascending, multiples of 4, the first 0) the weight decay of element 4i is
// decay[r] * a.wd for the last run r starting at or before it (a binary search in a table
// of tens of entries, cached), so one launch covers a whole flat buffer.
__global__ void adamw4_k(float4* p, uint2* p_h, const float4* g, float4* m, float4* v, int64_t n4, AdamArgs a,
                         const int64_t* starts = nullptr, const float* decay = nullptr, int runs = 0) {
  const float gs = adam_scale(a);
  for (int64_t i = gtid(); i < n4; i += gstride()) {
    float wd = a.wd;
    if (runs > 0) {
      int lo = 0, hi = runs;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (starts[mid] <= 4 * i) lo = mid;
        else hi = mid;
      }
      wd = decay[lo] * a.wd;
    }
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adam_one(pi.x, mi.x, vi.x, gi.x, gs, wd, a);
    adam_one(pi.y, mi.y, vi.y, gi.y, gs, wd, a);
    adam_one(pi.z, mi.z, vi.z, gi.z, gs, wd, a);
    adam_one(pi.w, mi.w, vi.w, gi.w, gs, wd, a);
    p[i] = pi, m[i] = mi, v[i] = vi;
    uint2 h;
    *reinterpret_cast<__nv_bfloat162*>(&h.x) = __floats2bfloat162_rn(pi.x, pi.y);
    *reinterpret_cast<__nv_bfloat162*>(&h.y) = __floats2bfloat162_rn(pi.z, pi.w);
    p_h[i] = h;
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


// Streaming multiprocessors of the current device and the shared memory one block may opt
// into (asked once per process).
int device_attribute(cudaDeviceAttr what) {
  int dev = 0, value = 0;
  LOOM_CUDA_OK(cudaGetDevice(&dev));
  LOOM_CUDA_OK(cudaDeviceGetAttribute(&value, what, dev));
  return value;
}
int sm_count() {
  static const int n = device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}
int64_t block_smem_optin() {
  static const int64_t bytes = [] {
    const int b = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    LOOM_CUDA_OK(cudaFuncSetAttribute(crossentropy_stash_k, cudaFuncAttributeMaxDynamicSharedMemorySize, b - 1024));
    return int64_t(b - 1024);  // (room for the reductions' static arrays)
  }();
  return bytes;
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

void crossentropy(float* losses, bf16* dlogits, const bf16* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t ld, float dscale, cudaStream_t s) {
  LOOM_CHECK(ld % 8 == 0 && ld >= V, "cross-entropy row stride ", ld, " for ", V, " columns: a multiple of 8, at least V");
  if (N == 0) return;
  const size_t row_bytes = size_t(ld) * 2;
  if (int64_t(row_bytes) <= block_smem_optin()) {
    int per_sm = 0;
    LOOM_CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, crossentropy_stash_k, 512, row_bytes));
    const unsigned blocks = unsigned(std::min<int64_t>(N, int64_t(std::max(per_sm, 1)) * sm_count()));
    crossentropy_stash_k<<<blocks, 512, row_bytes, s>>>(losses, nv(dlogits), nv(logits), targets, N, V, ld, dscale);
  } else {
    crossentropy_k<<<unsigned(N), 512, 0, s>>>(losses, nv(dlogits), nv(logits), targets, V, ld, dscale);
  }
  LOOM_CUDA_LAUNCHED("crossentropy");
}

void adamw(float* p, bf16* p_h, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2, float eps,
           float wd, int64_t step, float grad_scale, cudaStream_t s, const double* clip_norm_sq, double clip_max) {
  AdamArgs a{lr, b1, b2, eps, wd, float(1.0 - std::pow(double(b1), double(step))),
             float(1.0 - std::pow(double(b2), double(step))), grad_scale, clip_norm_sq, clip_max};
  // Elements [0, head) and [head + 4 n4, n) one at a time, the rest four at a time where
  // every array is aligned for it from `head` on.
  auto aligned = [](const void* q, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(q) % bytes == 0; };
  int64_t head = std::min<int64_t>(n, int64_t((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / 4));
  if (!aligned(g + head, 16) || !aligned(m + head, 16) || !aligned(v + head, 16) || !aligned(p_h + head, 8)) head = n;
  const int64_t n4 = (n - head) / 4, tail = head + 4 * n4;
  auto scalar = [&](int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    adamw_k<<<blocks_for(hi - lo), kThreads, 0, s>>>(p + lo, nv(p_h) + lo, g + lo, m + lo, v + lo, hi - lo, a);
    LOOM_CUDA_LAUNCHED("adamw");
  };
  scalar(0, head);
  if (n4 > 0) {
    adamw4_k<<<blocks_for(n4), kThreads, 0, s>>>(reinterpret_cast<float4*>(p + head), reinterpret_cast<uint2*>(p_h + head),
                                                reinterpret_cast<const float4*>(g + head),
                                                reinterpret_cast<float4*>(m + head), reinterpret_cast<float4*>(v + head),
                                                n4, a);
    LOOM_CUDA_LAUNCHED("adamw4");
  }
  scalar(tail, n);
}

void adamw_runs(float* p, bf16* p_h, const float* g, float* m, float* v, int64_t n, const int64_t* starts,
                const float* decay, int runs, float lr, float b1, float b2, float eps, float wd, int64_t step,
                float grad_scale, cudaStream_t s, const double* clip_norm_sq, double clip_max) {
  auto aligned = [](const void* q, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(q) % bytes == 0; };
  LOOM_CHECK(n % 4 == 0 && aligned(p, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) && aligned(p_h, 8),
             "adamw_runs needs 16-byte aligned buffers of a multiple of 4 floats, got ", n);
  AdamArgs a{lr, b1, b2, eps, wd, float(1.0 - std::pow(double(b1), double(step))),
             float(1.0 - std::pow(double(b2), double(step))), grad_scale, clip_norm_sq, clip_max};
  const int64_t n4 = n / 4;
  if (n4 == 0) return;
  adamw4_k<<<blocks_for(n4), kThreads, 0, s>>>(reinterpret_cast<float4*>(p), reinterpret_cast<uint2*>(p_h),
                                              reinterpret_cast<const float4*>(g), reinterpret_cast<float4*>(m),
                                              reinterpret_cast<float4*>(v), n4, a, starts, decay, runs);
  LOOM_CUDA_LAUNCHED("adamw_runs");
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
