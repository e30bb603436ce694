// bf16 against fp8 GEMMs at a Llama's linear-layer shapes on this GPU (Note [CUDA fp8]):
//   cuda_gemm [TOKENS=16384] [D=2048 FFN=8192 KV_WIDTH=1024 VOCAB=32000]
// For each layer shape (IC -> OC over TOKENS rows): the forward GEMM in bf16
// (Blas::linear_forward, bf16 out), in fp8 e4m3 x e4m3, the backward-input GEMM's fp8 form
// e5m2 x e4m3 (Blas::fp8_gemm, bf16 out), and the cast of the activation fp8 adds
// (cast_fp8 of TOKENS x IC, with its amax). Milliseconds are the mean of 20 runs after 3,
// timed by CUDA events; TFLOP/s = 2 TOKENS IC OC / time. Inputs are uniform in [-1, 1).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "loom/core/bf16.h"
#include "loom/cuda/blas.h"
#include "loom/cuda/check.h"
#include "loom/cuda/fp8.h"

namespace {

using loom::bf16;
using namespace loom::cuda;

template <class T>
T* device_alloc(int64_t n) {
  void* p = nullptr;
  LOOM_CUDA_OK(cudaMalloc(&p, size_t(n) * sizeof(T)));
  return static_cast<T*>(p);
}

template <class F>
double time_ms(F&& run) {
  for (int i = 0; i < 3; i++) run();
  cudaEvent_t e0, e1;
  LOOM_CUDA_OK(cudaEventCreate(&e0));
  LOOM_CUDA_OK(cudaEventCreate(&e1));
  const int reps = 20;
  LOOM_CUDA_OK(cudaEventRecord(e0));
  for (int i = 0; i < reps; i++) run();
  LOOM_CUDA_OK(cudaEventRecord(e1));
  LOOM_CUDA_OK(cudaEventSynchronize(e1));
  float ms = 0;
  LOOM_CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / reps;
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t d) { return argc > i ? std::atoll(argv[i]) : d; };
  const int64_t N = arg(1, 16384), D = arg(2, 2048), F = arg(3, 8192), KVW = arg(4, 1024), V = arg(5, 32000);
  struct Shape {
    const char* name;
    int64_t ic, oc;
  } shapes[] = {{"qkv", D, D + 2 * KVW}, {"attn out", D, D}, {"gate+up", D, 2 * F}, {"down", F, D}, {"head", D, V}};
  int64_t max_in = 0, max_w = 0, max_out = 0;
  for (const Shape& s : shapes)
    max_in = std::max(max_in, N * s.ic), max_w = std::max(max_w, s.ic * s.oc), max_out = std::max(max_out, N * s.oc);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<bf16> h(size_t(std::max(max_in, max_w)));
  for (bf16& x : h) x = loom::to_bf16(u(g));
  bf16 *inp = device_alloc<bf16>(max_in), *w = device_alloc<bf16>(max_w), *out = device_alloc<bf16>(max_out);
  uint8_t *qin = device_alloc<uint8_t>(max_in), *qw = device_alloc<uint8_t>(max_w);
  float *scale = device_alloc<float>(2), *amax = scale + 1;
  LOOM_CUDA_OK(cudaMemcpy(inp, h.data(), size_t(max_in) * 2, cudaMemcpyHostToDevice));
  LOOM_CUDA_OK(cudaMemcpy(w, h.data(), size_t(max_w) * 2, cudaMemcpyHostToDevice));
  const float one[2] = {1.0f, 0.0f};
  LOOM_CUDA_OK(cudaMemcpy(scale, one, sizeof(one), cudaMemcpyHostToDevice));
  Blas blas(nullptr);
  std::printf("%d tokens; ms (TFLOP/s)\n%-9s %16s %16s %16s %10s %9s %9s\n", int(N), "shape", "bf16", "fp8 e4m3",
              "fp8 e5m2xe4m3", "cast ms", "fp8/bf16", "+cast");
  double sum_bf16 = 0, sum_fp8 = 0, sum_cast = 0;
  for (const Shape& s : shapes) {
    cast_fp8(qin, Fp8::kE4m3, inp, N * s.ic, scale, amax, nullptr);
    cast_fp8(qw, Fp8::kE4m3, w, s.ic * s.oc, scale, amax, nullptr);
    const double flop = 2.0 * double(N) * double(s.ic) * double(s.oc);
    const double tb = time_ms([&] { blas.linear_forward(out, Dt::kBf16, inp, w, nullptr, nullptr, N, s.ic, s.oc); });
    const double t8 = time_ms([&] { blas.fp8_gemm(out, Dt::kBf16, qin, Fp8::kE4m3, scale, qw, Fp8::kE4m3, scale, N, s.oc, s.ic); });
    const double t85 = time_ms([&] { blas.fp8_gemm(out, Dt::kBf16, qin, Fp8::kE5m2, scale, qw, Fp8::kE4m3, scale, N, s.oc, s.ic); });
    const double tc = time_ms([&] { cast_fp8(qin, Fp8::kE4m3, inp, N * s.ic, scale, amax, nullptr); });
    auto tf = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
    std::printf("%-9s %7.3f (%5.0f) %7.3f (%5.0f) %7.3f (%5.0f) %10.3f %8.2fx %8.2fx\n", s.name, tb, tf(tb), t8, tf(t8),
                t85, tf(t85), tc, tb / t8, tb / (t8 + tc));
    sum_bf16 += tb, sum_fp8 += t8, sum_cast += tc;
  }
  std::printf("all five: bf16 %.3f ms, fp8 %.3f ms (%.2fx), fp8 + casts %.3f ms (%.2fx)\n", sum_bf16, sum_fp8,
              sum_bf16 / sum_fp8, sum_fp8 + sum_cast, sum_bf16 / (sum_fp8 + sum_cast));
  LOOM_CUDA_OK(cudaDeviceSynchronize());
  return 0;
}
