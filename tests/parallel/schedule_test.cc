#include "loom/parallel/schedule.h"

#include <gtest/gtest.h>

#include "loom/core/error.h"

namespace loom::parallel {
namespace {

// Unit-time replay: GPipe and 1F1B both take 2 (m + pp - 1) steps (the bubble is the
// 2 (pp - 1) ramp), while 1F1B holds at most pp - r activations on rank r instead of m.
TEST(Schedule, GPipeAnd1F1BAreDeadlockFreeWithTheKnownMemory) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 12; ++m) {
      const ScheduleCheck g = validate(make_schedule(ScheduleKind::kGPipe, pp, m));
      ASSERT_TRUE(g.ok) << g.problem;
      EXPECT_EQ(g.ticks, 2 * (m + pp - 1)) << "gpipe pp " << pp << " m " << m;
      const ScheduleCheck f = validate(make_schedule(ScheduleKind::k1F1B, pp, m));
      ASSERT_TRUE(f.ok) << f.problem;
      EXPECT_EQ(f.ticks, 2 * (m + pp - 1)) << "1f1b pp " << pp << " m " << m;
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(g.peak_in_flight[r], m);
        EXPECT_EQ(f.peak_in_flight[r], std::min(pp - r, m)) << "pp " << pp << " m " << m << " rank " << r;
      }
    }
}

TEST(Schedule, InterleavedIsDeadlockFreeAndEveryStepRunsOnce) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int vpp = 2; vpp <= 3; ++vpp)
      for (int m = pp; m <= 4 * pp; m += pp) {
        const Schedule s = make_schedule(ScheduleKind::kInterleaved1F1B, pp, m, vpp);
        for (const auto& rank : s.steps) ASSERT_EQ(rank.size(), size_t(2 * m * vpp));
        const ScheduleCheck c = validate(s);
        ASSERT_TRUE(c.ok) << "pp " << pp << " vpp " << vpp << " m " << m << ": " << c.problem;
        // Rank 0 warms up with (pp - 1) * 2 + (vpp - 1) * pp forwards, then holds one more.
        EXPECT_LE(c.peak_in_flight[0], std::min(2 * (pp - 1) + (vpp - 1) * pp + 1, m * vpp));
      }
}

TEST(Schedule, ValidatorNamesTheRanksOfADeadlock) {
  Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 2);
  // Rank 1 wants the gradient of micro-batch 0 before running its forward.
  s.steps[1] = {{false, 0, 0}, {true, 0, 0}, {true, 1, 0}, {false, 1, 0}};
  const ScheduleCheck c = validate(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("rank 1 waits to run B0"), std::string::npos) << c.problem;
  Schedule missing = make_schedule(ScheduleKind::kGPipe, 2, 2);
  missing.steps[0].pop_back();
  EXPECT_FALSE(validate(missing).ok);
}

TEST(Schedule, BadShapesAreRefusedWithAValidChoice) {
  try {
    make_schedule(ScheduleKind::kInterleaved1F1B, 4, 6, 2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use 8 micro-batches"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 4, 2), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 4, 1), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::kGPipe, 0, 4), Error);
}

}  // namespace
}  // namespace loom::parallel
