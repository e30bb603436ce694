// IEEE 754 binary16 storage (1 sign, 5 exponent, 10 stored mantissa bits; unit roundoff
// u = 2^-11, largest finite 65504, smallest normal 2^-14, subnormals down to 2^-24).
//
// train.precision = fp16 rounds the GEMM inputs to fp16 at the same points bf16 does (Note
// [bf16 rounding points] in core/bf16.h) and computes in fp32: a product of two fp16
// values has at most 22 significant bits and an exponent far inside fp32's range, so it
// is exact in fp32 and the same accumulation bound holds. What fp16 adds is range: a
// gradient below 2^-24 flushes to zero and one above 65504 becomes infinity, which is
// what dynamic loss scaling (Note [Dynamic loss scaling] in optim/loss_scale.h) manages.
#pragma once

#include <bit>
#include <cstdint>

namespace loom {

using fp16 = uint16_t;

// Round to nearest, ties to even, with fp16 subnormals; |x| >= 65520 rounds to infinity;
// NaN stays a (quiet) NaN.
inline fp16 to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x38800000u) {  // fp16 normal range (>= 2^-14) and above
    // Drop 13 mantissa bits with round-to-nearest-even, then rebias the exponent
    // (127 - 15 = 112); a carry out of the mantissa moves into the exponent, as it should.
    const uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) - (112u << 23);
    return fp16(sign | (r >= (0x1fu << 23) ? 0x7c00u : r >> 13));
  }
  // Subnormal or zero: |x| + 0.5 has ulp 2^-24 (the fp16 subnormal step), so the fp32 add
  // (round to nearest even) leaves round(|x| / 2^-24) in the low mantissa bits; 2^-14
  // comes out as 0x400, the smallest normal.
  const float t = std::bit_cast<float>(a) + 0.5f;
  return fp16(sign | (std::bit_cast<uint32_t>(t) - 0x3f000000u));
}

inline float from_fp16(fp16 h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));  // NaN: quiet
  if (e == 0) {
    const float v = float(m) * 0x1p-24f;  // exact: m < 2^10
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// x rounded to fp16 and back (what an fp16 store then load gives).
inline float round_fp16(float x) { return from_fp16(to_fp16(x)); }

}  // namespace loom
