// Note [CUDA fp8]
// Per-tensor scaled fp8 (Micikevicius et al. 2022, "FP8 Formats for Deep Learning") with
// Transformer Engine's delayed scaling, the pieces of issue 56 item 5. A tensor x is stored
// as q = sat(x * scale) in e4m3 (largest finite 448: activations and weights) or e5m2
// (57344: gradients), sat clamping to the largest finite value, and read back as
// q * scale_inv, scale_inv = 1 / scale. A GEMM takes its two operands scaled apart and
// multiplies the fp32 product by scale_inv_a scale_inv_b in its epilogue (Blas::fp8_gemm).
// Delayed scaling: each cast raises this step's amax = max |x|; fp8_update_scales puts it
// into a ring of the last H amaxes and sets the scale the next step's cast uses to
// fp8_max / (max of the ring) / 2^margin (TE's DelayedScaling, amax_compute_algo "max").
// Hopper's fp8 GEMMs read both operands with K contiguous (the "TN" form), so the backward
// needs transposed copies; cast_transpose_fp8 writes both forms in one pass (TE's
// cast-transpose).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "loom/core/bf16.h"

namespace loom::cuda {

enum class Fp8 { kE4m3, kE5m2 };

// The largest finite value of the format: 448 (e4m3), 57344 (e5m2).
float fp8_max(Fp8 f);

// out[i] = sat(in[i] * *scale) in format f (one byte each); *amax = max(*amax, |in[i]|)
// (the caller zeroes it where a step begins). scale and amax are device scalars.
void cast_fp8(uint8_t* out, Fp8 f, const bf16* in, int64_t n, const float* scale, float* amax, cudaStream_t s);
// The same for a row-major (R, C) matrix, writing out (R, C) and its transpose out_t (C, R);
// either may be null.
void cast_transpose_fp8(uint8_t* out, uint8_t* out_t, Fp8 f, const bf16* in, int64_t R, int64_t C, const float* scale,
                        float* amax, cudaStream_t s);
// Delayed scaling of n tensors of format f (a thread each): for tensor i, history[i H +
// step % H] = amax[i], then amax[i] = 0 (the next step raises it afresh), and where m = the
// max of its history row is finite and positive, scale[i stride] = fp8_max(f) / m / 2^margin
// and scale_inv[i stride] = 1 / that (else both keep their values: a tensor of zeros, or an
// overflow upstream). stride 4 keeps each scale on its own 16 bytes (Note [fp8 scale
// alignment] in fp8_linear.h).
void fp8_update_scales(float* scale, float* scale_inv, float* history, float* amax, int64_t n, int64_t H,
                       int64_t step, Fp8 f, int margin, cudaStream_t s, int64_t stride = 1);

}  // namespace loom::cuda
