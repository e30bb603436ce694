// Branch-free float math that GCC vectorises under `#pragma omp simd` (glibc's vector
// libm is only reachable with -ffast-math, which loom does not use).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace loom::cpu {

// exp(x) for float: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then a
// degree-6 polynomial (Taylor coefficients; remainder < 2e-8 relative on that range),
// scaled by 2^n through the exponent bits. Inputs below -87.3 return 0 (softmax masks),
// above 88.7 are clamped. Max relative error measured against std::exp: ~2 ulp.
inline float exp_approx(float x) {
  x = x < 88.7f ? x : 88.7f;
  const bool underflow = x < -87.3f;
  x = x > -87.3f ? x : -87.3f;
  // Round to nearest by adding and removing 1.5 * 2^23 (valid for |v| < 2^22); unlike
  // roundf this stays inline and vectorises. Ties go to even instead of away from zero,
  // which only changes which of two equally good reductions is used.
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;   // ln2 high part (exact in float)
  r = r - n * -2.12194440e-4f;      // ln2 low part
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += int32_t(n) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return underflow ? 0.0f : out;
}

inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// One attention row's softmax over its window: pr[lo .. hi] replaced by exp_approx(x - max)
// / sum, the rest of pr[0 .. n) zeroed (the masked keys).
inline void softmax_window(float* pr, int64_t lo, int64_t hi, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = lo; j <= hi; j++) mx = std::max(mx, pr[j]);
  float z = 0;
#pragma omp simd reduction(+ : z)
  for (int64_t j = lo; j <= hi; j++) {
    const float e = exp_approx(pr[j] - mx);
    pr[j] = e;
    z += e;
  }
  const float inv = 1.0f / z;
#pragma omp simd
  for (int64_t j = lo; j <= hi; j++) pr[j] *= inv;
  for (int64_t j = 0; j < lo; j++) pr[j] = 0.0f;
  for (int64_t j = hi + 1; j < n; j++) pr[j] = 0.0f;
}

}  // namespace loom::cpu
