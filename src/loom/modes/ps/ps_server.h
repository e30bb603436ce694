// A parameter-server job's two sides beyond the protocol (Note [Parameter server] and Note
// [Asynchronous parameter server] in modes/ps/ps.h): the server's run, and the run-wide
// figures every rank agrees on at the end.
#pragma once

#include <cstdint>

#include "loom/core/config.h"
#include "loom/train/train_options.h"

namespace loom::comm {
class World;
class Group;
}  // namespace loom::comm

namespace loom::parallel {
class PsWorker;
}

namespace loom {

class DataLoader;
class Reporter;
struct RankContext;

// Serves its key range until the run ends (train.steps rounds under sync; W x train.steps
// pushes otherwise); returns a summary with no losses (the workers report them).
TrainSummary run_ps_server(const Config& cfg, const TrainOptions& opt, comm::World& world);

// Collective over the world, every rank at its end: fills sum.ps_pushes and the staleness
// figures from the servers' records (a worker passes zeros).
void agree_ps_figures(comm::Group& world_group, TrainSummary& sum, double pushes, double max_stale, double mean_stale);

// A worker after its last step: under async / ssp `tokens` (this worker's) becomes the
// workers' sum; the servers' figures are agreed and logged.
void finish_ps_worker(const Config& cfg, const RankContext& rc, const parallel::PsWorker& ps, Reporter& rep,
                      TrainSummary& sum, int64_t& tokens);

// Note [Sparse embeddings]: before step `step`'s push, the rows its batch read (every
// micro-batch of this worker) and the rows the next step reads, or the whole table before a
// validation and at the end.
void choose_ps_rows(const Config& cfg, const DataLoader& data, parallel::PsWorker& ps, int64_t step, int64_t mb,
                    int64_t T);

}  // namespace loom
