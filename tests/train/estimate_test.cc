// Note [Part memory estimates]: each part's share of a rank's memory before allocation, with
// the arithmetic written out (1,000 fp32 parameters on the rank: 4,000 bytes a copy).
#include <gtest/gtest.h>

#include "loom/engine/engine.h"

namespace loom {
namespace {

MemoryEstimate estimate(const std::vector<std::string>& sets, int zero, int dp, int pp_rank = 0, int64_t unreduced = 0) {
  const Config cfg = load_config("", sets);
  return estimate_parts({cfg, zero, dp, 1000, 123, 300, pp_rank, unreduced});
}

TEST(PartEstimates, EachPartAddsItsShare) {
  // A plain replica: parameters, gradients, two fp32 moments (8 bytes a parameter).
  MemoryEstimate e = estimate({}, 0, 1);
  EXPECT_EQ(e.params, 4000);
  EXPECT_EQ(e.grads, 4000);
  EXPECT_EQ(e.moment_floats, 1000);
  EXPECT_EQ(e.optimizer, 8000);
  EXPECT_EQ(e.activations, 123);
  EXPECT_EQ(e.total(), 16123);
  // ZeRO-3 at dp 4: own pieces 1,000 + the pool min(4,000, 300 x 4) = 1,200; gradient and
  // moment pieces a quarter, and the others' three quarters of the gradients not yet
  // reduced (Note [Unreduced gradients]): 400 floats at the peak, 1,600 x 3 / 4 = 1,200.
  e = estimate({"parallel.dp=4", "parallel.zero=3"}, 3, 4, 0, 400);
  EXPECT_EQ(e.gather_pool, 1200);
  EXPECT_EQ(e.params, 2200);
  EXPECT_EQ(e.grads, 1000 + 1200);
  EXPECT_EQ(e.moment_floats, 250);
  EXPECT_EQ(e.optimizer, 2000);
  // ZeRO-2 alike; with no peak known, the whole part may be unreduced: 1,000 + 3,000.
  EXPECT_EQ(estimate({"parallel.dp=4", "parallel.zero=2"}, 2, 4, 0, 400).grads, 2200);
  EXPECT_EQ(estimate({"parallel.dp=4", "parallel.zero=3"}, 3, 4).grads, 4000);
  // ZeRO-2 with PowerSGD keeps the step's gradient whole (Note [Compressed ZeRO-2/3]).
  e = estimate({"parallel.dp=4", "parallel.zero=2", "parallel.compress=powersgd"}, 2, 4);
  EXPECT_EQ(e.params, 4000);
  EXPECT_EQ(e.grads, 4000);
  EXPECT_EQ(e.optimizer, 2000);
  // A parameter server's worker holds no optimizer state.
  e = estimate({"parallel.dp=2", "parallel.ps_servers=1"}, 0, 2);
  EXPECT_EQ(e.optimizer, 0);
  EXPECT_EQ(e.optimizer_in_memory, 0);
  EXPECT_EQ(e.params, 4000);
  // bf16 moments: 4 bytes a parameter.
  EXPECT_EQ(estimate({"optim.moments=bf16"}, 0, 1).optimizer, 4000);
}

TEST(PartEstimates, OffloadAndStreamsApplyToWhatCameBefore) {
  // Offload at ZeRO-3, dp 4: the chunks in flight are 300 / 4 + 6 chunks of floats beside
  // the pool; the moments become the file's buffers.
  const std::vector<std::string> sets = {"parallel.dp=4", "parallel.zero=3", "offload.optimizer=disk",
                                         "offload.params=disk", "offload.dir=/tmp"};
  const Config cfg = load_config("", sets);
  const MemoryEstimate e = estimate(sets, 3, 4);
  const int64_t in_flight = 300 / 4 + 6 * cfg.offload.chunk_floats();
  EXPECT_EQ(e.params_offloaded, std::min<int64_t>(1000, in_flight * 4) + 1200);
  EXPECT_EQ(e.params, e.params_offloaded);
  EXPECT_EQ(e.optimizer, cfg.offload.buffer_bytes(250));
  EXPECT_EQ(e.optimizer_in_memory, 2000);
  // 2bw at pp 2: two versions of the weights and two gradients on every stage; pipedream
  // holds pp - rank versions, one gradient.
  const std::vector<std::string> two = {"parallel.pp=2", "parallel.schedule=2bw", "train.grad_accum=2"};
  EXPECT_EQ(estimate(two, 0, 1).params, 8000);
  EXPECT_EQ(estimate(two, 0, 1).grads, 8000);
  const std::vector<std::string> dream = {"parallel.pp=2", "parallel.schedule=pipedream", "optim.grad_clip=0"};
  EXPECT_EQ(estimate(dream, 0, 1, 0).params, 8000);
  EXPECT_EQ(estimate(dream, 0, 1, 1).params, 4000);
  EXPECT_EQ(estimate(dream, 0, 1, 0).grads, 4000);
}

}  // namespace
}  // namespace loom
