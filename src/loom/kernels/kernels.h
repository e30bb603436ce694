// A kernel set as a table of function pointers, so the model can run on the fast CPU
// kernels (default) or on the naive reference kernels (tests) without #ifdefs.
#pragma once

#include "loom/core/config_enums.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/ref/ops.h"

namespace loom {

// A target the loss skips (loss 0, zero gradient): padding (Note [Length bucketing]).
inline constexpr int32_t kIgnoreTarget = -1;

#define LOOM_KERNEL_LIST(X)                                                                        \
  X(embedding_forward) X(embedding_backward) X(layernorm_forward) X(layernorm_backward)            \
  X(rmsnorm_forward) X(rmsnorm_backward) X(matmul_forward) X(matmul_backward) X(gelu_forward)      \
  X(gelu_backward) X(swiglu_forward) X(swiglu_backward) X(rope_forward) X(rope_backward)           \
  X(attention_forward) X(attention_backward) X(cp_attention_forward) X(cp_attention_backward)      \
  X(ring_attention_step) X(ring_attention_finish) X(ring_attention_backward_step)                  \
  X(residual_forward) X(crossentropy_forward)                                                      \
  X(crossentropy_backward_inplace) X(lm_head_loss) X(softmax_exp_rows) X(lm_head_logits_row)       \
  X(adamw_update)                                                                                  \
  X(sum_squares) X(scale_inplace)

struct Kernels {
#define LOOM_KERNEL_FIELD(name) decltype(&cpu::name) name;
  LOOM_KERNEL_LIST(LOOM_KERNEL_FIELD)
#undef LOOM_KERNEL_FIELD
  const char* backend;
  // Precision::kBf16 only, else nullptr: GEMMs whose input is stored in bf16 (Note [bf16
  // activation storage] in model/model.cc) and the conversion that stores it.
  decltype(&cpu::matmul_forward_bf16_in) matmul_forward_bf16_in = nullptr;
  decltype(&cpu::matmul_backward_bf16_in) matmul_backward_bf16_in = nullptr;
  decltype(&cpu::to_bf16) to_bf16 = nullptr;
  decltype(&cpu::gelu_backward_bf16_in) gelu_backward_bf16_in = nullptr;
  decltype(&cpu::swiglu_backward_bf16_in) swiglu_backward_bf16_in = nullptr;
  // Precision::kBf16 only: attention with bf16 probabilities (Note [bf16 attention probabilities]).
  decltype(&cpu::attention_forward_bf16) attention_forward_bf16 = nullptr;
  decltype(&cpu::attention_backward_bf16) attention_backward_bf16 = nullptr;
  decltype(&cpu::cp_attention_forward_bf16) cp_attention_forward_bf16 = nullptr;  // the same, context parallel
  decltype(&cpu::cp_attention_backward_bf16) cp_attention_backward_bf16 = nullptr;
  // Precision::kBf16 only: norm backward from the kept bf16 output (Note [Norm backward from its output]).
  decltype(&cpu::layernorm_backward_from_out) layernorm_backward_from_out = nullptr;
  decltype(&cpu::rmsnorm_backward_from_out) rmsnorm_backward_from_out = nullptr;
  // Every CPU table (cpu and ref, any precision): AdamW with bf16 moments (Note [bf16
  // optimizer moments]); nullptr where a backend has none.
  decltype(&cpu::adamw_update_bf16_moments) adamw_update_bf16_moments = nullptr;
};

enum class KernelBackend { kCpu, kRef };
// kBf16 (train.precision = bf16): matmul_forward, matmul_backward and lm_head_loss round
// their GEMM inputs to bf16 and accumulate in fp32 (Note [bf16 rounding points]), and the
// model runs attention_forward_bf16 / attention_backward_bf16, which round the softmax
// probabilities (Note [bf16 attention probabilities]); every other kernel stays fp32. kFp16 (train.precision = fp16): the same
// three kernels round to fp16 instead (core/fp16.h) and compute in fp32.
// (Precision is train.precision's enum, core/config_enums.h.)
const Kernels& kernels(KernelBackend backend, Precision precision = Precision::kFp32);

}  // namespace loom
