// Pricing compressed gradient sync (costs.h: compressed_sync).
#include <algorithm>
#include <cmath>

#include "loom/model/layout.h"
#include "loom/parallel/compress_traffic.h"
#include "loom/parallel/stage_part.h"
#include "loom/sim/costs.h"

namespace loom::sim {

// Each tensor is priced as its own bucket: the traffic formulas are per element except
// PowerSGD's, which is per matrix, so the bucket boundaries change only the number of
// calls; those add one latency each (a bucket per parallel.bucket_mb of gradients, every
// bucket making CompressTraffic::collectives calls).
CompressedSync compressed_sync(const ClusterSpec& c, const Config& cfg, int64_t pp_rank, const GroupShape& dp) {
  const ParallelConfig& p = cfg.parallel;
  const ParamLayout layout(cfg.model, {}, parallel::rank_part(cfg, int(pp_rank), 0));
  const auto& specs = layout.specs();
  parallel::CompressTraffic sum, exact;
  double floats = 0;
  int per_bucket = 1;
  for (int i = 0; i < int(specs.size()); i++) {
    const int64_t n = specs[size_t(i)].numel;
    const parallel::CompressTraffic t =
        p.reduce == GradReduce::kAdasum
            ? parallel::adasum_traffic(i, i, n, dp.ranks)
            : parallel::bucket_traffic(p.compress, p.compress_ratio, p.compress_rank, specs, i, i, n, dp.ranks);
    sum.gather_block_bytes += t.gather_block_bytes;
    sum.reduce_bytes += t.reduce_bytes;
    sum.compute_bytes += t.compute_bytes;
    per_bucket = t.collectives;
    floats += double(specs[size_t(i)].numel);
  }
  exact.reduce_bytes = 4 * floats;
  const double G = double(dp.ranks);
  CompressedSync out;
  out.wire_bytes = sum.wire_bytes(dp.ranks);
  out.exact_wire_bytes = exact.wire_bytes(dp.ranks);
  out.comm_s = collective_time_s(c, OpKind::kAllGather, sum.gather_block_bytes * G, dp) +
               collective_time_s(c, OpKind::kAllReduce, sum.reduce_bytes, dp);
  const double buckets = std::max(1.0, std::ceil(4 * floats / (p.bucket_mb * double(1 << 20))));
  const double latency = dp.nodes > 1 ? c.inter.latency_s : c.intra.latency_s;
  out.comm_s += std::max(0.0, buckets * per_bucket - 2) * latency * double(dp.ranks - 1);
  out.compute_s = memory_time_s(c.device, sum.compute_bytes);
  return out;
}

}  // namespace loom::sim
