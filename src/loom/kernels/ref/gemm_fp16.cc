#include "loom/kernels/ref/gemm_fp16.h"

#include <cstddef>
#include <vector>

#include "loom/kernels/ref/rounded.h"

namespace loom::ref {

namespace {

// x rounded to fp16, held as fp32 (exactly representable).
std::vector<float> rounded(const float* x, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++) out[std::size_t(i)] = round_fp16(x[i]);
  return out;
}

}  // namespace

// ref::matmul_* sum in fp64, so on the rounded copies they are the contract exactly.
void matmul_forward_fp16(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC,
                         int64_t OC) {
  const std::vector<float> a = rounded(inp, N * IC), b = rounded(w, OC * IC);
  matmul_forward(out, a.data(), b.data(), bias, N, IC, OC);
}

void matmul_backward_fp16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int64_t N, int64_t IC, int64_t OC, bool fresh) {
  const std::vector<float> d = rounded(dout, N * OC);
  const std::vector<float> a = dw ? rounded(inp, N * IC) : std::vector<float>(), b = dinp ? rounded(w, OC * IC) : std::vector<float>();
  matmul_backward(dinp, dw, nullptr, d.data(), a.data(), b.data(), N, IC, OC, fresh);
  if (dbias) detail::add_bias_grad(dbias, dout, N, OC, fresh);  // from the unrounded upstream gradient
}

void lm_head_loss_fp16(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets,
                       int64_t N, int64_t C, int64_t V, float dloss_scale) {
  detail::head_loss(matmul_forward_fp16, matmul_backward_fp16, losses, dx, dw, x, w, targets, N, C, V, dloss_scale);
}

}  // namespace loom::ref
