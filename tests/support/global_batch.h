// Test helper: Note [Epoch order]'s promise that the global batch is a function of the step.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "loom/data/loader.h"

namespace loom::testing_support {

// Step `step`'s global batch of 8 rows of T tokens from `src`, read whole by one loader,
// equals what dp 4 ranks read in 2 micro-batches each, concatenated in rank and micro-batch
// order: the same rows in the same order.
inline void expect_same_batch_on_dp4_x2(const data::TokenSource& src, int64_t T, uint64_t seed, int64_t step) {
  const int64_t B = 8;
  const DataLoader one(src, T, seed, 0, 1, DataOrder::kEpoch);
  std::vector<int32_t> whole(size_t(B * T)), tgt(size_t(B * T));
  one.train_batch(step, 0, 1, B, whole.data(), tgt.data());
  std::vector<int32_t> pieces;
  for (int k = 0; k < 4; k++) {
    const DataLoader rank(src, T, seed, k, 4, DataOrder::kEpoch);
    for (int m = 0; m < 2; m++) {
      std::vector<int32_t> tok(static_cast<size_t>(T)), t2(static_cast<size_t>(T));
      ASSERT_EQ(rank.train_batch(step, m, 2, B, tok.data(), t2.data()), 1);
      pieces.insert(pieces.end(), tok.begin(), tok.end());
    }
  }
  EXPECT_EQ(pieces, whole) << "step " << step;
}

}  // namespace loom::testing_support
