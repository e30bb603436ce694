// Device-side helpers shared by the CUDA kernel files: grid-stride indices, the launch
// size, warp and block reductions, and the bf16 type pun (loom::bf16 is the raw 16 bits).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "loom/core/bf16.h"

namespace loom::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
  return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 132 * 32));
}

__device__ inline int64_t gtid() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t gstride() { return int64_t(gridDim.x) * blockDim.x; }

inline __nv_bfloat16* nv(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const __nv_bfloat16* nv(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. The order of the sums is fixed, so results are deterministic.
template <class T, class Op>
__device__ inline T block_reduce(T v, Op warp_op) {
  __shared__ T sh[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_op(v);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T r = sh[0];
  for (int i = 1; i < warps; i++) r = warp_op.combine(r, sh[i]);
  return r;
}
struct SumOp {
  __device__ float operator()(float v) const { return warp_sum(v); }
  __device__ float combine(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float v) const { return warp_max(v); }
  __device__ float combine(float a, float b) const { return fmaxf(a, b); }
};
struct SumOpD {
  __device__ double operator()(double v) const { return warp_sum_d(v); }
  __device__ double combine(double a, double b) const { return a + b; }
};
__device__ inline float block_sum(float v) { return block_reduce(v, SumOp{}); }
__device__ inline float block_max(float v) { return block_reduce(v, MaxOp{}); }
__device__ inline double block_sum_d(double v) { return block_reduce(v, SumOpD{}); }

}  // namespace loom::cuda
