// Which layers a pipeline rank holds: the model part (chunks, embedding, head, tp slice)
// that plan_rank() gives a rank and the simulator prices, from one function. Pure (library
// loom_schedule: core and the layout tables only).
#pragma once

#include <vector>

#include "loom/core/config.h"
#include "loom/model/layout.h"

namespace loom::parallel {

// The model part of pipeline rank `pp_rank`: chunk c is virtual_stage(kind, pp, pp_rank, c)
// (schedule.h); the rank embeds if it runs stage 0 and runs the head if it runs the last.
ModelPart pipeline_part(const std::vector<int>& stage_layer_counts, int pp, int vpp, int pp_rank,
                        ScheduleKind kind = ScheduleKind::k1F1B);

// The part pipeline rank `pp_rank`, tp rank `tp_rank` holds under cfg.parallel: the whole
// model without a pipeline, else its chunks of parallel.pp_layers (or the even split).
ModelPart rank_part(const Config& cfg, int pp_rank, int tp_rank);

}  // namespace loom::parallel
