// AdamW's update, fp32 moments and bf16 ones (Note [bf16 optimizer moments] in
// kernels/ops_bf16.inc). Built with -fno-math-errno and -ffp-contract=off (Note [Vectorized
// AdamW]).
#include <cmath>

#include "loom/core/adam.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"

namespace loom::cpu {

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  const float bc1 = float(1.0 - std::pow(double(beta1), double(step)));
  // sqrt(v) / sqrt(1 - b2^t) as a product with the reciprocal: one division per element
  // instead of two. Within an ulp of the quotient.
  //
  // Note [Vectorized AdamW]
  // With math errno on (GCC's default), std::sqrt keeps a call to sqrtf for negative inputs,
  // and that branch kept this loop (and the bf16-moment one below) scalar: compute-bound, ~110
  // ms a step for GPT-2 124M's AdamW (`LOOM_KERNEL_PROFILE`, config C). This file is built with
  // -fno-math-errno (src/loom/CMakeLists.txt), so both loops run in AVX-512 vectors: 36-54 ms,
  // +4% tokens/s on C in bf16 (alternating runs). And with -ffp-contract=off: each expression
  // rounds as written, so the vector body, its remainder and the optimizer's own Adam loops
  // (1-bit, 0/1 Adam in optim/optimizer.cc, built the same way) give the same bits for the
  // same element, wherever a range (a ZeRO shard, a run) cuts the buffer.
  const float inv_bc2_sqrt = adam_inv_bias_correction2(beta2, step);
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    // torch.optim.AdamW order: decay first, then the Adam step.
    params[i] = params[i] * decay - step_size * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

void adamw_update_bf16_moments(float* params, const float* grads, bf16* m, bf16* v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                               int64_t first) {
  // Note [bf16 optimizer moments]: adamw_update's arithmetic on the widened moments.
  const float bc1 = float(1.0 - std::pow(double(beta1), double(step)));
  const float inv_bc2_sqrt = adam_inv_bias_correction2(beta2, step);
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * weight_decay;
  const uint32_t key = adam_moment_key(step);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * loom::from_bf16(m[i]) + (1.0f - beta1) * g;
    const float vi = beta2 * loom::from_bf16(v[i]) + (1.0f - beta2) * g * g;
    const uint32_t r = loom::random_bits(key, uint64_t(first + i));
    m[i] = loom::to_bf16_stochastic(mi, r);
    v[i] = loom::to_bf16_stochastic(vi, r >> 16);
    params[i] = params[i] * decay - step_size * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

}  // namespace loom::cpu
