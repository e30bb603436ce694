// Parameter-server data parallelism (Note [Parameter server]).
//
// Note [Parameter server]
// Li et al., "Scaling Distributed Machine Learning with the Parameter Server", OSDI 2014.
// parallel.ps_servers = S adds S ranks to a data-parallel job: global ranks 0 .. dp - 1 are
// workers (each trains on its share of the global batch, as dp rank r), ranks dp .. dp + S - 1
// servers. The flat parameter buffer is cut into keys of key_floats floats and server s holds
// a contiguous run of them (ps_partition: the runs' lengths differ by at most one key, so the
// bytes balance within one key); it keeps their fp32 weights and AdamW moments and runs the
// optimizer on them. Workers keep whole weights to compute with and no optimizer state.
//
// One step under ps.mode = sync (bulk synchronous parallel): every worker pushes its
// gradient's slice to each server and pulls the slice back updated; a server takes the
// step's pushes of all workers in worker order, whatever order they arrive in, so the sum's
// bits do not depend on timing; averages them, sums the squared norm of the mean over the
// servers (the global norm, for clipping and the log), applies AdamW and answers the pulls.
// That is dp all-reduce training up to the order of the gradient sum. Worker 0 sends the
// initial weights (every worker draws the same ones from the seed). Every transfer goes
// through the world group's point-to-point path, so the ledger, comm.timeout_s and the
// diagnosis of a dead or stalled rank cover it as they cover collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/config.h"
#include "loom/model/layout.h"

namespace loom::comm {
class World;
}

namespace loom::parallel {

inline constexpr int64_t kPsKeyFloats = 1024;  // one key: 4 KiB of fp32 weights

// The servers' ranges of a flat buffer of `floats` floats: server s holds keys [k_s, k_{s+1})
// (the last key may be short). Throws loom::Error when there are fewer keys than servers.
std::vector<FlatRange> ps_partition(int64_t floats, int servers, int64_t key_floats = kPsKeyFloats);

// Collective over the world: the group of this rank's role (the workers, or the servers).
std::unique_ptr<comm::Group> ps_role_group(comm::World& world, int workers, int servers);

// A worker's side of Note [Parameter server].
class PsWorker {
 public:
  // `all`: the world group; servers are global ranks first_server ...
  PsWorker(comm::Group& all, std::vector<FlatRange> ranges, int first_server);
  // Worker 0: the initial weights to every server.
  void init_servers(const float* params);
  // One synchronous step: pushes `grads`' slices, pulls the updated slices into `params`.
  // Returns the global gradient norm (before clipping) the servers computed.
  double push_pull(const float* grads, float* params, int64_t step);
  // Tests: runs before each push (an injected delay reorders arrivals).
  std::function<void(int64_t step)> before_push;

 private:
  comm::Group& all_;
  std::vector<FlatRange> ranges_;
  int first_server_;
  std::vector<float> pulled_;  // one server's slice and the norm's square after it
};

// Tags of a step's messages (each link delivers in order; the tag catches a mix-up), and of
// the initial weights.
int ps_tag(int64_t step);
inline constexpr int kPsInitTag = 16383;  // tags are < 16384 (the comm layer's bound)

}  // namespace loom::parallel
