// `loom train --hosts ... --elastic MIN:MAX`: a job that re-forms on the hosts it has left
// (Note [Elastic launch]).
#pragma once

#include <vector>

#include "loom/core/config.h"
#include "loom/core/hosts.h"

namespace loom::cli {

// Runs the job on the first MAX of `hosts` (the rest are spares) and, each time hosts fail,
// again on the survivors and spares with the layout of Note [Elastic shapes], resuming from the
// newest checkpoint; returns the exit code. `cfg` is the job's config as given.
int run_elastic(const std::vector<HostSlots>& hosts, const std::string& elastic, const Config& cfg, int argc,
                char** argv);

}  // namespace loom::cli
