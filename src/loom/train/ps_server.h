// A parameter server's part of a training run (Note [Parameter server] in parallel/ps.h).
#pragma once

#include "loom/core/config.h"
#include "loom/train/train_options.h"

namespace loom::comm {
class World;
}

namespace loom {

// Serves its key range for train.steps synchronous rounds; returns a summary with no losses
// (the workers report them).
TrainSummary run_ps_server(const Config& cfg, comm::World& world);

}  // namespace loom
