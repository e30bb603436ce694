// The CUDA kernel set (issue 20): host launchers over DEVICE pointers, all enqueued on
// `stream` (asynchronous unless said otherwise). Built only with -DLOOM_CUDA=ON.
//
// Note [CUDA precision]
// train.device = cuda trains in bf16 with fp32 master weights, the semantics of the CPU
// engine's train.precision = bf16 (Note [bf16 rounding points] in core/bf16.h) with two
// more rounding points: the GEMM outputs that are only read by another GEMM or by
// attention (qkv, the MLP pre-activation, the attention output, the upstream gradients of
// the linear layers) are stored in bf16 too. Where cuBLASLt has the epilogues, GPT's GELU
// runs inside the fc GEMM and its derivative inside the GEMM that makes its upstream
// gradient (cuda/blas.h), taking two of those roundings back out: GELU reads the fp32 sum,
// not its bf16 copy, and gelu'(pre) multiplies the fp32 product, not its bf16 copy (the
// stored pre-activation is the same bf16 value). The logits are stored in bf16 as well,
// as PyTorch's autocast stores its linear layers' outputs (the loss upcasts them; the CPU
// engine keeps fp32 logits): half the bytes of the classifier's largest tensor, which the
// loss reads and its gradient overwrites. The residual stream, the norm statistics, the
// attention scores and the softmax sums, the loss, the gradients and AdamW stay fp32;
// every GEMM accumulates in fp32 (cuBLAS CUBLAS_COMPUTE_32F).
// Shapes follow kernels/ops.inc: N = B*T token rows, weights (out, in) row-major.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "loom/core/bf16.h"

namespace loom::cuda {

// out[i] = bf16(in[i]).
void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s);
// out[i] = float(in[i]).
void from_bf16(float* out, const bf16* in, int64_t n, cudaStream_t s);

// out(N,C) fp32 = wte[tok] + wpe[t] (wpe may be null). Backward ADDS into dwte (atomics)
// and dwpe (a sum over the batch per position, deterministic).
void embedding_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, cudaStream_t s);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int64_t B, int64_t T,
                        int64_t C, cudaStream_t s);

// LayerNorm (b non-null) or RMSNorm (b null: out = x rstd w, mean unused) over C of fp32
// rows; out in bf16 (its readers are GEMMs); mean, rstd (N) fp32.
void norm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                  int64_t C, float eps, cudaStream_t s);
// dinp += d(norm)/d(inp); dw += ..., db += ... (db null for RMSNorm). dout (N,C) fp32.
// scratch: norm_scratch_floats(N, C) floats (per-block partial sums, so the result is
// deterministic). dinp_h: when set, also the updated dinp in bf16. dsum: when set, += the
// column sums of the updated dinp (the bias gradient of the layer whose output it is the
// gradient of), from the values in registers instead of another pass over dinp.
int64_t norm_scratch_floats(int64_t N, int64_t C);
void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t C, float* scratch, cudaStream_t s,
                   bf16* dinp_h = nullptr, float* dsum = nullptr);

// GELU (tanh form): out = gelu(inp); dinp = gelu'(inp) * dout (overwrites).
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s);
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s);
// SwiGLU: inp (N, 2F) = [gate | up] -> out (N, F) = silu(gate) * up; dinp (N, 2F) overwritten.
void swiglu_forward(bf16* out, const bf16* inp, int64_t N, int64_t F, cudaStream_t s);
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F, cudaStream_t s);
// RoPE in place on the q and k parts of qkv (B,T,(H+2KV)*hd), rotate-half convention
// (kernels/ops.inc); backward applies the inverse rotation.
void rope(bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta, bool inverse,
          cudaStream_t s);

// db(OC) += column sums of dout (N, OC), fp32 or bf16 dout. scratch: bias_scratch_floats.
int64_t bias_scratch_floats(int64_t N, int64_t OC);
void bias_backward(float* db, const float* dout, int64_t N, int64_t OC, float* scratch, cudaStream_t s);
void bias_backward(float* db, const bf16* dout, int64_t N, int64_t OC, float* scratch, cudaStream_t s);

// Causal softmax of attention scores, one row per (b, h, query t): S (BH, T, T) fp32 already
// scaled; P (BH, T, T) bf16, 0 above the diagonal.
void softmax_causal_forward(bf16* P, const float* S, int64_t BH, int64_t T, cudaStream_t s);
// dS = P (dP - rowsum(P dP)) scale in bf16 (0 above the diagonal); dP (BH, T, T) fp32.
void softmax_causal_backward(bf16* dS, const bf16* P, const float* dP, int64_t BH, int64_t T, float scale,
                             cudaStream_t s);
// qkv (B,T,(H+2KV)*hd) -> q, k, v (B,H,T,hd), each key/value head repeated for the H/KV
// query heads that read it (grouped-query attention); merge_heads is the adjoint: it
// overwrites dqkv, summing each key/value head's group in fp32. heads_to_rows: (B,H,T,hd)
// -> (B,T,H*hd); rows_to_heads the inverse.
void split_heads(bf16* q, bf16* k, bf16* v, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                 int64_t hd, cudaStream_t s);
void merge_heads(bf16* qkv, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                 int64_t hd, cudaStream_t s);
void heads_to_rows(bf16* out, const bf16* in, int64_t B, int64_t T, int64_t H, int64_t hd, cudaStream_t s);
void rows_to_heads(bf16* out, const bf16* in, int64_t B, int64_t T, int64_t H, int64_t hd, cudaStream_t s);

// Note [CUDA flash attention] (flash.cu): causal attention reading q, k, v from qkv
// (B,T,(H+2KV)*hd) and writing out (B,T,H*hd) bf16 and lse (B,H,T) fp32 (the log2 of each
// row's softmax sum, plus its max), for hd in {32, 64, 128} (flash_supported).
bool flash_supported(int64_t hd);
void flash_forward(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   cudaStream_t s);
// fp32 scratch of the backward: delta (B,H,T); dk, dv (B,H,T,hd) each where query heads
// share key/value heads (KV < H; unused, may be null, where KV == H).
struct FlashScratch {
  float *dk, *dv, *delta;
};
// dqkv (B,T,(H+2KV)*hd, overwritten) from dout (B,T,H*hd), the forward's out and lse.
void flash_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                    FlashScratch scratch, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t s);

// Softmax cross-entropy over rows of bf16 logits (N, V), row stride ld >= V, ld % 8 == 0
// (16-byte aligned rows), computed in fp32: losses[i] = logsumexp - logit[target] (0 for a
// negative target) and dlogits (bf16, same stride) = (softmax - onehot) * dscale (0 rows
// for a negative target, 0 columns past V). dlogits may be null, or the logits themselves
// (the gradient overwrites them).
void crossentropy(float* losses, bf16* dlogits, const bf16* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t ld, float dscale, cudaStream_t s);

// AdamW over one run of the flat buffer (kernels/ops.inc), the gradient multiplied by
// grad_scale first (clipping); also writes the bf16 copy of the updated parameters. With
// clip_norm_sq (device, the squared gradient norm from sum_squares) the scale is instead
// clip_coef(sqrt(*clip_norm_sq), clip_max) (optim/optimizer.h), computed on the device in
// the same double arithmetic, so the host need not wait for the norm.
void adamw(float* p, bf16* p_h, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2, float eps,
           float wd, int64_t step, float grad_scale, cudaStream_t s, const double* clip_norm_sq = nullptr,
           double clip_max = 0);
// The same over a whole flat buffer in one launch: run r covers [starts[r], starts[r + 1])
// (device arrays, starts ascending from 0, multiples of 4) with weight decay decay[r] * wd
// (decay[r] 1 or 0); n % 4 == 0, p, g, m, v 16-byte and p_h 8-byte aligned.
void adamw_runs(float* p, bf16* p_h, const float* g, float* m, float* v, int64_t n, const int64_t* starts,
                const float* decay, int runs, float lr, float b1, float b2, float eps, float wd, int64_t step,
                float grad_scale, cudaStream_t s, const double* clip_norm_sq = nullptr, double clip_max = 0);
// *out (device, one double) = sum of x^2 over n (deterministic: per-block partials, then one
// block). scratch: 1024 doubles.
void sum_squares(double* out, const float* x, int64_t n, double* scratch, cudaStream_t s);
// *out (device float) = sum of x over n (the losses), accumulated in double. scratch as above.
void sum(float* out, const float* x, int64_t n, double* scratch, cudaStream_t s);

}  // namespace loom::cuda
