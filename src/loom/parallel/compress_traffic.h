// What a gradient compressor moves and computes per bucket: the one formula the engine's
// compressors report and the simulator prices (Note [Gradient compressors] in compress.h).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/config.h"
#include "loom/model/layout.h"

namespace loom::parallel {

// PowerSGD compresses a (rows, cols) matrix only when P and Q together are at most half of
// it (PyTorch's PowerSGD hook uses the same minimum compression rate of 2).
inline bool powersgd_compresses(const ParamSpec& s, int64_t rank) {
  return s.shape.size() == 2 && (s.shape[0] + s.shape[1]) * rank * 2 <= s.numel;
}

// TernGrad's wire: the 2-bit codes all-gathered ((dp - 1) n / 4 bytes sent) while that is
// less than a ring all-reduce of 1-byte integer sums (2 (dp - 1) / dp n), i.e. up to dp 8;
// beyond, the int8 sums (exact: |sum| <= dp <= kTernGradMaxDp).
inline constexpr int64_t kTernGradMaxDp = 127;
inline bool terngrad_gathers(int64_t dp) { return dp <= 8; }

struct CompressTraffic {
  double gather_block_bytes = 0;  // one rank's block of an all-gather (top-k pairs, ternary codes)
  double reduce_bytes = 0;        // payload of ring all-reduces (PowerSGD's P, Q and exact tensors)
  int collectives = 0;            // calls per bucket (latency terms)
  double compute_bytes = 0;       // memory passes of encode/decode (and PowerSGD's skinny, memory-bound products)
  // Bytes this rank sends per reduce at dp ranks: a ring all-gather sends dp - 1 blocks, a
  // ring all-reduce 2 (dp - 1) / dp of its payload.
  double wire_bytes(int64_t dp) const {
    return gather_block_bytes * double(dp - 1) + reduce_bytes * 2.0 * double(dp - 1) / double(dp);
  }
};

// The traffic of one bucket holding tensors [first, last] of `specs` (`count` floats with
// padding) under `kind` with its parameters, over `dp` ranks. kNone / kBf16 / kInt8: the
// ring all-reduce's payload at 4, 2 and 1 + 4/256 bytes per value.
CompressTraffic bucket_traffic(CompressKind kind, double ratio, int64_t rank, const std::vector<ParamSpec>& specs,
                               int first, int last, int64_t count, int64_t dp);

// Adasum (Note [Adasum]) on a bucket of tensors [first, last], `count` floats, dp ranks: the
// halving sends (dp - 1) / dp of the bucket and the final all-gather as much again (a ring
// all-reduce's bytes), plus per level one all-gather of three doubles per tensor.
CompressTraffic adasum_traffic(int first, int last, int64_t count, int64_t dp);

}  // namespace loom::parallel
