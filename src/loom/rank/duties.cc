// Note [Rank duties] (duties.h).
#include "loom/rank/duties.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::rank {

std::vector<FlatRange> ps_partition(int64_t floats, int servers, int64_t key_floats) {
  LOOM_CHECK(servers >= 1 && key_floats >= 1 && floats >= 0, "ps_partition: ", servers, " servers, keys of ",
             key_floats, " floats");
  const int64_t keys = (floats + key_floats - 1) / key_floats;
  LOOM_CHECK(keys >= servers, "parallel.ps_servers = ", servers, " but the model has only ", keys, " keys of ",
             key_floats, " floats (", floats, " parameters): use at most ", keys, " servers");
  std::vector<FlatRange> out;
  int64_t key = 0;
  for (int s = 0; s < servers; ++s) {
    const int64_t n = keys / servers + (s < keys % servers ? 1 : 0);
    const int64_t lo = key * key_floats, hi = std::min(floats, (key + n) * key_floats);
    out.push_back({lo, hi - lo});
    key += n;
  }
  return out;
}

PsPlace ps_place(const ParallelConfig& p, int64_t server_rank) {
  const int64_t i = server_rank - p.world();
  LOOM_ASSERT(p.ps_servers > 0 && i >= 0 && i < p.servers(), "rank ", server_rank, " is no parameter server");
  PsPlace out;
  out.shard = int(i / p.ps_servers), out.index = int(i % p.ps_servers);
  const int64_t pp_rank = out.shard / p.tp, tp_rank = out.shard % p.tp;
  out.worker = int(pp_rank * p.dp * p.tp + tp_rank);  // the training mesh (pp, dp, tp) at dp 0
  return out;
}

int ps_shard_of(const ParallelConfig& p, int64_t worker_rank) {
  LOOM_ASSERT(worker_rank >= 0 && worker_rank < p.world(), "rank ", worker_rank, " is no worker");
  return int(worker_rank / (p.dp * p.tp) * p.tp + worker_rank % p.tp);
}

std::vector<int> ps_servers_of(const ParallelConfig& p, int shard) {
  std::vector<int> out;
  for (int64_t s = 0; s < p.ps_servers; ++s) out.push_back(int(p.world() + shard * p.ps_servers + s));
  return out;
}

Role role_of(const Config& cfg, int64_t global_rank) {
  const ParallelConfig& p = cfg.parallel;
  if (p.ps_servers == 0) return Role::kTrainer;
  return global_rank < p.world() ? Role::kPsWorker : Role::kPsServer;
}

GradPath grad_path(const Config& cfg, Role role) {
  const ParallelConfig& p = cfg.parallel;
  if (role == Role::kPsServer) return GradPath::kNone;
  if (role == Role::kPsWorker) return GradPath::kPsPush;
  if (p.dp_ranks() < 2) return GradPath::kNone;
  if (p.pp > 1 && streams(p.schedule)) return GradPath::kStreamMean;
  if (p.zero >= 2) return p.pp > 1 ? GradPath::kReduceScatter : GradPath::kShardEveryMicro;
  // ZeRO-1 updates the own pieces only (Note [Sharded buckets]): their mean is all it needs.
  return p.zero == 1 ? GradPath::kReduceScatter : GradPath::kAllReduce;
}

UpdateRule update_rule(const Config& cfg, Role role) {
  const ParallelConfig& p = cfg.parallel;
  if (role != Role::kTrainer) return UpdateRule::kParameterServer;
  if (p.pp > 1 && p.schedule == ScheduleKind::k2BW) return UpdateRule::kTwoBw;
  if (p.pp > 1 && updates_per_batch(p.schedule)) return UpdateRule::kStream;
  return UpdateRule::kSynchronous;
}

Duties duties(const Config& cfg, int64_t global_rank) {
  Duties d;
  d.role = role_of(cfg, global_rank);
  d.grad = grad_path(cfg, d.role);
  d.update = update_rule(cfg, d.role);
  const bool file = cfg.offload.optimizer == OffloadTier::kDisk;
  d.moments = d.role == Role::kPsWorker ? Place::kServers : file ? Place::kOffloadFile : Place::kMemory;
  d.params = d.role == Role::kPsWorker                           ? Place::kMemory  // a copy of the servers'
             : file && cfg.offload.params == OffloadTier::kDisk ? Place::kOffloadFile
                                                                 : Place::kMemory;
  if (d.role == Role::kPsServer) d.params = d.moments = Place::kMemory;
  d.precision = cfg.train.precision;
  return d;
}

}  // namespace loom::rank
