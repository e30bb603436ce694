// Pieces the reference bf16 and fp16 kernels share (gemm_bf16.cc, gemm_fp16.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/kernels/ref/ops.h"

namespace loom::ref::detail {

// dbias(OC) += fp64 sums over the N rows of the unrounded dout(N,OC).
inline void add_bias_grad(float* dbias, const float* dout, int64_t N, int64_t OC, bool fresh) {
  for (int64_t o = 0; o < OC; o++) {
    double s = 0;
    for (int64_t i = 0; i < N; i++) s += dout[i * OC + o];
    dbias[o] = fresh ? float(s) : dbias[o] + float(s);
  }
}

using MatmulForward = void (*)(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t);
using MatmulBackward = void (*)(float*, float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                int64_t, bool);

// lm_head_loss (ops.inc) with its two GEMMs done by a rounded matmul pair; softmax and the
// loss in fp32 as the fp32 reference does them.
inline void head_loss(MatmulForward fwd, MatmulBackward bwd, float* losses, float* dx, float* dw, const float* x,
                      const float* w, const int32_t* targets, int64_t N, int64_t C, int64_t V, float dloss_scale) {
  std::vector<float> logits(static_cast<std::size_t>(N * V));
  fwd(logits.data(), x, w, nullptr, N, C, V);
  crossentropy_forward(losses, logits.data(), targets, N, V);
  if (!dx) return;
  const std::vector<float> dloss(static_cast<std::size_t>(N), dloss_scale);
  crossentropy_backward_inplace(logits.data(), targets, dloss.data(), N, V);
  bwd(dx, dw, nullptr, logits.data(), x, w, N, C, V, false);
}

}  // namespace loom::ref::detail
