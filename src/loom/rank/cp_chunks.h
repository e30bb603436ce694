// Note [Context-parallel chunks]
// Context parallelism over n ranks splits every sequence of T tokens by position. The causal
// mask makes a query at position t attend to t + 1 keys, so the plain split (rank r holds
// [r T / n, (r + 1) T / n)) leaves the last rank about 2n - 1 times the attention work of the
// first. zigzag (the load balance of Megatron-core's context parallelism and Llama 3's
// all-gather scheme) cuts T into 2n chunks of c = T / 2n and gives rank r chunks r and
// 2n - 1 - r: a row of chunk r sees (r + 1/2) c keys on average and one of chunk 2n - 1 - r
// (2n - r - 1/2) c, so a rank's c + c rows see 2n c^2 keys in all, the same on every rank.
// A rank's rows are its positions in ascending order
// (the attention kernels read runs of consecutive positions: Note [Context-parallel
// attention] in kernels/ops.inc).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/config_enums.h"

namespace loom::rank {

using loom::CpSplit;

// Rank `rank`'s global positions, ascending (T / cp of them). Throws loom::Error when T does
// not divide: zigzag needs T a multiple of 2 cp, plain of cp.
std::vector<int32_t> cp_positions(int64_t T, int cp, int rank, CpSplit split);

// Where every position lives: owner[j] = (rank, index among its rows), j = 0 .. T - 1, so a
// rank-major all-gather of the ranks' rows can be put in position order.
struct CpSlot {
  int rank = 0;
  int32_t index = 0;
};
std::vector<CpSlot> cp_owners(int64_t T, int cp, CpSplit split);

}  // namespace loom::rank
