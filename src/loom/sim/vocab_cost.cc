// Note [Vocabulary passes] (parallel/schedule.h) priced: one rank's share of each pass.
#include "loom/sim/replay.h"

namespace loom::sim {

// Per rank and micro-batch, with the vocabulary split over pp x tp:
//  - the head and loss: logits of V / (pp t) rows (the GEMM at that width, the fp32
//    cross-entropy over them), and its collectives over the pipeline: the last stage's
//    output broadcast (n x h), the softmax's max and sums all-reduced (3 n floats, as tp's),
//    the input gradient reduced onto the last stage (n x h); the final norm is priced on
//    every rank (it runs on the last: a memory pass of 2 n h, small beside the logits);
//  - an embedding lookup: each rank writes every row (its own tokens' rows, zeros elsewhere),
//    then the partial sums are reduced onto the first stage (n x h);
//  - its gradient: the first stage's broadcast (n x h), then each rank adds its rows.
// loom's engine makes the head's gradients with its loss (Note [Fused loss backward]), so
// the head pass is forward and backward together in every framework here.
void price_vocab_passes(Setup& s) {
  const ModelConfig& model = s.plan.cfg.model;
  LayerShape slice = s.x;
  slice.V = s.x.V / double(s.pp);
  UnitCost head = unit_cost(s.cluster, s.pl, head_forward_ops(slice), Recompute::kNone, s.plan.tp_overlap);
  fuse_backward_into_forward(head);
  const UnitCost embed = unit_cost(s.cluster, s.pl, embedding_forward_ops(s.x), Recompute::kNone, s.plan.tp_overlap);
  const GroupShape pipe = place_group(s.cluster, s.pp, s.tp * s.cp * s.dp);
  const double rows = s.x.tokens() * s.x.h * s.x.dtype_bytes;
  s.vocab_head = head.fwd;
  s.vocab_head.vocab = collective_time_s(s.cluster, OpKind::kBroadcast, rows, pipe) +
                       collective_time_s(s.cluster, OpKind::kAllReduce, 3 * s.x.tokens() * 4, pipe) +
                       collective_time_s(s.cluster, OpKind::kReduce, rows, pipe);
  s.vocab_embed = embed.fwd;
  s.vocab_embed.vocab = collective_time_s(s.cluster, OpKind::kReduce, rows, pipe);
  s.vocab_embed_grad = embed.bwd;
  s.vocab_embed_grad.vocab = collective_time_s(s.cluster, OpKind::kBroadcast, rows, pipe);
  const double slices = double(s.x.vocab_t()) * double(s.pp);
  s.vocab_params = embedding_params(model, int64_t(slices)).per_tp_rank + head_params(model, int64_t(slices)).per_tp_rank;
}

}  // namespace loom::sim
