#include "loom/parallel/stage_part.h"

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

ModelPart pipeline_part(const std::vector<int>& counts, int pp, int vpp, int pp_rank, ScheduleKind kind) {
  LOOM_CHECK(int(counts.size()) == pp * vpp, "pipeline part: ", counts.size(), " stage sizes for pp ", pp,
             " x vpp ", vpp);
  ModelPart part;
  std::vector<int> starts(counts.size() + 1, 0);
  for (size_t v = 0; v < counts.size(); v++) starts[v + 1] = starts[v] + counts[v];
  const int last = pp * vpp - 1;
  part.embed = part.head = false;
  for (int c = 0; c < vpp; c++) {
    const int v = virtual_stage(kind, pp, pp_rank, c);
    part.chunks.push_back({starts[size_t(v)], starts[size_t(v) + 1]});
    // The model embeds in its first chunk and runs the head after its last.
    if (v == 0) LOOM_ASSERT(c == 0, "the embedding stage must be a rank's first chunk");
    if (v == last) LOOM_ASSERT(c == vpp - 1, "the head stage must be a rank's last chunk");
    part.embed = part.embed || v == 0;
    part.head = part.head || v == last;
  }
  return part;
}

ModelPart rank_part(const Config& cfg, int pp_rank, int tp_rank) {
  const ParallelConfig& p = cfg.parallel;
  ModelPart part;
  if (p.pp > 1) {
    const std::vector<int> counts = stage_layers(int(cfg.model.layers), int(p.pp * p.vpp), p.layer_split(cfg.model.layers));
    part = pipeline_part(counts, int(p.pp), int(p.vpp), pp_rank, p.schedule);
  }
  part.tp = int(p.tp), part.tp_rank = tp_rank;
  part.vocab_parallel = p.vocab_parallel;
  if (p.pp_vocab) {  // Note [Vocabulary passes]
    part.vocab_pp = int(p.pp), part.vocab_pp_rank = pp_rank;
    part.vocab_head_pp_rank = stage_site(p.schedule, int(p.pp), int(p.vpp), int(p.pp * p.vpp) - 1).rank;
  }
  return part;
}

}  // namespace loom::parallel
