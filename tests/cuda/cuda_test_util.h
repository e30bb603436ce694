// Helpers of the CUDA tests: the device check, device buffers poisoned on allocation, fresh
// random inputs, bf16 rounding and the relative error ||a - ref|| / ||ref||.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "loom/core/bf16.h"

namespace loom::cuda {

inline bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device"

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, n * sizeof(T)), cudaSuccess);  // poisoned: unwritten outputs show
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

inline std::mt19937_64& rng() {
  static std::mt19937_64 g{std::random_device{}()};
  return g;
}
inline std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  return v;
}
inline std::vector<bf16> to_h(const std::vector<float>& v) {
  std::vector<bf16> h(v.size());
  for (size_t i = 0; i < v.size(); i++) h[i] = loom::to_bf16(v[i]);
  return h;
}
inline std::vector<float> widen(const std::vector<bf16>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); i++) v[i] = loom::from_bf16(h[i]);
  return v;
}
inline std::vector<float> rounded(const std::vector<float>& v) { return widen(to_h(v)); }
inline double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace loom::cuda
