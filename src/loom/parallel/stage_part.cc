#include "loom/parallel/stage_part.h"

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

ModelPart pipeline_part(const std::vector<int>& counts, int pp, int vpp, int pp_rank) {
  LOOM_CHECK(int(counts.size()) == pp * vpp, "pipeline part: ", counts.size(), " stage sizes for pp ", pp,
             " x vpp ", vpp);
  ModelPart part;
  std::vector<int> starts(counts.size() + 1, 0);
  for (size_t v = 0; v < counts.size(); v++) starts[v + 1] = starts[v] + counts[v];
  for (int c = 0; c < vpp; c++) {
    const int v = c * pp + pp_rank;
    part.chunks.push_back({starts[size_t(v)], starts[size_t(v) + 1]});
  }
  part.embed = pp_rank == 0;
  part.head = pp_rank == pp - 1;
  return part;
}

ModelPart rank_part(const Config& cfg, int pp_rank, int tp_rank) {
  const ParallelConfig& p = cfg.parallel;
  ModelPart part;
  if (p.pp > 1) {
    const std::vector<int> counts = stage_layers(int(cfg.model.layers), int(p.pp * p.vpp), p.layer_split());
    part = pipeline_part(counts, int(p.pp), int(p.vpp), pp_rank);
  }
  part.tp = int(p.tp), part.tp_rank = tp_rank;
  part.vocab_parallel = p.vocab_parallel;
  return part;
}

}  // namespace loom::parallel
