// The memory model: model states per ZeRO stage and precision, and activations per layer
// per recompute policy, tp/sp and cp (Korthikanti et al. 2022, Note [Activation memory]).
#pragma once

#include <cstdint>
#include <string>

#include "loom/sim/costs.h"

namespace loom::sim {


// Bytes one transformer layer keeps for its backward, for one micro-batch, on one rank.
double layer_activation_bytes(const LayerShape& x, Recompute r);
// Extra bytes the backward of one layer materialises on top (recomputed tensors alive
// while that layer's backward runs): full -> the whole layer's stored set, selective ->
// the attention scores, none -> 0.
double layer_recompute_transient_bytes(const LayerShape& x, Recompute r);
// Kept per micro-batch by the embedding (GPT's dropout mask) and the head (final norm
// input, head input, fp32 logits for the cross-entropy).
double embedding_activation_bytes(const LayerShape& x);
double head_activation_bytes(const LayerShape& x);

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0;
  double total() const { return params + grads + optimizer + activations + buffers; }
};

// Model states for `params` parameters on one rank (already tp/pp-split), under ZeRO
// `stage` over `dp` ranks: mixed precision keeps dtype_bytes weights and gradients and
// 12 bytes of fp32 master + Adam moments; fp32 keeps 4 + 4 + 8. moment_bytes = 2: the
// moments in bf16 (optim.moments = bf16, Note [bf16 optimizer moments]): 8 and 4 bytes.
MemoryBreakdown model_state_bytes(double params, int64_t dp, int64_t zero_stage, const DeviceSpec& d,
                                  int64_t moment_bytes = 4);

}  // namespace loom::sim
