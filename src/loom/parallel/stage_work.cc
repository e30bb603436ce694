// The stages' blocks and their work in make_schedule's units (Note [ZB-V by stage work]).
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

std::vector<int> stage_layers(int layers, int stages, const std::vector<int>& split) {
  if (split.empty()) {
    LOOM_CHECK(stages >= 1 && layers >= stages, "cannot split ", layers, " layers into ", stages,
               " pipeline stages: every stage needs a layer");
    return even_stage_split(layers, stages);
  }
  int sum = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    const bool end = i == 0 || i + 1 == split.size();  // Note [Stage split]: the ends may hold no blocks
    LOOM_CHECK(split[i] >= (end ? 0 : 1), "pipeline split has stage ", i, " of ", split.size(), " with ", split[i],
               " layers");
    sum += split[i];
  }
  LOOM_CHECK(int(split.size()) == stages && sum == layers, "pipeline split of ", split.size(), " stages with ", sum,
             " layers does not match ", stages, " stages of a ", layers, "-layer model");
  return split;
}

namespace {
// Per token, a block's forward FLOPs: its linear layers and causal attention (q k^T and p v
// over seq / 2 keys on average); 0 for a model without a shape yet.
double block_flops(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const double d = double(m.d_model), kv = double(m.kv_heads > 0 ? m.kv_heads : m.heads) * double(m.head_dim());
  const double seq = double(cfg.train.seq > 0 ? cfg.train.seq : m.ctx);
  const double mats = m.arch == Arch::kLlama ? 3 : 2;  // SwiGLU's gate, up and down; GPT's fc and proj
  return 2 * (d * (d + 2 * kv) + d * d + mats * d * double(m.ffn)) + 2 * seq * d;
}
// h of Note [ZB-V by stage work]: the head's logits' forward FLOPs a token, in blocks.
double head_in_blocks(const Config& cfg) {
  const double block = block_flops(cfg);
  return block > 0 ? 2 * double(cfg.model.d_model) * double(cfg.model.vocab) / block : 0;
}
}  // namespace

double vocab_pass_work(const Config& cfg, int pp) {
  return cfg.parallel.pp_vocab && pp > 0 ? 12 * head_in_blocks(cfg) / pp : 0;
}

StageWork stage_work(const Config& cfg, int pp, int vpp) {
  const ModelConfig& m = cfg.model;
  if (!(block_flops(cfg) > 0)) return {};  // a model without a shape yet: equal stages
  const double head = cfg.parallel.pp_vocab ? 0 : head_in_blocks(cfg);  // in blocks
  const int stages = pp * vpp;
  const std::vector<int> layers = stage_layers(int(m.layers), stages, cfg.parallel.layer_split(m.layers));
  StageWork out(static_cast<size_t>(stages));
  for (int v = 0; v < stages; ++v) {
    const double n = double(layers[size_t(v)]);
    out[size_t(v)] = {4 * n, 5 * n, 3 * n};
    if (v == stages - 1) out[size_t(v)][0] += 12 * head;  // the fused LM head: its backward runs in F
  }
  return out;
}

}  // namespace loom::parallel
