// What a rank does, in types, from the config alone (issue 52's plan library: the engine,
// the simulator and the planner ask the same pure functions).
//
// Note [Rank duties]
// A rank of a layout has one role, one gradient path and one update rule, and keeps its
// parameters and optimizer moments in one place each:
//   role     trainer (the training mesh's ranks), or under parallel.ps_servers a PS worker
//            (the mesh's ranks) or a PS server (the ranks after them, Note [Parameter server]);
//   grad     how its gradients cross the data-parallel group: not at all (dp 1), the bucketed
//            all-reduce (ZeRO 0), the reduce-scatter at the last micro-batch (ZeRO-1, and ZeRO-2
//            in a pipeline), one per micro-batch (ZeRO-2/3 otherwise), one exact mean of each
//            update's whole gradient (2bw / pipedream / pipemare at dp > 1, Note [Streams with
//            data parallelism]), or pushed to the servers; the compressors and Adasum ride on
//            the first three (whole buckets on their steps, Note [Compressed ZeRO-2/3]) and the
//            1-bit family's optimizer sends what it needs (CompressSpec::sync_at);
//   update   Note [Update rules] (engine/engine.h): synchronous, 2bw's delayed updates, the
//            parameter server's push/pull, a stream's per-minibatch stage updates (their
//            flushing references are a test's choice, not the config's);
//   places   parameters and moments in memory, in the offload file (offload.*), or on the
//            servers (a PS worker keeps no moments; a server keeps its key ranges of both).
// Its model-state bytes are rank::model_state_bytes (Note [Model-state bytes]).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/config.h"
#include "loom/model/layout.h"

namespace loom::rank {

enum class Role { kTrainer, kPsWorker, kPsServer };
enum class GradPath { kNone, kAllReduce, kReduceScatter, kShardEveryMicro, kStreamMean, kPsPush };
enum class UpdateRule { kSynchronous, kTwoBw, kParameterServer, kStream, kStreamReference };
enum class Place { kMemory, kOffloadFile, kServers };

struct Duties {
  Role role = Role::kTrainer;
  GradPath grad = GradPath::kNone;
  UpdateRule update = UpdateRule::kSynchronous;
  Place params = Place::kMemory, moments = Place::kMemory;
  Precision precision = Precision::kFp32;
};

Role role_of(const Config& cfg, int64_t global_rank);
// A trainer's or PS worker's gradient path (kNone for a server).
GradPath grad_path(const Config& cfg, Role role = Role::kTrainer);
UpdateRule update_rule(const Config& cfg, Role role = Role::kTrainer);
Duties duties(const Config& cfg, int64_t global_rank);
// A stream's rules: the stage updates inside the pipeline's stream (2bw, pipedream, pipemare).
inline bool in_stream(UpdateRule u) { return u == UpdateRule::kTwoBw || u == UpdateRule::kStream; }

// Note [Parameter server] (modes/ps/ps.h): the servers' ranges of a flat buffer of `floats`
// floats: server s holds keys [k_s, k_{s+1}) (the last key may be short), the counts
// differing by at most one. Throws loom::Error when there are fewer keys than servers.
inline constexpr int64_t kPsKeyFloats = 1024;  // one key: 4 KiB of fp32 weights
std::vector<FlatRange> ps_partition(int64_t floats, int servers, int64_t key_floats = kPsKeyFloats);

// Note [Parameter server with model parallelism]: a PS job's tp x pp workers of one dp
// replica hold C = tp x pp model shards; shard c = pp_rank x tp + tp_rank has its own S =
// parallel.ps_servers servers, global ranks p.world() + c S + s.
struct PsPlace {
  int shard = 0;   // c
  int index = 0;   // s, within the shard's servers
  int worker = 0;  // the shard's dp-0 worker rank (its layout is the shard's)
};
PsPlace ps_place(const ParallelConfig& p, int64_t server_rank);
// A worker rank's shard, and the global ranks of that shard's servers.
int ps_shard_of(const ParallelConfig& p, int64_t worker_rank);
std::vector<int> ps_servers_of(const ParallelConfig& p, int shard);

}  // namespace loom::rank
