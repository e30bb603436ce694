// bf16 GEMM with fp32 accumulation and output, on oneDNN's matmul primitive (AVX512-BF16 /
// AMX kernels where the CPU has them). Note [bf16 rounding points] in kernels/bf16.h.
#pragma once

#include <cstdint>

#include "loom/kernels/bf16.h"

namespace loom::cpu {

// Row-major C(M,N) = alpha op(A)(M,K) op(B)(K,N) + beta C, with op(X) = X or X^T as
// stored: A is (M,K) with row stride lda, or (K,M) when trans_a; B is (K,N) with row
// stride ldb, or (N,K) when trans_b. Threads: OpenMP's current maximum.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// train.precision = bf16 versions of the fp32 kernels of the same name in ops.inc, with the
// rounding points of ref::matmul_forward_bf16 and friends (Note [bf16 rounding points]).
void matmul_forward_bf16(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                         int64_t OC);
void matmul_backward_bf16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int64_t N, int64_t IC, int64_t OC);
void lm_head_loss_bf16(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets,
                       int64_t N, int64_t C, int64_t V, float dloss_scale);

// out[i] = to_bf16(in[i]), i < n (OpenMP).
void to_bf16(bf16* out, const float* in, int64_t n);

// The name of the ISA oneDNN dispatches to here (e.g. "avx512_core_bf16"), for reports.
const char* gemm_bf16_isa();

}  // namespace loom::cpu
