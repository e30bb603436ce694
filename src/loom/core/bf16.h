// bfloat16 storage: the top 16 bits of an IEEE fp32 (8 exponent bits, 7 stored mantissa
// bits; unit roundoff u = 2^-8 under round-to-nearest-even).
//
// Note [bf16 rounding points]
// In train.precision = bf16 (issue 14) a value is rounded to bf16 where it is stored for a
// GEMM (the GEMM inputs: weights and activations) and where an activation is kept in bf16
// (qkv after RoPE and the MLP pre-activation, Note [bf16 activation storage] in
// model/model.cc, and the softmax probabilities, Note [bf16 attention probabilities] in
// kernels/ops_bf16.inc); norm statistics, attention scores, the softmax's sums, the loss,
// the residual stream and every reduction stay fp32. The norms' backward reads their rounded
// output where fp32 reads their input (Note [Norm backward from its output] in
// kernels/ops_bf16.inc), so the residual stream need not be kept. Products of two bf16 values are
// exact in fp32 (8 + 8 significant bits <= 24), so a bf16 GEMM differs from the exact
// product of its rounded inputs only by its fp32 accumulation. The reference kernels round
// at the same points and accumulate in fp64, so fast vs reference is bounded by the fp32
// accumulation alone: |C - C_ref| <= K 2^-24 sum_k |a_k b_k| (any summation order).
#pragma once

#include <bit>
#include <cstdint>

namespace loom {

using bf16 = uint16_t;

// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow rounds to infinity.
inline bf16 to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16(u >> 16);
}

inline float from_bf16(bf16 h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// x rounded to bf16 and back (what a bf16 store then load gives).
inline float round_bf16(float x) { return from_bf16(to_bf16(x)); }

}  // namespace loom
