// GPT-2 and Llama forward/backward over flat parameter and gradient buffers.
//
// GPT-2 block (pre-LN):  x1 = x0 + Proj(Attn(LN1(x0)));  x2 = x1 + W2 GELU(W1 LN2(x1) + b1) + b2
// Llama block:           x1 = x0 + Wo Attn(RoPE(Wqkv RMS1(x0)));  x2 = x1 + Wd (silu(Wg h) * (Wu h)), h = RMS2(x1)
// Loss: mean over the B*T tokens of softmax cross-entropy of head(normf(x_L)).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loom/core/config.h"
#include "loom/kernels/kernels.h"
#include "loom/model/layout.h"

namespace loom {

class Model {
 public:
  // Allocates parameters, gradients and activations for micro-batches up to
  // (max_batch, max_seq). Parameters start at zero; call init_weights or load them.
  Model(const ModelConfig& cfg, int64_t max_batch, int64_t max_seq,
        KernelBackend backend = KernelBackend::kCpu, const LayoutPadding& padding = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const Kernels& ops() const { return k_; }
  // The layers point into these buffers: copy new values in, never reassign or resize.
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<float>& grads() const { return grads_; }
  // Bytes held for activations and backward scratch.
  int64_t activation_bytes() const;

  // GPT-2 init: N(0, init_std) for matrices and embeddings, residual output projections
  // scaled by 1/sqrt(2 * layers), biases 0, norm weights 1. Deterministic from the seed.
  void init_weights(uint64_t seed);
  void zero_grads();

  // One micro-batch, tokens/targets (B,T). Returns the mean loss over B*T tokens and ADDS
  // d(grad_scale * mean loss)/dparams into grads().
  float forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                         float grad_scale);
  // Called during forward_backward each time the gradients of a suffix of the layout are
  // final for this micro-batch: every tensor with layout index >= first_final has received
  // all its contributions. Values decrease; the last call passes 0. (Data parallelism
  // launches bucket all-reduces from here, overlapping them with the rest of backward.)
  using GradReadyHook = std::function<void(int first_final)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

  // Mean loss only.
  float forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // Full logits (B,T,V) for tests; allocates B*T*V floats in `logits`.
  void forward_logits(const int32_t* tokens, int64_t B, int64_t T, std::vector<float>& logits);
  // Logits (V) of the last position of one sequence of length T (sampling).
  void forward_last_logits(const int32_t* tokens, int64_t T, float* logits);

 private:
  struct Acts;
  void check_shape(int64_t B, int64_t T) const;
  // Runs the blocks and the final norm; leaves normf output in acts.
  void forward_body(const int32_t* tokens, int64_t B, int64_t T);
  void backward_body(const int32_t* tokens, int64_t B, int64_t T);
  void forward_block(int l, int64_t B, int64_t T);
  void backward_block(int l, int64_t B, int64_t T);

  ModelConfig cfg_;
  ParamLayout layout_;
  const Kernels& k_;
  int64_t max_batch_, max_seq_;
  std::vector<float> params_, grads_;
  ModelView pv_, gv_;
  std::unique_ptr<Acts> acts_;
  GradReadyHook grad_ready_;
  std::vector<int> block_first_tensor_;  // layout index of each block's first tensor
  int normf_tensor_ = 0;                 // layout index of normf.w
};

}  // namespace loom
