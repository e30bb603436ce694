// Note [CUDA fp8] (fp8.h): the casts and the delayed-scaling update.
#include "loom/cuda/fp8.h"

#include <cuda_fp8.h>

#include "loom/cuda/check.h"
#include "loom/cuda/util.cuh"

namespace loom::cuda {
namespace {

__device__ inline uint8_t to_fp8(float v, Fp8 f) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8::kE4m3 ? __NV_E4M3 : __NV_E5M2));
}

// Raises *amax to the block's max |x| (non-negative floats order as their bit patterns).
__device__ inline void raise_amax(float* amax, float local) {
  const float m = block_max(local);
  if (threadIdx.x == 0 && amax) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

__global__ void cast_fp8_k(uint8_t* out, Fp8 f, const __nv_bfloat16* in, int64_t n, const float* scale, float* amax) {
  const float sc = *scale;
  float m = 0.0f;
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const float v = __bfloat162float(in[i]);
    m = fmaxf(m, fabsf(v));
    out[i] = to_fp8(v * sc, f);
  }
  raise_amax(amax, m);
}

// 32 x 32 tiles through shared memory, a block of 32 x 8 threads: reads rows of `in`,
// writes rows of out and of out_t (columns of in), each coalesced.
constexpr int kT = 32;
__global__ void cast_transpose_fp8_k(uint8_t* out, uint8_t* out_t, Fp8 f, const __nv_bfloat16* in, int64_t R,
                                     int64_t C, const float* scale, float* amax) {
  __shared__ uint8_t tile[kT][kT + 4];
  const float sc = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * kT, c0 = int64_t(blockIdx.x) * kT;
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
  float m = 0.0f;
  for (int i = ty; i < kT; i += blockDim.x / kT) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r < R && c < C) {
      const float v = __bfloat162float(in[r * C + c]);
      m = fmaxf(m, fabsf(v));
      const uint8_t q = to_fp8(v * sc, f);
      tile[i][tx] = q;
      if (out) out[r * C + c] = q;
    }
  }
  __syncthreads();
  if (out_t)
    for (int i = ty; i < kT; i += blockDim.x / kT) {
      const int64_t c = c0 + i, r = r0 + tx;
      if (r < R && c < C) out_t[c * R + r] = tile[tx][i];
    }
  raise_amax(amax, m);
}

__global__ void fp8_update_scales_k(float* scale, float* scale_inv, float* history, float* amax, int64_t n,
                                    int64_t H, int64_t step, float max, float margin_pow, int64_t stride) {
  const int64_t i = gtid();
  if (i >= n) return;
  float* row = history + i * H;
  row[step % H] = amax[i];
  amax[i] = 0.0f;
  float m = 0.0f;
  for (int64_t j = 0; j < H; j++) m = fmaxf(m, row[j]);
  if (m > 0.0f && isfinite(m)) {
    const float sc = max / m / margin_pow;
    scale[i * stride] = sc;
    scale_inv[i * stride] = 1.0f / sc;
  }
}

}  // namespace

float fp8_max(Fp8 f) { return f == Fp8::kE4m3 ? 448.0f : 57344.0f; }

void cast_fp8(uint8_t* out, Fp8 f, const bf16* in, int64_t n, const float* scale, float* amax, cudaStream_t s) {
  cast_fp8_k<<<blocks_for(n), kThreads, 0, s>>>(out, f, nv(in), n, scale, amax);
  LOOM_CUDA_LAUNCHED("cast_fp8");
}

void cast_transpose_fp8(uint8_t* out, uint8_t* out_t, Fp8 f, const bf16* in, int64_t R, int64_t C, const float* scale,
                        float* amax, cudaStream_t s) {
  const dim3 grid(unsigned((C + kT - 1) / kT), unsigned((R + kT - 1) / kT));
  cast_transpose_fp8_k<<<grid, kT * 8, 0, s>>>(out, out_t, f, nv(in), R, C, scale, amax);
  LOOM_CUDA_LAUNCHED("cast_transpose_fp8");
}

void fp8_update_scales(float* scale, float* scale_inv, float* history, float* amax, int64_t n, int64_t H,
                       int64_t step, Fp8 f, int margin, cudaStream_t s, int64_t stride) {
  fp8_update_scales_k<<<unsigned((n + 127) / 128), 128, 0, s>>>(scale, scale_inv, history, amax, n, H, step, fp8_max(f),
                                                                float(1 << margin), stride);
  LOOM_CUDA_LAUNCHED("fp8_update_scales");
}

}  // namespace loom::cuda
