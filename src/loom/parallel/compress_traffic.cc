#include "loom/parallel/compress_traffic.h"

#include <algorithm>
#include <cmath>

namespace loom::parallel {

CompressTraffic bucket_traffic(CompressKind kind, double ratio, int64_t rank, const std::vector<ParamSpec>& specs,
                               int first, int last, int64_t count, int64_t dp) {
  CompressTraffic t;
  const double n = double(count);
  switch (kind) {
    case CompressKind::kNone: t.reduce_bytes = 4 * n, t.collectives = 1; break;
    case CompressKind::kBf16: t.reduce_bytes = 2 * n, t.collectives = 1, t.compute_bytes = 6 * n; break;
    case CompressKind::kInt8:  // one f32 scale per 256 values (Note [Compressed all-reduce])
      t.reduce_bytes = n + 4 * std::ceil(n / 256), t.collectives = 1, t.compute_bytes = 5 * n;
      break;
    case CompressKind::kTopK:
    case CompressKind::kTopKAdam: {  // Note [Top-k Adam]: the same messages, of the momentum
      const double k = std::clamp(std::ceil(ratio * n), 1.0, n);
      t.gather_block_bytes = 8 * k;  // (int32 index, f32 value) pairs
      t.collectives = 2;
      // v += g (12 B), |v| copy and selection (~12 B), the scatter-add result (8 B)
      t.compute_bytes = 32 * n;
      break;
    }
    case CompressKind::kTernGrad:
      if (terngrad_gathers(dp)) t.gather_block_bytes = std::ceil(n / 4);  // 2 bits per value
      else t.reduce_bytes = n;                                          // int8 sums
      t.reduce_bytes += 4;                                              // the shared scale (max)
      t.collectives = 2;
      t.compute_bytes = 24 * n;  // statistics, clip, encode, decode
      break;
    case CompressKind::kOneBitAdam:  // Note [1-bit Adam]: per tensor a chunk's signs and scale, twice
    case CompressKind::kZeroOneAdam:
      for (int i = first; i <= last; i++)
        t.gather_block_bytes += 2 * (std::ceil(std::ceil(double(specs[size_t(i)].numel) / double(dp)) / 8) + 4);
      t.collectives = 4;
      // the momentum update (12 B), the worker's encode (residual in, out, signs: ~9 B) and
      // decode (4 B), the server's share (~9 B / dp, rounded up to a pass)
      t.compute_bytes = 32 * n;
      break;
    case CompressKind::kPowerSgd: {
      double dense = 0;
      t.collectives = 3;
      for (int i = first; i <= last; i++) {
        const ParamSpec& s = specs[size_t(i)];
        if (!powersgd_compresses(s, rank)) {
          dense += double(s.numel);
          continue;
        }
        const double rows = double(s.shape[0]), cols = double(s.shape[1]);
        t.reduce_bytes += 4 * double(rank) * (rows + cols);
        t.compute_bytes += 3 * 4 * rows * cols;  // P = M Q, Q = M^T P, P Q^T: each one pass over M
      }
      t.reduce_bytes += 4 * dense;
      t.compute_bytes += 20 * n;  // M = G + E, E = M - G', copies of the exact tensors
      break;
    }
  }
  return t;
}

CompressTraffic adasum_traffic(int first, int last, int64_t count, int64_t dp) {
  CompressTraffic t;
  int levels = 0;
  for (int64_t d = 1; d < dp; d *= 2) levels++;
  t.reduce_bytes = 4 * double(count);
  t.gather_block_bytes = 24.0 * double(last - first + 1) * levels;
  t.collectives = 2 * levels + 1;
  t.compute_bytes = 24 * double(count);  // per level: read both halves, write one (the pieces halve)
  return t;
}

}  // namespace loom::parallel
