#include "loom/sim/memory_model.h"

#include "loom/rank/state_bytes.h"

#include "loom/core/error.h"

namespace loom::sim {

// Note [Activation memory]
// Korthikanti et al. (2022), Section 4.1, count what one layer stores for its backward
// with 2-byte activations and 1-byte dropout masks (s sequence, b micro-batch, h hidden,
// a heads, t tensor-parallel):
//   attention 11sbh + 5as^2b: QKV input 2sbh, Q and K 4sbh, softmax output 2as^2b, its
//             dropout mask as^2b and output 2as^2b, V 2sbh, projection input 2sbh,
//             dropout mask sbh;
//   MLP 19sbh: input 2sbh, GELU input 8sbh and output 8sbh (f = 4h), dropout mask sbh;
//   norms 4sbh.
// Tensor parallelism splits everything but the norm inputs, the QKV and MLP inputs and the
// two dropout masks (10sbh); sequence parallelism splits those too; selective recompute
// drops the 5as^2b of the attention core; full recompute keeps only the layer input 2sbh
// (split by t under sp). Here every term is written from the model's shape, so Llama
// (GQA: K and V are g/a of Q; SwiGLU: gate, up and their product are kept; no dropout) and
// context parallelism (s/cp query rows against s keys) follow the same derivation; for the
// GPT shapes of the paper it reduces to its Table 2 exactly.
//
// Note [fp8 saved inputs]: in an fp8 format (Note [fp8 GEMMs]) each linear layer keeps for
// its weight gradient the input it cast forward, not the bf16 one (Transformer Engine saves
// the fp8 copy that its wgrad GEMM reads): the QKV, projection, MLP and fc2 inputs take
// operand_bytes (1 in fp8 and MXFP8, 0.5 + 1/16 in NVFP4) an element. The norms'
// inputs, Q, K, V and the MLP's other hidden terms stay in the activation dtype.

namespace {

struct LayerTerms {
  double replicated = 0;  // token-sized terms tp leaves whole (split by sp)
  double split = 0;       // token-sized terms split by tp
  double scores = 0;      // attention-score-sized terms (split by tp)
  double input = 0;       // the layer input (what full recompute keeps)
};

LayerTerms layer_terms(const LayerShape& x) {
  const double n = x.tokens(), dt = x.dtype_bytes, kv = x.g * (x.h / x.a);
  const bool gpt = x.arch == Arch::kGpt;
  LayerTerms L;
  const double mask = x.dropout ? 1 : 0;  // bytes per element of a dropout mask
  const double in = operand_bytes(x.gemm_format, dt);  // a linear layer's saved input (Note [fp8 saved inputs])
  // norm inputs (2), QKV input, MLP input, and the two residual dropout masks
  L.replicated = n * x.h * (2 * dt + 2 * in + 2 * mask);
  // Q, K, V, projection input; MLP hidden: GELU input + output, or SwiGLU gate, up, product
  // (the fc2 input: the GELU output or the product)
  L.split = n * (x.h * dt + 2 * kv * dt + x.h * in) + n * x.f * ((gpt ? 1 : 2) * dt + in);
  // softmax output; for GPT also its dropout mask and dropout output
  L.scores = n * x.s * x.a * (x.dropout ? 2 * dt + mask : dt);
  if (x.flash()) L.scores = n * x.a * 4;  // flash attention keeps the fp32 row log-sum-exp, not the scores
  L.input = n * x.h * dt;
  return L;
}

}  // namespace

double layer_activation_bytes(const LayerShape& x, Recompute r) {
  const LayerTerms L = layer_terms(x);
  const double rep = x.sp ? L.replicated / x.t : L.replicated;
  switch (r) {
    case Recompute::kFull: return x.sp ? L.input / x.t : L.input;
    case Recompute::kSelective: return rep + L.split / x.t;
    case Recompute::kNone: break;
  }
  return rep + (L.split + L.scores) / x.t;
}

double layer_recompute_transient_bytes(const LayerShape& x, Recompute r) {
  switch (r) {
    case Recompute::kFull: return layer_activation_bytes(x, Recompute::kNone);
    case Recompute::kSelective: return layer_terms(x).scores / x.t;
    case Recompute::kNone: break;
  }
  return 0;
}

double embedding_activation_bytes(const LayerShape& x) {
  if (!x.dropout) return 0;
  const double ne = x.sp ? x.tokens() / x.t : x.tokens();
  return ne * x.h;  // dropout mask, 1 byte per element
}

double head_activation_bytes(const LayerShape& x) {
  const double n = x.tokens(), ne = x.sp ? n / x.t : n;
  return 2 * ne * x.h * x.dtype_bytes + n * x.h * x.dtype_bytes + n * x.V / x.t * 4;
}

MemoryBreakdown model_state_bytes(double params, int64_t dp, int64_t zero_stage, const DeviceSpec& d,
                                  int64_t moment_bytes) {
  // Note [Model-state bytes]: on a mixed-precision device the compute copies and gradients
  // are in its dtype and fp32 masters sit beside the moments.
  rank::StateWidths w;
  w.param = w.grad = d.mixed_precision ? double(d.dtype_bytes) : 4.0;
  w.master = d.mixed_precision ? 4.0 : 0.0;
  w.moment = double(moment_bytes);
  const rank::StateBytes s = rank::model_state_bytes(params, dp, int(zero_stage), w);
  MemoryBreakdown m;
  m.params = s.params, m.grads = s.grads, m.optimizer = s.optimizer;
  return m;
}

}  // namespace loom::sim
