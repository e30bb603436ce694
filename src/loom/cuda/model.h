// GPT-2 and Llama on one CUDA device (issue 20): the model of model/model.h, forward and
// backward over the same flat parameter layout (ParamLayout), so parameters, gradients
// and AdamW moments copy to and from the CPU engine's buffers unchanged. Precision is
// Note [CUDA precision] in cuda/ops.h. Built only with -DLOOM_CUDA=ON.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/model/layout.h"

namespace loom::cuda {

class Nccl;

class CudaModel {
 public:
  // Allocates parameters (fp32 and their bf16 copy), gradients, AdamW moments and
  // activations for micro-batches up to (max_batch, T) on the current device; parameters
  // start at zero. Throws loom::Error naming the sizes when the device is too small.
  // flash: Note [CUDA flash attention] where the head size allows it (flash_supported),
  // else (and with false) the materialised attention of Note [CUDA attention].
  // recompute: per layer (one entry for all; empty: none). kFull: the layer keeps only its
  // input and runs its forward again in backward (the full layers share one set of
  // activation buffers), the same gradients in less memory. kSelective: what flash
  // attention does anyway (no (B,H,T,T) tensor is kept); refused with the materialised
  // attention, which keeps it. fp8: the blocks' linear layers in fp8 (Note [CUDA fp8 linear
  // layers] in cuda/fp8_linear.h; Llama, every dimension and max_batch T multiples of 16).
  CudaModel(const ModelConfig& cfg, int64_t max_batch, int64_t T, bool flash = true,
            const std::vector<Recompute>& recompute = {}, bool fp8 = false);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ParamLayout& layout() const { return layout_; }
  // Host <-> device copies of the flat buffers (layout().total_floats() floats each).
  void upload_params(const std::vector<float>& host);
  std::vector<float> download_params() const;
  std::vector<float> download_grads() const;
  void upload_moments(const std::vector<float>& m, const std::vector<float>& v);
  void download_moments(std::vector<float>& m, std::vector<float>& v) const;
  void zero_grads();

  // One micro-batch of host tokens/targets (B,T): ADDS d(grad_scale * mean loss)/dparams to
  // the gradients and the loss sum to the step's loss (read by take_loss). Asynchronous.
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float grad_scale);
  // Mean loss of one micro-batch, no gradients (validation). Synchronizes.
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // Mean over the micro-batches since the last call of their mean losses. Synchronizes.
  double take_loss();

  // L2 norm of the gradients (synchronizes); then AdamW (kernels/ops.inc) with the
  // gradients multiplied by grad_scale, weight decay on the layout's decayed tensors, and
  // the bf16 copy refreshed. `step` >= 1 is the bias-correction step.
  double grad_norm();
  void adamw_step(const OptimConfig& o, double lr, int64_t step, double grad_scale);
  // The same with clipping to o.grad_clip decided on the device (ops.h adamw), so the host
  // does not wait for the GPU between backward and update. Asynchronous; the step's
  // gradient norm reaches the host with the next take_loss (last_grad_norm).
  void clip_and_step(const OptimConfig& o, double lr, int64_t step);
  double last_grad_norm() const;

  // Data parallelism (Note [GPU data parallelism] in cuda/nccl.h), on the model's stream:
  // the gradients summed over the ranks (asynchronous); rank 0's parameters (and their
  // bf16 copies) on every rank; a wait for the stream that throws on a NCCL error or
  // timeout instead of hanging.
  void all_reduce_grads(Nccl& nccl);
  void broadcast_params(Nccl& nccl);
  void wait(Nccl& nccl, const std::string& what);

  int64_t device_bytes() const { return bytes_; }  // everything this model allocated
  bool flash() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  ParamLayout layout_;
  int64_t bytes_ = 0;
};

}  // namespace loom::cuda
