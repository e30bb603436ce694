// Note [CUDA flash attention]
// Causal attention without the (T,T) matrices (FlashAttention-2, Dao 2023, Algorithms 1
// and 2), for head sizes 32, 64 and 128, on the tensor cores' mma.sync.m16n8k16 (bf16 in,
// fp32 accumulate). Forward: a block of 4 warps takes 128 query rows of one (b, h), 32 per
// warp (two row tiles sharing every B fragment: 1.96 ms a GPT-2 step on an H200 against
// 2.15 with one; head size 128 takes one row tile, 64 rows a block, as its accumulators
// alone fill 64 registers a row tile), and walks the key tiles of 64 up to the diagonal keeping, per row, the
// running max m and sum l of exp2(s - m) (s = q.k scale log2 e, one fma from the raw q.k),
// rescaling the output accumulator when m grows; it writes O = acc / l in bf16 and
// L = m + log2 l. Only tiles that reach past a warp's first row are masked: every earlier
// key precedes every row.
// Backward, recomputing P = exp2(s - L) and dS = P (dP - D) scale with dP = dO V^T and
// D = rowsum(dO O), in two kernels instead of Algorithm 2's one with atomic dQ updates:
// a block of 64 keys walks the query tiles from the diagonal down for dV += P^T dO and
// dK += dS^T Q; a block of 64 queries walks the key tiles up to the diagonal for
// dQ += dS K. The second recomputes S and dP (7 tile GEMMs instead of 5) but no fp32 dQ
// is summed atomically through L2, nothing is staged through shared memory between warps,
// and every sum has a fixed order, so the gradients are the same bits run after run. Each
// warp's S tile stays in registers: the accumulator layout of two 8-column mma tiles is
// the A-operand layout of one 16-deep mma, so P (or dS) feeds the next mma directly; B
// operands come from shared memory by ldmatrix, four 8x8 matrices per instruction.
// Head size 128 in the backward: the block's own K and V tiles (dK/dV kernel) or Q and dO
// tiles (dQ kernel) stay in shared memory and their A fragments are read by ldmatrix per
// k-step (mma_abt_sa), since dK, dV, S^T and dP^T alone hold 192 fp32 registers a thread. Tiles live in dynamic shared memory (over
// 48 KB at head size 128: up to 104 KB a block, of the H100/H200's 227).
// Rounding differs from the materialised path only in that P is rounded to bf16 before
// its normalisation by 1/l (forward) and recomputed from L (backward).
#include <cuda_bf16.h>

#include <cmath>

#include "loom/cuda/check.h"
#include "loom/cuda/mma_tile.cuh"
#include "loom/cuda/ops.h"
#include "loom/cuda/util.cuh"

namespace loom::cuda {
namespace {

using namespace mma_tile;

template <int HD>
constexpr int kTileElems = kTile * (HD + kPad);  // one staged (64, HD) tile
// Query row tiles of 16 per forward warp (see the Note).
template <int HD>
constexpr int kForwardMT = HD >= 128 ? 1 : 2;
// Whether the backward kernels read the A fragments of their block's own rows (K and V;
// Q and dO) from shared memory rather than holding them in registers (see the Note).
template <int HD>
constexpr bool kAFromSmem = HD >= 128;

// The block's dynamic shared memory (its size set at launch: kForwardBytes etc. below).
__device__ inline __nv_bfloat16* smem_bf16() {
  extern __shared__ __align__(16) unsigned char flash_smem[];
  return reinterpret_cast<__nv_bfloat16*>(flash_smem);
}

// One key tile of the online softmax for a 16-row tile (FlashAttention-2 Algorithm 1, lines
// 9-10): the row max m (log2 units) grows to cover the tile's scores s, the sum l and the
// output accumulator o are rescaled by exp2(m_old - m_new), and s becomes exp2(s - m).
template <int HD>
__device__ inline void online_softmax(float (&s)[8][4], float (&m)[2], float (&l)[2], float (&o)[HD / 8][4],
                                      float scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float mnew = fmaxf(m[r], quad_max(mx[r]) * scale_log2);
    const float corr = exp2f(m[r] - mnew);
    m[r] = mnew;
    l[r] *= corr;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
  }
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      s[n][i] = exp2f(fmaf(s[n][i], scale_log2, -m[i / 2]));  // masked: exp2(-inf) = 0
      l[i / 2] += s[n][i];
    }
}

// The forward's block: 4 warps of MT row tiles of 16 queries each (64 MT queries), walking
// the key tiles of 64 up to the block's last row; a warp skips a tile whose keys all
// follow its rows. With MT = 2 each B fragment loaded from shared memory feeds two mma
// (FlashAttention-2's 128-query blocks for these head sizes), halving the ldmatrix traffic
// per product and the key/value tiles staged per query.
template <int HD, int MT>
__global__ void __launch_bounds__(128) flash_forward_k(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                                                       int T, int H, int KV, float scale_log2) {
  constexpr int kRows = 64 * MT, E = kTileElems<HD>;  // query rows per block
  __nv_bfloat16 *const kbuf = smem_bf16(), *const vbuf = kbuf + 2 * E;  // [2][E] each
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // the longest rows first
  const int bh = blockIdx.y, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t ld = int64_t(H + 2 * KV) * HD;
  const __nv_bfloat16* base = qkv + int64_t(b) * T * ld;
  const int q0 = qt * kRows + warp * 16 * MT;  // the warp's first query; row tile mt starts at q0 + 16 mt
  uint32_t qf[MT][HD / 16][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) load_a<HD>(qf[mt], base + h * HD, ld, q0 + 16 * mt, T);
  float o[MT][HD / 8][4] = {};
  // m: the running max of s in log2 units. Every row sees key 0 in the first tile, so m
  // is finite from then on and exp2(m_old - m_new) is 0 only for the first tile (a later
  // tile whose keys all follow a row leaves its m, and adds exp2(-inf) = 0).
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const __nv_bfloat16 *kbase = base + (H + kvh) * HD, *vbase = base + (H + KV + kvh) * HD;
  const int last = (min(T, (qt + 1) * kRows) - 1) / kTile;  // the last key tile the block's rows see
  stage_tile_async<HD>(kbuf, kbase, ld, 0, T);
  stage_tile_async<HD>(vbuf, vbase, ld, 0, T);
  async_commit();
  for (int kt = 0; kt <= last; kt++) {
    const __nv_bfloat16 *ks = kbuf + (kt & 1) * E, *vs = vbuf + (kt & 1) * E;
    if (kt < last) {  // the buffer it fills was last read before the previous iteration's end barrier
      stage_tile_async<HD>(kbuf + ((kt + 1) & 1) * E, kbase, ld, (kt + 1) * kTile, T);
      stage_tile_async<HD>(vbuf + ((kt + 1) & 1) * E, vbase, ld, (kt + 1) * kTile, T);
    }
    async_commit();
    async_wait_all_but_one();
    __syncthreads();
    if (kt * kTile <= q0 + 16 * MT - 1) {  // (warp-uniform) some key of the tile precedes a row of the warp
      float s[MT][8][4] = {};
      mma_abt_m<HD, MT>(s, qf, ks);
      if (kt * kTile + kTile - 1 > q0) {  // keys past some row of the warp: masked
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int n = 0; n < 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
              if (kt * kTile + acc_col(n, i) > q0 + 16 * mt + acc_row(i)) s[mt][n][i] = -INFINITY;
      }
#pragma unroll
      for (int mt = 0; mt < MT; mt++) online_softmax<HD>(s[mt], m[mt], l[mt], o[mt], scale_log2);
      mma_pv_m<HD, MT>(o, s, vs);
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = q0 + 16 * mt + g + 8 * r;
      const float lr = quad_sum(l[mt][r]);
      if (row >= T) continue;
      const float inv = 1.0f / lr;
      __nv_bfloat16* dst = out + (int64_t(b) * T + row) * H * HD + h * HD;
#pragma unroll
      for (int n = 0; n < HD / 8; n++)
        *reinterpret_cast<__nv_bfloat162*>(dst + n * 8 + 2 * t) =
            __floats2bfloat162_rn(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      if (t == 0) lse[int64_t(bh) * T + row] = m[mt][r] + log2f(lr);
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

// The dK/dV kernel's result for the warp's 16 keys k0..: bf16 into dqkv's key/value columns
// (direct, when every query head has its own key/value head), else fp32 per query head
// into dk, dv (B,H,T,hd).
template <int HD>
__device__ inline void store_dk_dv(const float (&dkacc)[HD / 8][4], const float (&dvacc)[HD / 8][4], float* dk,
                                   float* dv, __nv_bfloat16* direct, int k0, int b, int bh, int kvh, int T, int H,
                                   int KV) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t ld = int64_t(H + 2 * KV) * HD;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = k0 + g + 8 * r;
    if (key >= T) continue;
    if (direct) {
      __nv_bfloat16* row = direct + (int64_t(b) * T + key) * ld;
#pragma unroll
      for (int n = 0; n < HD / 8; n++) {
        const int c = n * 8 + 2 * t;
        *reinterpret_cast<__nv_bfloat162*>(row + (H + kvh) * HD + c) =
            __floats2bfloat162_rn(dkacc[n][2 * r], dkacc[n][2 * r + 1]);
        *reinterpret_cast<__nv_bfloat162*>(row + (H + KV + kvh) * HD + c) =
            __floats2bfloat162_rn(dvacc[n][2 * r], dvacc[n][2 * r + 1]);
      }
      continue;
    }
    float2* dkr = reinterpret_cast<float2*>(dk + (int64_t(bh) * T + key) * HD);
    float2* dvr = reinterpret_cast<float2*>(dv + (int64_t(bh) * T + key) * HD);
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      dkr[n * 4 + t] = make_float2(dkacc[n][2 * r], dkacc[n][2 * r + 1]);
      dvr[n * 4 + t] = make_float2(dvacc[n][2 * r], dvacc[n][2 * r + 1]);
    }
  }
}

// dK and dV of 64 keys (16 per warp) of one (b, h): the query tiles from the diagonal down,
// Q, dO, L and D double-buffered; K and V in registers, or at head size 128 staged once in
// shared memory (kAFromSmem). Writes bf16 into dqkv's key/value columns when every
// query head has its own key/value head (direct), else fp32 per query head into dk, dv
// (B,H,T,hd), summed over each group by flash_merge_kv_k.
template <int HD>
__global__ void __launch_bounds__(128) flash_backward_kv_k(float* dk, float* dv, __nv_bfloat16* direct,
                                                           const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                                           const float* lse, const float* delta, int T, int H, int KV,
                                                           float scale_log2, float scale) {
  constexpr int E = kTileElems<HD>;
  constexpr bool kSmemKv = kAFromSmem<HD>;
  // [2][E] each of Q and dO, then (kSmemKv) the block's K and V tiles, then L and D [2][64].
  __nv_bfloat16 *const qbuf = smem_bf16(), *const dobuf = qbuf + 2 * E, *const kvblk = dobuf + 2 * E;
  float* const lbuf = reinterpret_cast<float*>(kvblk + (kSmemKv ? 2 * E : 0));
  float* const dbuf = lbuf + 2 * kTile;
  const int kt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, t = lane % 4;
  const int64_t ld = int64_t(H + 2 * KV) * HD, ldo = int64_t(H) * HD;
  const __nv_bfloat16* base = qkv + int64_t(b) * T * ld;
  const __nv_bfloat16* obase = dout + int64_t(b) * T * ldo + h * HD;
  const int k0 = kt * kTile + warp * 16;
  uint32_t kf[HD / 16][4], vf[HD / 16][4];  // (unused, so not allocated, where kSmemKv)
  if constexpr (kSmemKv) {  // joins the first prefetch's group
    stage_tile_async<HD>(kvblk, base + (H + kvh) * HD, ld, kt * kTile, T);
    stage_tile_async<HD>(kvblk + E, base + (H + KV + kvh) * HD, ld, kt * kTile, T);
  } else {
    load_a<HD>(kf, base + (H + kvh) * HD, ld, k0, T);
    load_a<HD>(vf, base + (H + KV + kvh) * HD, ld, k0, T);
  }
  float dkacc[HD / 8][4] = {}, dvacc[HD / 8][4] = {};
  const int tiles = (T + kTile - 1) / kTile;
  const float *lrow = lse + int64_t(bh) * T, *drow = delta + int64_t(bh) * T;
  auto prefetch = [&](int qt, int buf) {
    stage_tile_async<HD>(qbuf + buf * E, base + h * HD, ld, qt * kTile, T);
    stage_tile_async<HD>(dobuf + buf * E, obase, ldo, qt * kTile, T);
    stage_row_async(lbuf + buf * kTile, lrow, qt * kTile, T);
    stage_row_async(dbuf + buf * kTile, drow, qt * kTile, T);
  };
  prefetch(kt, 0);
  async_commit();
  for (int qt = kt; qt < tiles; qt++) {
    const int buf = (qt - kt) & 1;
    const __nv_bfloat16 *qs = qbuf + buf * E, *dos = dobuf + buf * E;
    if (qt + 1 < tiles) prefetch(qt + 1, buf ^ 1);  // buf ^ 1 was last read before the previous end barrier
    async_commit();
    async_wait_all_but_one();
    __syncthreads();
    float p[8][4] = {}, dp[8][4] = {};
    if constexpr (kSmemKv) {
      mma_abt_sa<HD>(p, kvblk + warp * 16 * (HD + kPad), qs);        // S^T (keys x queries)
      mma_abt_sa<HD>(dp, kvblk + E + warp * 16 * (HD + kPad), dos);  // dP^T = V dO^T
    } else {
      mma_abt<HD>(p, kf, qs);    // S^T (keys x queries)
      mma_abt<HD>(dp, vf, dos);  // dP^T = V dO^T
    }
    // Masked: queries before the key (the diagonal tile) and past T (the last tile; their
    // zero-filled Q, dO, L and D would contribute 0 anyway).
    const bool edge = qt == kt || (qt + 1) * kTile > T;
#pragma unroll
    for (int n = 0; n < 8; n++) {
      const float2 lq = *reinterpret_cast<const float2*>(lbuf + buf * kTile + n * 8 + 2 * t);
      const float2 dq = *reinterpret_cast<const float2*>(dbuf + buf * kTile + n * 8 + 2 * t);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int q = qt * kTile + acc_col(n, i), key = k0 + acc_row(i);
        float pv = exp2f(fmaf(p[n][i], scale_log2, -((i & 1) ? lq.y : lq.x)));
        if (edge && (q < key || q >= T)) pv = 0.0f;
        p[n][i] = pv;
        dp[n][i] = pv * (dp[n][i] - ((i & 1) ? dq.y : dq.x)) * scale;  // dS^T
      }
    }
    mma_pv<HD>(dvacc, p, dos);  // dV += P^T dO
    mma_pv<HD>(dkacc, dp, qs);   // dK += dS^T Q
    __syncthreads();
  }
  store_dk_dv<HD>(dkacc, dvacc, dk, dv, direct, k0, b, bh, kvh, T, H, KV);
}

// dQ of 64 queries (16 per warp) of one (b, h): the key tiles up to the diagonal, K and V
// double-buffered; written in bf16 into dqkv's query columns. Q and dO in registers, or at
// head size 128 staged once in shared memory (kAFromSmem).
template <int HD>
__global__ void __launch_bounds__(128) flash_backward_q_k(__nv_bfloat16* dqkv, const __nv_bfloat16* qkv,
                                                          const __nv_bfloat16* dout, const float* lse,
                                                          const float* delta, int T, int H, int KV, float scale_log2,
                                                          float scale) {
  constexpr int E = kTileElems<HD>;
  constexpr bool kSmemQ = kAFromSmem<HD>;
  // [2][E] each of K and V, then (kSmemQ) the block's Q and dO tiles.
  __nv_bfloat16 *const kbuf = smem_bf16(), *const vbuf = kbuf + 2 * E, *const qblk = vbuf + 2 * E;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // the longest rows first
  const int bh = blockIdx.y, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t ld = int64_t(H + 2 * KV) * HD, ldo = int64_t(H) * HD;
  const __nv_bfloat16* base = qkv + int64_t(b) * T * ld;
  const int q0 = qt * kTile + warp * 16;
  uint32_t qf[HD / 16][4], dof[HD / 16][4];  // (unused, so not allocated, where kSmemQ)
  if constexpr (kSmemQ) {  // joins the first K/V group
    stage_tile_async<HD>(qblk, base + h * HD, ld, qt * kTile, T);
    stage_tile_async<HD>(qblk + E, dout + int64_t(b) * T * ldo + h * HD, ldo, qt * kTile, T);
  } else {
    load_a<HD>(qf, base + h * HD, ld, q0, T);
    load_a<HD>(dof, dout + int64_t(b) * T * ldo + h * HD, ldo, q0, T);
  }
  float lr[2], dr[2];  // L and D of rows q0 + g and q0 + g + 8 (0 past T: those rows are not written)
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = q0 + g + 8 * r;
    lr[r] = row < T ? lse[int64_t(bh) * T + row] : 0.0f;
    dr[r] = row < T ? delta[int64_t(bh) * T + row] : 0.0f;
  }
  float dqacc[HD / 8][4] = {};
  const __nv_bfloat16 *kbase = base + (H + kvh) * HD, *vbase = base + (H + KV + kvh) * HD;
  stage_tile_async<HD>(kbuf, kbase, ld, 0, T);
  stage_tile_async<HD>(vbuf, vbase, ld, 0, T);
  async_commit();
  for (int kt = 0; kt <= qt; kt++) {
    const __nv_bfloat16 *ks = kbuf + (kt & 1) * E, *vs = vbuf + (kt & 1) * E;
    if (kt < qt) {
      stage_tile_async<HD>(kbuf + ((kt + 1) & 1) * E, kbase, ld, (kt + 1) * kTile, T);
      stage_tile_async<HD>(vbuf + ((kt + 1) & 1) * E, vbase, ld, (kt + 1) * kTile, T);
    }
    async_commit();
    async_wait_all_but_one();
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
    if constexpr (kSmemQ) {
      mma_abt_sa<HD>(s, qblk + warp * 16 * (HD + kPad), ks);       // S (queries x keys)
      mma_abt_sa<HD>(dp, qblk + E + warp * 16 * (HD + kPad), vs);  // dP = dO V^T
    } else {
      mma_abt<HD>(s, qf, ks);    // S (queries x keys)
      mma_abt<HD>(dp, dof, vs);  // dP = dO V^T
    }
    const bool diagonal = kt == qt;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float pv = exp2f(fmaf(s[n][i], scale_log2, -lr[i / 2]));
        if (diagonal && acc_col(n, i) > warp * 16 + acc_row(i)) pv = 0.0f;
        s[n][i] = pv * (dp[n][i] - dr[i / 2]) * scale;  // dS
      }
    mma_pv<HD>(dqacc, s, ks);  // dQ += dS K
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = q0 + g + 8 * r;
    if (row >= T) continue;
    __nv_bfloat16* dst = dqkv + (int64_t(b) * T + row) * ld + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *reinterpret_cast<__nv_bfloat162*>(dst + n * 8 + 2 * t) =
          __floats2bfloat162_rn(dqacc[n][2 * r], dqacc[n][2 * r + 1]);
  }
}

// dqkv's key and value columns (B,T,2KV*hd of each row) from fp32 dk, dv (B,H,T,hd): a
// key/value head sums its group of query heads in order.
__global__ void flash_merge_kv_k(__nv_bfloat16* dqkv, const float* dk, const float* dv, int T, int H, int KV, int HD,
                                 int64_t n) {
  const int64_t W = int64_t(2 * KV) * HD, ld = int64_t(H + 2 * KV) * HD, group = H / KV;
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const int64_t col = i % W, row = i / W, b = row / T, t = row % T, head = col / HD, d = col % HD;
    const bool is_k = head < KV;
    const int64_t kvh = is_k ? head : head - KV;
    const float* src = is_k ? dk : dv;
    float s = 0;
    for (int64_t gq = 0; gq < group; gq++) s += src[((b * H + kvh * group + gq) * T + t) * HD + d];
    dqkv[row * ld + int64_t(H) * HD + col] = __float2bfloat16_rn(s);
  }
}

// Dynamic shared memory of each kernel (bytes), opted into past the default 48 KB once per
// kernel (cudaFuncSetAttribute; the process uses one device).
template <int HD>
constexpr int kForwardBytes = 4 * kTileElems<HD> * 2;
template <int HD>
constexpr int kBackwardKvBytes = (kAFromSmem<HD> ? 6 : 4) * kTileElems<HD> * 2 + 4 * kTile * 4;
template <int HD>
constexpr int kBackwardQBytes = (kAFromSmem<HD> ? 6 : 4) * kTileElems<HD> * 2;
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024)
    LOOM_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int HD>
void forward_hd(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, cudaStream_t s) {
  constexpr int MT = kForwardMT<HD>, rows = 64 * MT;
  static const bool opted = (allow_smem(flash_forward_k<HD, MT>, kForwardBytes<HD>), true);
  (void)opted;
  const float scale_log2 = float(1.4426950408889634 / std::sqrt(double(HD)));
  const dim3 grid(unsigned((T + rows - 1) / rows), unsigned(B * H));
  flash_forward_k<HD, MT><<<grid, 128, kForwardBytes<HD>, s>>>(nv(out), lse, nv(qkv), int(T), int(H), int(KV),
                                                                scale_log2);
  LOOM_CUDA_LAUNCHED("flash_forward");
}

template <int HD>
void backward_hd(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, FlashScratch sc, int64_t B,
                 int64_t T, int64_t H, int64_t KV, cudaStream_t s) {
  static const bool opted = (allow_smem(flash_backward_kv_k<HD>, kBackwardKvBytes<HD>),
                             allow_smem(flash_backward_q_k<HD>, kBackwardQBytes<HD>), true);
  (void)opted;
  const dim3 grid(unsigned((T + kTile - 1) / kTile), unsigned(B * H));
  const double scale = 1.0 / std::sqrt(double(HD));
  const float sl2 = float(scale * 1.4426950408889634), sc32 = float(scale);
  const bool direct = KV == H;
  flash_backward_kv_k<HD><<<grid, 128, kBackwardKvBytes<HD>, s>>>(sc.dk, sc.dv, direct ? nv(dqkv) : nullptr, nv(qkv),
                                                                   nv(dout), lse, sc.delta, int(T), int(H), int(KV),
                                                                   sl2, sc32);
  LOOM_CUDA_LAUNCHED("flash_backward_kv");
  flash_backward_q_k<HD><<<grid, 128, kBackwardQBytes<HD>, s>>>(nv(dqkv), nv(qkv), nv(dout), lse, sc.delta, int(T),
                                                                 int(H), int(KV), sl2, sc32);
  LOOM_CUDA_LAUNCHED("flash_backward_q");
  if (direct) return;
  const int64_t n = B * T * 2 * KV * HD;
  flash_merge_kv_k<<<blocks_for(n), kThreads, 0, s>>>(nv(dqkv), sc.dk, sc.dv, int(T), int(H), int(KV), HD, n);
  LOOM_CUDA_LAUNCHED("flash_merge_kv");
}

}  // namespace

bool flash_supported(int64_t hd) { return hd == 32 || hd == 64 || hd == 128; }

void flash_forward(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   cudaStream_t s) {
  if (hd == 32) forward_hd<32>(out, lse, qkv, B, T, H, KV, s);
  else if (hd == 64) forward_hd<64>(out, lse, qkv, B, T, H, KV, s);
  else forward_hd<128>(out, lse, qkv, B, T, H, KV, s);
}

void flash_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                    FlashScratch scratch, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t s) {
  const int64_t rows = B * T * H;
  flash_delta_k<<<unsigned((rows + 7) / 8), 256, 0, s>>>(scratch.delta, nv(dout), nv(out), rows, int(T), int(H),
                                                         int(hd));
  LOOM_CUDA_LAUNCHED("flash_delta");
  if (hd == 32) backward_hd<32>(dqkv, qkv, dout, lse, scratch, B, T, H, KV, s);
  else if (hd == 64) backward_hd<64>(dqkv, qkv, dout, lse, scratch, B, T, H, KV, s);
  else backward_hd<128>(dqkv, qkv, dout, lse, scratch, B, T, H, KV, s);
}

}  // namespace loom::cuda
