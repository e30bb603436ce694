// Note [CUDA fp8 linear layers] (fp8_linear.h).
#include "loom/cuda/fp8_linear.h"

#include <algorithm>
#include <vector>

#include "loom/core/error.h"
#include "loom/cuda/check.h"
#include "loom/cuda/fp8.h"

namespace loom::cuda {

namespace {
int64_t round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

Fp8Linears::Fp8Linears(int64_t layers, const std::array<Shape, 4>& shapes, int64_t max_rows, cudaStream_t s)
    : layers_(layers), max_rows_(max_rows), shapes_(shapes), s_(s) {
  const int64_t n = layers * 4;
  e4m3_.n = 2 * n, e5m2_.n = n;
  int64_t max_in = 0, max_out = 0;
  for (const Shape& sh : shapes) max_in = std::max(max_in, sh.in), max_out = std::max(max_out, sh.out);
  // One allocation, carved twice: sizes first (base null), then pointers.
  auto carve = [&](char* base) {
    int64_t used = 0;
    auto take = [&](int64_t bytes) {
      char* p = base ? base + used : nullptr;
      used += round256(bytes);
      return p;
    };
    for (Group* g : {&e4m3_, &e5m2_}) {
      g->scale = reinterpret_cast<float*>(take(g->n * kScaleStride * 4));
      g->scale_inv = reinterpret_cast<float*>(take(g->n * kScaleStride * 4));
      g->amax = reinterpret_cast<float*>(take(g->n * 4));
      g->history = reinterpret_cast<float*>(take(g->n * kHistory * 4));
    }
    w8_.assign(size_t(n), nullptr), w8t_.assign(size_t(n), nullptr), x8t_.assign(size_t(n), nullptr);
    for (int64_t i = 0; i < n; i++) {
      const Shape& sh = shapes[size_t(i % 4)];
      w8_[size_t(i)] = reinterpret_cast<uint8_t*>(take(sh.in * sh.out));
      w8t_[size_t(i)] = reinterpret_cast<uint8_t*>(take(sh.in * sh.out));
      x8t_[size_t(i)] = reinterpret_cast<uint8_t*>(take(sh.in * max_rows));
    }
    x8_ = reinterpret_cast<uint8_t*>(take(max_rows * max_in));
    dy8_ = reinterpret_cast<uint8_t*>(take(max_rows * max_out));
    dy8t_ = reinterpret_cast<uint8_t*>(take(max_rows * max_out));
    return used;
  };
  bytes_ = carve(nullptr);
  LOOM_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&mem_), size_t(bytes_)));
  carve(mem_);
  LOOM_CUDA_OK(cudaMemsetAsync(mem_, 0, size_t(bytes_), s_));  // amaxes and histories start at 0
  for (const Group* g : {&e4m3_, &e5m2_}) {  // scales start at 1
    const std::vector<float> ones(size_t(g->n * kScaleStride), 1.0f);
    LOOM_CUDA_OK(cudaMemcpyAsync(g->scale, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice, s_));
    LOOM_CUDA_OK(cudaMemcpyAsync(g->scale_inv, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice, s_));
  }
  LOOM_CUDA_OK(cudaStreamSynchronize(s_));  // (the host vectors above)
}

Fp8Linears::~Fp8Linears() { cudaFree(mem_); }

void Fp8Linears::cast_weights(const std::vector<std::array<const bf16*, 4>>& w) {
  LOOM_CHECK(int64_t(w.size()) == layers_, w.size(), " layers of weights for ", layers_);
  for (int64_t l = 0; l < layers_; l++)
    for (int j = 0; j < 4; j++) {
      const int64_t i = l * 4 + j, wi = 2 * i + 1;
      cast_transpose_fp8(w8_[size_t(i)], w8t_[size_t(i)], Fp8::kE4m3, w[size_t(l)][size_t(j)], shapes_[size_t(j)].out,
                         shapes_[size_t(j)].in, at(e4m3_.scale, wi), e4m3_.amax + wi, s_);
    }
}

void Fp8Linears::forward(Blas& blas, int64_t l, int j, void* y, Dt y_type, const float* residual, const bf16* x,
                         int64_t N) {
  LOOM_CHECK(N <= max_rows_, N, " rows for fp8 buffers of ", max_rows_);
  const Shape& sh = shapes_[size_t(j)];
  const int64_t i = l * 4 + j, xi = 2 * i, wi = 2 * i + 1;
  cast_transpose_fp8(x8_, x8t_[size_t(i)], Fp8::kE4m3, x, N, sh.in, at(e4m3_.scale, xi), e4m3_.amax + xi, s_);
  blas.fp8_gemm(y, y_type, x8_, Fp8::kE4m3, at(e4m3_.scale_inv, xi), w8_[size_t(i)], Fp8::kE4m3,
                at(e4m3_.scale_inv, wi), N, sh.out, sh.in, residual);
}

void Fp8Linears::backward(Blas& blas, int64_t l, int j, void* dx, Dt dx_type, float* dw, const bf16* dy, int64_t N) {
  const Shape& sh = shapes_[size_t(j)];
  const int64_t i = l * 4 + j, xi = 2 * i, wi = 2 * i + 1;
  cast_transpose_fp8(dy8_, dy8t_, Fp8::kE5m2, dy, N, sh.out, at(e5m2_.scale, i), e5m2_.amax + i, s_);
  if (dx)
    blas.fp8_gemm(dx, dx_type, dy8_, Fp8::kE5m2, at(e5m2_.scale_inv, i), w8t_[size_t(i)], Fp8::kE4m3,
                  at(e4m3_.scale_inv, wi), N, sh.in, sh.out);
  blas.fp8_gemm(dw, Dt::kF32, dy8t_, Fp8::kE5m2, at(e5m2_.scale_inv, i), x8t_[size_t(i)], Fp8::kE4m3,
                at(e4m3_.scale_inv, xi), sh.out, sh.in, N, dw);
}

void Fp8Linears::update_scales() {
  fp8_update_scales(e4m3_.scale, e4m3_.scale_inv, e4m3_.history, e4m3_.amax, e4m3_.n, kHistory, updates_, Fp8::kE4m3,
                    0, s_, kScaleStride);
  fp8_update_scales(e5m2_.scale, e5m2_.scale_inv, e5m2_.history, e5m2_.amax, e5m2_.n, kHistory, updates_, Fp8::kE5m2,
                    0, s_, kScaleStride);
  updates_++;
}

}  // namespace loom::cuda
