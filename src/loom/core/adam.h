// One float Adam's bias correction shares between the fast kernel and the optimizer's
// 1-bit / 0/1 Adam paths, so their denominators sqrt(v / (1 - b2^t)) + eps agree to the bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/core/bf16.h"

namespace loom {

// 1 / sqrt(1 - b2^t) as the float every Adam denominator multiplies sqrt(v) by (t >= 1).
inline float adam_inv_bias_correction2(float beta2, int64_t t) {
  return 1.0f / float(std::sqrt(1.0 - std::pow(double(beta2), double(t))));
}

// The stream of Note [bf16 optimizer moments]'s rounding bits at optimizer step `step`.
inline uint32_t adam_moment_key(int64_t step) { return random_bits(0x6d6f6d31u, uint64_t(step)); }

}  // namespace loom
