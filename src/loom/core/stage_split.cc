// The default blocks per pipeline stage (Note [Stage split]).
#include <algorithm>
#include <cmath>

#include "loom/core/config.h"

namespace loom {

// Note [Stage split]
// The blocks of each virtual stage, in stage order. Given parallel.pp_layers, those (the
// first and last may be 0: a stage that only embeds, or only runs the final norm, head
// and loss). Else the even split: L blocks over S stages, floor(L / S) each and the
// remainder one each to the stages nearest the middle, since the ends also embed and run
// the head. Megatron-LM's accounting counts the embedding and/or the loss as one more
// layer: L + k "layers" split evenly, then the first (embedding) and/or the last (loss)
// stage gives one back; Llama 3.1 405B's 126 blocks over pp 8 x vpp 8 = 64 stages are 128
// over 64, 2 each, with 1 block beside the embedding and 1 before the head. (Megatron
// requires L + k divisible by S; loom gives the remainder to the middle as above.)
// With parallel.pp_vocab the ends embed and run the head no more than any stage (the
// vocabulary passes share them over every rank), so what counts is each rank's blocks: the
// remainder still goes to the stages nearest the middle, but a rank takes a second one only
// once every rank has one. That changes zb-v, whose two middle stages are one rank's (the V's
// turn; interleaved's fall on different ranks): config B's 6 blocks at pp 2 were 1, 2, 2, 1,
// rank 1 holding 4 against rank 0's 2 (simulated bubble 12.2%, floor 11.8%); now 2, 2, 1, 1, 3
// each (3.7%, floor 0), the step 9% shorter, and at pp 4 (10 blocks) 25.7% -> 13.7%
// (docs/log/benchmarks.md, session 64). Without pp_vocab zb-v's ends, both rank 0's, embed and
// run the head, and rank 1 should take more.
namespace {

// Stages by distance from the middle, the earlier first on a tie (the later with later_first).
std::vector<int> middle_first(int stages, bool later_first = false) {
  std::vector<int> order(static_cast<size_t>(stages));
  for (int i = 0; i < stages; i++) order[size_t(i)] = later_first ? stages - 1 - i : i;
  const double mid = (stages - 1) / 2.0;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return std::abs(a - mid) < std::abs(b - mid); });
  return order;
}

}  // namespace

std::vector<int> even_stage_split(int layers, int stages) {
  std::vector<int> out(size_t(stages), layers / stages);
  const std::vector<int> order = middle_first(stages);
  for (int i = 0; i < layers % stages; i++) out[size_t(order[size_t(i)])]++;
  return out;
}

std::vector<int> rank_balanced_stage_split(int layers, int pp, int vpp, ScheduleKind kind, bool later_first) {
  const int stages = pp * vpp;
  std::vector<int> out(size_t(stages), layers / stages), extra(size_t(pp), 0);
  const std::vector<int> order = middle_first(stages, later_first);
  std::vector<bool> given(size_t(stages), false);
  // Round k gives one block to each stage, middle first, whose rank has k so far.
  for (int left = layers % stages, k = 0; left > 0; ++k)
    for (int v : order) {
      int& e = extra[size_t(stage_rank(kind, pp, v))];
      if (left == 0 || given[size_t(v)] || e != k) continue;
      out[size_t(v)]++, e++, given[size_t(v)] = true, left--;
    }
  return out;
}

std::vector<int> ParallelConfig::layer_split(int64_t layers) const {
  if (!pp_layers.empty()) return {pp_layers.begin(), pp_layers.end()};
  const int stages = int(pp * vpp);
  if (pp_vocab) return rank_balanced_stage_split(int(layers), int(pp), int(vpp), schedule);
  if (!pp_account_embedding && !pp_account_loss) return even_stage_split(int(layers), stages);
  std::vector<int> out = even_stage_split(int(layers) + int(pp_account_embedding) + int(pp_account_loss), stages);
  if (pp_account_embedding) out.front()--;
  if (pp_account_loss) out.back()--;
  return out;
}

}  // namespace loom
