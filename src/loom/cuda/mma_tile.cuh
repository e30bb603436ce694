// Building blocks of Note [CUDA flash attention] (flash.cu): warp-level tiles on the tensor
// cores' mma.sync.m16n8k16 (bf16 in, fp32 accumulate), fragments through ldmatrix, and
// (64, HD) tiles staged into shared memory by cp.async. Shapes: a warp owns 16 rows; a
// staged tile is [64][HD + kPad] bf16, row-major.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace loom::cuda::mma_tile {

constexpr int kTile = 64;  // query and key rows per block
constexpr int kPad = 8;    // bf16 padding per shared-memory row: conflict-free fragment loads

__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ inline uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ inline uint32_t ld32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A-operand fragments of 16 rows (row0.. row0+15 of a row-major matrix with row stride ld,
// rows >= rows_valid read as 0) over HD columns: frag[k][0..3] for k-step k (mma.m16n8k16
// A layout: (g, 2t), (g+8, 2t), (g, 2t+8), (g+8, 2t+8), g = lane/4, t = lane%4).
template <int HD>
__device__ inline void load_a(uint32_t (&frag)[HD / 16][4], const __nv_bfloat16* base, int64_t ld, int row0,
                              int rows_valid) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = row0 + g, r1 = r0 + 8;
#pragma unroll
  for (int k = 0; k < HD / 16; k++) {
    const int c = k * 16 + 2 * t;
    frag[k][0] = r0 < rows_valid ? ld32(base + r0 * ld + c) : 0u;
    frag[k][1] = r1 < rows_valid ? ld32(base + r1 * ld + c) : 0u;
    frag[k][2] = r0 < rows_valid ? ld32(base + r0 * ld + c + 8) : 0u;
    frag[k][3] = r1 < rows_valid ? ld32(base + r1 * ld + c + 8) : 0u;
  }
}

// Copies a (64, HD) tile of rows row0.. (stride ld in global memory; rows past `rows` are
// zero) into shared memory [64][HD + kPad] through cp.async (16 bytes a thread), so the
// next tile loads while this one is computed on: the caller commits the group and waits.
template <int HD>
__device__ inline void stage_tile_async(__nv_bfloat16* tile, const __nv_bfloat16* base, int64_t ld, int row0,
                                        int rows) {
  for (int idx = threadIdx.x; idx < kTile * HD / 8; idx += blockDim.x) {
    const int r = idx / (HD / 8), c = (idx % (HD / 8)) * 8;
    const bool valid = row0 + r < rows;
    const __nv_bfloat16* src = base + (valid ? int64_t(row0 + r) * ld + c : 0);
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(tile + r * (HD + kPad) + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
  }
}
// 64 floats of a row statistic (rows past `rows` zero), 4 bytes a thread.
__device__ inline void stage_row_async(float* dst, const float* src, int row0, int rows) {
  if (threadIdx.x >= kTile) return;
  const bool valid = row0 + int(threadIdx.x) < rows;
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst + threadIdx.x));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src + (valid ? row0 + threadIdx.x : 0)),
               "r"(valid ? 4 : 0));
}
__device__ inline void async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ inline void async_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n"); }

// ldmatrix of four 8x8 bf16 matrices: lanes 8j..8j+7 name the rows of matrix j, and lane
// (g, t) receives in r[j] its row g, columns 2t, 2t+1 (.trans: row 2t, 2t+1 of column g).
__device__ inline void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldsm_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// acc(16 x 64) += A(16 x HD, fragments) B^T where B is a row-major [64][HD + kPad] tile
// (B^T[k][n] = B[n][k]). The B fragment of column tile n, k-step k is B[8n + g][16k + 2t
// (+1)] and B[8n + g][16k + 8 + 2t (+1)]: one ldmatrix over rows 8n.., columns 32c + 8j
// (j = 0..3) gives both fragments of k-steps 2c and 2c + 1.
template <int HD, int MT>
__device__ inline void mma_abt_m(float (&acc)[MT][8][4], const uint32_t (&a)[MT][HD / 16][4],
                                 const __nv_bfloat16* b) {
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* p = b + (lane % 8) * (HD + kPad) + (lane / 8) * 8;
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int c = 0; c < HD / 32; c++) {
      uint32_t r[4];
      ldsm_x4(r, p + n * 8 * (HD + kPad) + c * 32);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {  // each B fragment serves the warp's MT row tiles
        mma(acc[mt][n], a[mt][2 * c], r[0], r[1]);
        mma(acc[mt][n], a[mt][2 * c + 1], r[2], r[3]);
      }
    }
}
template <int HD>
__device__ inline void mma_abt(float (&acc)[8][4], const uint32_t (&a)[HD / 16][4], const __nv_bfloat16* b) {
  mma_abt_m<HD, 1>(reinterpret_cast<float(&)[1][8][4]>(acc), reinterpret_cast<const uint32_t(&)[1][HD / 16][4]>(a), b);
}

// mma_abt with A's 16 rows in shared memory (row-major, stride HD + kPad, a pointing at
// the first): per pair of k-steps, two ldmatrix give A's fragments (lanes 0-15 name rows
// 0-15 at column 0 of the step, lanes 16-31 the same rows at column 8: matrices (rows
// 0-7, 8-15) x (columns 0-7, 8-15), the mma A layout), so only 8 registers of A are live.
template <int HD>
__device__ inline void mma_abt_sa(float (&acc)[8][4], const __nv_bfloat16* a, const __nv_bfloat16* b) {
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* pa = a + (lane % 16) * (HD + kPad) + (lane / 16) * 8;
  const __nv_bfloat16* pb = b + (lane % 8) * (HD + kPad) + (lane / 8) * 8;
#pragma unroll
  for (int c = 0; c < HD / 32; c++) {
    uint32_t a0[4], a1[4];
    ldsm_x4(a0, pa + c * 32);
    ldsm_x4(a1, pa + c * 32 + 16);
#pragma unroll
    for (int n = 0; n < 8; n++) {
      uint32_t r[4];
      ldsm_x4(r, pb + n * 8 * (HD + kPad) + c * 32);
      mma(acc[n], a0, r[0], r[1]);
      mma(acc[n], a1, r[2], r[3]);
    }
  }
}

// acc(16 x HD) += P(16 x 64, as the fp32 accumulator of mma_abt) V, V a row-major
// [64][HD + kPad] tile; P is rounded to bf16 on the way. The B fragment of column tile n,
// k-step k is V[16k + 2t (+1)][8n + g] and V[16k + 8 + 2t (+1)][8n + g]: one transposing
// ldmatrix over rows 16k + (lane % 16), columns 16c + 8 (lane / 16) gives both fragments of
// column tiles 2c and 2c + 1.
template <int HD, int MT>
__device__ inline void mma_pv_m(float (&acc)[MT][HD / 8][4], const float (&p)[MT][8][4], const __nv_bfloat16* v) {
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* base = v + (lane % 16) * (HD + kPad) + (lane / 16) * 8;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      a[mt][0] = pack(p[mt][2 * k][0], p[mt][2 * k][1]), a[mt][1] = pack(p[mt][2 * k][2], p[mt][2 * k][3]);
      a[mt][2] = pack(p[mt][2 * k + 1][0], p[mt][2 * k + 1][1]), a[mt][3] = pack(p[mt][2 * k + 1][2], p[mt][2 * k + 1][3]);
    }
#pragma unroll
    for (int c = 0; c < HD / 16; c++) {
      uint32_t r[4];
      ldsm_x4_trans(r, base + k * 16 * (HD + kPad) + c * 16);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma(acc[mt][2 * c], a[mt], r[0], r[1]);
        mma(acc[mt][2 * c + 1], a[mt], r[2], r[3]);
      }
    }
  }
}
template <int HD>
__device__ inline void mma_pv(float (&acc)[HD / 8][4], const float (&p)[8][4], const __nv_bfloat16* v) {
  mma_pv_m<HD, 1>(reinterpret_cast<float(&)[1][HD / 8][4]>(acc), reinterpret_cast<const float(&)[1][8][4]>(p), v);
}

__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Row (within the 16-row warp tile: g or g + 8) and column (within the 64-column tile) of
// accumulator element i of column tile n.
__device__ inline int acc_row(int i) { return (threadIdx.x % 32) / 4 + (i >= 2 ? 8 : 0); }
__device__ inline int acc_col(int n, int i) { return n * 8 + 2 * (threadIdx.x % 4) + (i & 1); }

}  // namespace loom::cuda::mma_tile
