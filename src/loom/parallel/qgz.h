// ZeRO++'s quantised gradient reduce-scatter (qgZ).
//
// Note [qgZ]
// parallel.zeropp_qgz = true (Wang et al., "ZeRO++: Extremely Efficient Collective
// Communication for Giant Model Training", 2023, qgZ) replaces ZeRO-2/3's fp32 reduce-scatter
// of a bucket by an all-to-all of int8 blocks: each rank quantises the dp - 1 pieces it does
// not own with the codec of Note [Compressed all-reduce] (an fp32 scale max|x| / 127 per
// kQuantBlock values, q = round(x / scale)), sends piece j to rank j, and adds the decoded
// pieces it receives to its own piece, which it never quantises, in rank order. One
// quantisation per value (ZeRO++ quantises in 4 bits and reduces in two hierarchical hops;
// loom takes one hop in int8, the codec the ring already has), so each reduced value is
// within the sum over the other ranks of max|block| / 254 of the exact sum, and a rank sends
// (dp - 1) / dp x (1 + 4 / 256) bytes a value where the ring sends 4 (dp - 1) / dp. A piece
// holding a non-finite value sends NaN scales, so the optimizer's overflow check still sees it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/group.h"

namespace loom::parallel {

class QgzScatter {
 public:
  // Quantises every piece of `all` (dp equal pieces) but rank `dp.group_rank()`'s and
  // starts the all-to-all. `all` may change after this returns.
  QgzScatter(comm::Group& dp, std::span<const float> all);
  comm::Work take_work() { return std::move(work_); }
  // After the work finished: own += every other rank's decoded piece (rank order), then
  // own *= scale. Once; later calls do nothing.
  void complete(std::span<float> own, float scale);
  // Bytes this rank sends for a bucket of `count` floats over `dp` ranks.
  static double wire_bytes(int64_t count, int64_t dp);

 private:
  int dp_, me_;
  size_t piece_, wire_;
  std::vector<uint8_t> send_, recv_;
  comm::Work work_;
  bool done_ = false;
};

}  // namespace loom::parallel
