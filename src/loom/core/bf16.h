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

// Note [Stochastic rounding]
// to_bf16_stochastic(x, r) rounds x to one of its two bf16 neighbours: adding the 16 random
// bits of r to x's fp32 bits carries into bit 16 (one bf16 step away from zero) exactly when
// r >= 2^16 - f, f the 16 bits bf16 drops, so with r uniform x rounds away from zero with
// probability f / 2^16 and E[result] = x (Gupta et al. 2015, "Deep Learning with Limited
// Numerical Precision", Sec. 3.1; for bf16 optimizer state, Zamirai et al. 2020, "Revisiting
// BFloat16 Training", Sec. 4). |result - x| < one bf16 step at x (<= 2^-7 |x|). Infinity and
// NaN round to nearest (they stay what they are); a finite x within a step of the largest
// bf16 may round to infinity.
inline bf16 to_bf16_stochastic(float f, uint32_t r) {
  // Branch-free (selects), so the optimizer's loop vectorizes; the specials as to_bf16 has them.
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const bool special = (u & 0x7f800000u) == 0x7f800000u, nan = (u & 0x7fffffffu) > 0x7f800000u;
  return bf16(((u + (special ? 0u : (r & 0xffffu))) >> 16) | (nan ? 0x40u : 0u));
}

// 32 pseudo-random bits for element `index` of stream `key`: a counter-based hash (the
// "lowbias32" mixer of C. Wellons' hash-prospector), so every element's bits depend on its
// index alone and any sharding of the elements draws the same bits for each. The index is
// spread by an odd multiplier before the key is added: with index ^ key, streams with small
// keys and indices shared inputs (i ^ t = i' ^ t'), and their bits were measurably biased.
// A 32-bit mixer rather than the splitmix64 the data loaders and TernGrad use (data::mix64):
// the optimizer draws one per element, and 32-bit multiplies run 16 to an AVX-512 vector.
inline uint32_t random_bits(uint32_t key, uint64_t index) {
  uint32_t h = uint32_t(index) * 0x9e3779b9u + key + uint32_t(index >> 32) * 0x85ebca6bu;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

}  // namespace loom
