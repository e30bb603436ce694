// The reference bf16 GEMM: the exact products of the bf16 inputs, summed in fp64, rounded
// once to fp32 (Note [bf16 rounding points] in kernels/bf16.h). Same contract as
// cpu::gemm_bf16.
#pragma once

#include <cstdint>

#include "loom/kernels/bf16.h"

namespace loom::ref {

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// train.precision = bf16 versions of the fp32 kernels of the same name in ops.inc: each
// GEMM input (activation, weight, upstream gradient) rounded to bf16, products summed in
// fp64; bias, its gradient, softmax and the loss stay fp32.
void matmul_forward_bf16(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                         int64_t OC);
void matmul_backward_bf16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int64_t N, int64_t IC, int64_t OC);
void lm_head_loss_bf16(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets,
                       int64_t N, int64_t C, int64_t V, float dloss_scale);

}  // namespace loom::ref
