// Note [CUDA flash attention]
// Causal attention without the (T,T) matrices (FlashAttention-2, Dao 2023, Algorithms 1
// and 2), for head sizes 32 and 64, on the tensor cores' mma.sync.m16n8k16 (bf16 in, fp32
// accumulate). Forward: a block of 4 warps takes 64 query rows of one (b, h), 16 per warp,
// and walks the key tiles of 64 up to the diagonal keeping, per row, the running max m and
// sum l of exp2(s - m) (s = q.k scale log2 e), rescaling the output accumulator when m
// grows; it writes O = acc / l in bf16 and L = m + log2 l. Backward: a block takes 64 keys
// (16 per warp) and walks the query tiles from the diagonal down, recomputing
// P = exp2(s - L); dV += P^T dO, dP = dO V^T, dS = P (dP - D) scale with D = rowsum(dO O),
// dK += dS^T Q, and dQ += dS K added atomically in fp32 (so dQ's summation order varies
// between runs). Each warp's S tile stays in registers: the accumulator layout of two
// 8-column mma tiles is the A-operand layout of one 16-deep mma, so P feeds P V directly.
// Rounding differs from the materialised path only in that P is rounded to bf16 before
// its normalisation by 1/l (forward) and recomputed from L (backward).
#include <cuda_bf16.h>

#include <cmath>

#include "loom/cuda/check.h"
#include "loom/cuda/ops.h"
#include "loom/cuda/util.cuh"

namespace loom::cuda {
namespace {

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
// zero) into shared memory [64][HD + kPad], 16 bytes a thread at a time.
template <int HD>
__device__ inline void stage_tile(__nv_bfloat16* tile, const __nv_bfloat16* base, int64_t ld, int row0, int rows) {
  for (int idx = threadIdx.x; idx < kTile * HD / 8; idx += blockDim.x) {
    const int r = idx / (HD / 8), c = (idx % (HD / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows) v = *reinterpret_cast<const uint4*>(base + int64_t(row0 + r) * ld + c);
    *reinterpret_cast<uint4*>(tile + r * (HD + kPad) + c) = v;
  }
}

// The same through cp.async (16 bytes a thread, zero-filled past `rows`), so the next tile
// loads while this one is computed on: the caller commits the group and waits for it.
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

// The B fragment (k16 x n8) of mma.m16n8k16 at rows k0.., columns n0.. of a row-major
// [k][n] tile with row stride ld: ldmatrix .trans hands lane (g, t) the pairs
// (k0 + 2t, 2t+1; n0 + g) and (k0 + 8 + 2t, 2t+1; n0 + g), the B layout.
__device__ inline void ldsm_b_trans(uint32_t& b0, uint32_t& b1, const __nv_bfloat16* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(tile + (k0 + lane % 16) * ld + n0));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}

// acc(16 x 64) += A(16 x HD, fragments) B^T where B is a row-major [64][HD + kPad] tile
// (B^T[k][n] = B[n][k]): 8 column tiles of 8.
template <int HD>
__device__ inline void mma_abt(float (&acc)[8][4], const uint32_t (&a)[HD / 16][4], const __nv_bfloat16* b) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
      const __nv_bfloat16* p = b + (n * 8 + g) * (HD + kPad) + k * 16 + 2 * t;
      mma(acc[n], a[k], ld32(p), ld32(p + 8));
    }
}

// acc(16 x HD) += P(16 x 64, as the fp32 accumulator of mma_abt) V, V a row-major
// [64][HD + kPad] tile; P is rounded to bf16 on the way.
template <int HD>
__device__ inline void mma_pv(float (&acc)[HD / 8][4], const float (&p)[8][4], const __nv_bfloat16* v) {
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const uint32_t a[4] = {pack(p[2 * k][0], p[2 * k][1]), pack(p[2 * k][2], p[2 * k][3]),
                           pack(p[2 * k + 1][0], p[2 * k + 1][1]), pack(p[2 * k + 1][2], p[2 * k + 1][3])};
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      uint32_t b0, b1;
      ldsm_b_trans(b0, b1, v, HD + kPad, k * 16, n * 8);
      mma(acc[n], a, b0, b1);
    }
  }
}

__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int HD>
__global__ void __launch_bounds__(128) flash_forward_k(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                                                       int T, int H, int KV, float scale_log2) {
  __shared__ __align__(16) __nv_bfloat16 kbuf[2][kTile * (HD + kPad)];
  __shared__ __align__(16) __nv_bfloat16 vbuf[2][kTile * (HD + kPad)];
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // the longest rows first
  const int bh = blockIdx.y, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t ld = int64_t(H + 2 * KV) * HD;
  const __nv_bfloat16* base = qkv + int64_t(b) * T * ld;
  const int q0 = qt * kTile + warp * 16;
  uint32_t qf[HD / 16][4];
  load_a<HD>(qf, base + h * HD, ld, q0, T);
  float o[HD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const __nv_bfloat16 *kbase = base + (H + kvh) * HD, *vbase = base + (H + KV + kvh) * HD;
  stage_tile_async<HD>(kbuf[0], kbase, ld, 0, T);
  stage_tile_async<HD>(vbuf[0], vbase, ld, 0, T);
  async_commit();
  for (int kt = 0; kt <= qt; kt++) {
    const __nv_bfloat16 *ks = kbuf[kt & 1], *vs = vbuf[kt & 1];
    if (kt < qt) {  // the buffer it fills was last read before the previous iteration's end barrier
      stage_tile_async<HD>(kbuf[(kt + 1) & 1], kbase, ld, (kt + 1) * kTile, T);
      stage_tile_async<HD>(vbuf[(kt + 1) & 1], vbase, ld, (kt + 1) * kTile, T);
    }
    async_commit();
    async_wait_all_but_one();
    __syncthreads();
    float s[8][4] = {};
    mma_abt<HD>(s, qf, ks);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int row = q0 + g + (i >= 2 ? 8 : 0), key = kt * kTile + n * 8 + 2 * t + (i & 1);
        s[n][i] = key <= row ? s[n][i] * scale_log2 : -INFINITY;
        mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
      }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float mnew = fmaxf(m[r], quad_max(mx[r]));
      const float corr = mnew == -INFINITY ? 1.0f : exp2f(m[r] - mnew);
      m[r] = mnew;
      l[r] *= corr;
#pragma unroll
      for (int n = 0; n < HD / 8; n++) o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const float mr = m[i / 2];
        s[n][i] = mr == -INFINITY ? 0.0f : exp2f(s[n][i] - mr);
        l[i / 2] += s[n][i];
      }
    mma_pv<HD>(o, s, vs);
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = q0 + g + 8 * r;
    const float lr = quad_sum(l[r]);
    if (row >= T) continue;
    const float inv = 1.0f / lr;
    __nv_bfloat16* dst = out + (int64_t(b) * T + row) * H * HD + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *reinterpret_cast<__nv_bfloat162*>(dst + n * 8 + 2 * t) =
          __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    if (t == 0) lse[int64_t(bh) * T + row] = m[r] + log2f(lr);
  }
}

// D[b,h,t] = sum_d dO[b,t,h,d] O[b,t,h,d]; one warp per (b, t, h).
__global__ void flash_delta_k(float* delta, const __nv_bfloat16* dout, const __nv_bfloat16* out, int64_t rows, int T,
                              int H, int HD) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  float s = 0;
  for (int d = lane; d < HD; d += 32) s += __bfloat162float(dout[r * HD + d]) * __bfloat162float(out[r * HD + d]);
  s = warp_sum(s);
  const int64_t bt = r / H, h = r % H, b = bt / T, t = bt % T;
  if (lane == 0) delta[(b * H + h) * T + t] = s;
}

// Dynamic shared memory of the backward: Q, dO and K tiles and dS [64 queries][64 keys]
// (bf16), and L, D of the query tile (fp32).
template <int HD>
constexpr int backward_smem() {
  return (5 * kTile * (HD + kPad) + kTile * (kTile + kPad)) * 2 + 4 * kTile * 4;
}

template <int HD>
__global__ void __launch_bounds__(128) flash_backward_k(float* dq, float* dk, float* dv, const __nv_bfloat16* qkv,
                                                        const __nv_bfloat16* dout, const float* lse,
                                                        const float* delta, int T, int H, int KV, float scale_log2,
                                                        float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  // Q, dO, L and D double-buffered: [2][...] each.
  __nv_bfloat16* qbuf = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* dobuf = qbuf + 2 * kTile * (HD + kPad);
  __nv_bfloat16* ks = dobuf + 2 * kTile * (HD + kPad);
  __nv_bfloat16* dss = ks + kTile * (HD + kPad);
  float* lbuf = reinterpret_cast<float*>(dss + kTile * (kTile + kPad));
  float* dbuf = lbuf + 2 * kTile;
  const int kt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t ld = int64_t(H + 2 * KV) * HD, ldo = int64_t(H) * HD;
  const __nv_bfloat16* base = qkv + int64_t(b) * T * ld;
  const __nv_bfloat16* obase = dout + int64_t(b) * T * ldo + h * HD;
  const int k0 = kt * kTile + warp * 16;
  uint32_t kf[HD / 16][4], vf[HD / 16][4];
  load_a<HD>(kf, base + (H + kvh) * HD, ld, k0, T);
  load_a<HD>(vf, base + (H + KV + kvh) * HD, ld, k0, T);
  stage_tile<HD>(ks, base + (H + kvh) * HD, ld, kt * kTile, T);
  float dkacc[HD / 8][4] = {}, dvacc[HD / 8][4] = {};
  const int tiles = (T + kTile - 1) / kTile;
  const float *lrow = lse + int64_t(bh) * T, *drow = delta + int64_t(bh) * T;
  auto prefetch = [&](int qt, int b) {
    stage_tile_async<HD>(qbuf + b * kTile * (HD + kPad), base + h * HD, ld, qt * kTile, T);
    stage_tile_async<HD>(dobuf + b * kTile * (HD + kPad), obase, ldo, qt * kTile, T);
    stage_row_async(lbuf + b * kTile, lrow, qt * kTile, T);
    stage_row_async(dbuf + b * kTile, drow, qt * kTile, T);
  };
  prefetch(kt, 0);
  async_commit();
  for (int qt = kt; qt < tiles; qt++) {
    const int b = (qt - kt) & 1;
    const __nv_bfloat16 *qs = qbuf + b * kTile * (HD + kPad), *dos = dobuf + b * kTile * (HD + kPad);
    const float *ls = lbuf + b * kTile, *ds = dbuf + b * kTile;
    if (qt + 1 < tiles) prefetch(qt + 1, b ^ 1);  // b ^ 1 was last read before the previous dS barrier
    async_commit();
    async_wait_all_but_one();
    __syncthreads();
    float p[8][4] = {}, dp[8][4] = {};
    mma_abt<HD>(p, kf, qs);    // S^T (keys x queries)
    mma_abt<HD>(dp, vf, dos);  // dP^T = V dO^T
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int key = k0 + g + (i >= 2 ? 8 : 0), qi = n * 8 + 2 * t + (i & 1), q = qt * kTile + qi;
        const bool live = q >= key && q < T;
        p[n][i] = live ? exp2f(p[n][i] * scale_log2 - ls[qi]) : 0.0f;
        dp[n][i] = p[n][i] * (dp[n][i] - ds[qi]) * scale;  // dS^T
      }
    mma_pv<HD>(dvacc, p, dos);  // dV += P^T dO
    mma_pv<HD>(dkacc, dp, qs);   // dK += dS^T Q
    // dS as [query][key] in shared memory for dQ = dS K (all four warps' keys).
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int kr = warp * 16 + g + (i >= 2 ? 8 : 0), qi = n * 8 + 2 * t + (i & 1);
        dss[qi * (kTile + kPad) + kr] = __float2bfloat16_rn(dp[n][i]);
      }
    __syncthreads();
    uint32_t sf[4][4];  // this warp's 16 query rows of dS over the 64 keys
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const __nv_bfloat16* r0 = dss + (warp * 16 + g) * (kTile + kPad) + k * 16 + 2 * t;
      const __nv_bfloat16* r1 = r0 + 8 * (kTile + kPad);
      sf[k][0] = ld32(r0), sf[k][1] = ld32(r1), sf[k][2] = ld32(r0 + 8), sf[k][3] = ld32(r1 + 8);
    }
    float dqacc[HD / 8][4] = {};
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
      for (int n = 0; n < HD / 8; n++) {
        uint32_t b0, b1;
        ldsm_b_trans(b0, b1, ks, HD + kPad, k * 16, n * 8);
        mma(dqacc[n], sf[k], b0, b1);
      }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int q = qt * kTile + warp * 16 + g + 8 * r;
      if (q >= T) continue;
      float* dst = dq + (int64_t(bh) * T + q) * HD;
#pragma unroll
      for (int n = 0; n < HD / 8; n++)  // float2 atomics: compute capability 9.x
        atomicAdd(reinterpret_cast<float2*>(dst + n * 8 + 2 * t), make_float2(dqacc[n][2 * r], dqacc[n][2 * r + 1]));
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = k0 + g + 8 * r;
    if (key >= T) continue;
    float* dkr = dk + (int64_t(bh) * T + key) * HD;
    float* dvr = dv + (int64_t(bh) * T + key) * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      dkr[n * 8 + 2 * t] = dkacc[n][2 * r], dkr[n * 8 + 2 * t + 1] = dkacc[n][2 * r + 1];
      dvr[n * 8 + 2 * t] = dvacc[n][2 * r], dvr[n * 8 + 2 * t + 1] = dvacc[n][2 * r + 1];
    }
  }
}

// dqkv (B,T,(H+2KV)*hd) from fp32 dq, dk, dv (B,H,T,hd); a key/value head sums its group.
__global__ void flash_merge_k(__nv_bfloat16* dqkv, const float* dq, const float* dk, const float* dv, int T, int H,
                              int KV, int HD, int64_t n) {
  const int64_t Q = int64_t(H + 2 * KV) * HD, group = H / KV;
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const int64_t col = i % Q, row = i / Q, b = row / T, t = row % T, head = col / HD, d = col % HD;
    float s;
    if (head < H) {
      s = dq[((b * H + head) * T + t) * HD + d];
    } else {
      const bool is_k = head < H + KV;
      const int64_t kvh = is_k ? head - H : head - H - KV;
      const float* src = is_k ? dk : dv;
      s = 0;
      for (int64_t gq = 0; gq < group; gq++) s += src[((b * H + kvh * group + gq) * T + t) * HD + d];
    }
    dqkv[i] = __float2bfloat16_rn(s);
  }
}

template <int HD>
void forward_hd(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, cudaStream_t s) {
  const dim3 grid(unsigned((T + kTile - 1) / kTile), unsigned(B * H));
  const float scale_log2 = float(1.4426950408889634 / std::sqrt(double(HD)));
  flash_forward_k<HD><<<grid, 128, 0, s>>>(nv(out), lse, nv(qkv), int(T), int(H), int(KV), scale_log2);
  LOOM_CUDA_LAUNCHED("flash_forward");
}

template <int HD>
void backward_hd(float* dq, float* dk, float* dv, const bf16* qkv, const bf16* dout, const float* lse,
                 const float* delta, int64_t B, int64_t T, int64_t H, int64_t KV, cudaStream_t s) {
  constexpr int smem = backward_smem<HD>();
  static bool raised = false;  // the dynamic shared-memory limit, raised once per process
  if (!raised) {
    LOOM_CUDA_OK(cudaFuncSetAttribute(flash_backward_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    raised = true;
  }
  const dim3 grid(unsigned((T + kTile - 1) / kTile), unsigned(B * H));
  const double sc = 1.0 / std::sqrt(double(HD));
  flash_backward_k<HD><<<grid, 128, smem, s>>>(dq, dk, dv, nv(qkv), nv(dout), lse, delta, int(T), int(H), int(KV),
                                              float(sc * 1.4426950408889634), float(sc));
  LOOM_CUDA_LAUNCHED("flash_backward");
}

}  // namespace

bool flash_supported(int64_t hd) { return hd == 32 || hd == 64; }

void flash_forward(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   cudaStream_t s) {
  if (hd == 32) forward_hd<32>(out, lse, qkv, B, T, H, KV, s);
  else forward_hd<64>(out, lse, qkv, B, T, H, KV, s);
}

void flash_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                    FlashScratch scratch, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t s) {
  const int64_t rows = B * T * H;
  flash_delta_k<<<unsigned((rows + 7) / 8), 256, 0, s>>>(scratch.delta, nv(dout), nv(out), rows, int(T), int(H),
                                                         int(hd));
  LOOM_CUDA_LAUNCHED("flash_delta");
  LOOM_CUDA_OK(cudaMemsetAsync(scratch.dq, 0, size_t(rows * hd) * 4, s));
  if (hd == 32) backward_hd<32>(scratch.dq, scratch.dk, scratch.dv, qkv, dout, lse, scratch.delta, B, T, H, KV, s);
  else backward_hd<64>(scratch.dq, scratch.dk, scratch.dv, qkv, dout, lse, scratch.delta, B, T, H, KV, s);
  const int64_t n = B * T * (H + 2 * KV) * hd;
  flash_merge_k<<<blocks_for(n), kThreads, 0, s>>>(nv(dqkv), scratch.dq, scratch.dk, scratch.dv, int(T), int(H),
                                                   int(KV), int(hd), n);
  LOOM_CUDA_LAUNCHED("flash_merge");
}

}  // namespace loom::cuda
