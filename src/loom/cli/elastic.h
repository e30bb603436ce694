// `loom train --hosts ... --elastic MIN:MAX`: a job that re-forms on the hosts it has left
// (Note [Elastic launch]).
#pragma once

#include <vector>

#include "loom/core/config.h"
#include "loom/core/hosts.h"

namespace loom::cli {

// Runs the job on the first MAX of `hosts` (the rest are spares) and, each time hosts fail,
// again on the survivors and spares with the layout of Note [Elastic shapes], resuming from the
// newest checkpoint, and on more hosts when lost or new ones answer (Note [Elastic growth]);
// returns the exit code. `cfg` is the job's config as given.
// `spec` is --hosts as given (a hostfile is read again to find hosts it gains).
int run_elastic(const std::string& spec, const std::vector<HostSlots>& hosts, const std::string& elastic,
                const Config& cfg, int argc, char** argv);

}  // namespace loom::cli
