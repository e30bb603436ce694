// Note [Vocabulary passes]: every flushing schedule with the passes inserted finishes, keeps
// its memory, runs the passes in one order on every rank, and carries each micro-batch's
// embedding lookup and gradient once.
#include <gtest/gtest.h>

#include <algorithm>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {
namespace {

struct Kind {
  ScheduleKind kind;
  int vpp;
};

TEST(VocabPasses, EveryFlushingScheduleFinishesWithTheSameMemory) {
  const Kind kinds[] = {{ScheduleKind::kGPipe, 1},  {ScheduleKind::k1F1B, 1}, {ScheduleKind::kInterleaved1F1B, 2},
                        {ScheduleKind::kZbH1, 1},   {ScheduleKind::kZbH2, 1}, {ScheduleKind::kZbV, 2}};
  for (const Kind& k : kinds)
    for (int pp = 2; pp <= 4; ++pp)
      for (int m = 1; m <= 9; ++m) {
        if (k.kind == ScheduleKind::kInterleaved1F1B && m % pp != 0) continue;
        const std::string what = std::string(schedule_name(k.kind)) + " pp " + std::to_string(pp) + " m " +
                                 std::to_string(m);
        const Schedule plain = make_schedule(k.kind, pp, m, k.vpp);
        const Schedule s = make_schedule(k.kind, pp, m, k.vpp, true);
        const ScheduleCheck a = validate(plain), b = validate(s);
        ASSERT_TRUE(b.ok) << what << ": " << b.problem;
        EXPECT_EQ(b.peak_in_flight, a.peak_in_flight) << what;
        EXPECT_EQ(b.peak_pending_w, a.peak_pending_w) << what;
        ASSERT_EQ(s.passes.size(), size_t(m + 2)) << what;
        std::vector<int> embeds(size_t(m), 0), grads(size_t(m), 0);
        for (const VocabPass& v : s.passes) {
          for (int j : v.embed) ++embeds[size_t(j)];
          for (int j : v.embed_grad) ++grads[size_t(j)];
        }
        EXPECT_EQ(embeds, std::vector<int>(size_t(m), 1)) << what;
        EXPECT_EQ(grads, std::vector<int>(size_t(m), 1)) << what;
        for (int r = 0; r < pp; ++r) {
          // The other steps in their order, and V(-1) .. V(m) in theirs.
          std::vector<PipeStep> rest;
          int next_pass = -1;
          for (const PipeStep& st : s.steps[size_t(r)])
            if (st.phase == Phase::kV) EXPECT_EQ(st.micro_batch, next_pass++) << what << " rank " << r;
            else rest.push_back(st);
          EXPECT_EQ(next_pass, m + 1) << what;
          ASSERT_EQ(rest.size(), plain.steps[size_t(r)].size()) << what;
          for (size_t i = 0; i < rest.size(); ++i)
            EXPECT_TRUE(rest[i].phase == plain.steps[size_t(r)][i].phase &&
                        rest[i].micro_batch == plain.steps[size_t(r)][i].micro_batch &&
                        rest[i].chunk == plain.steps[size_t(r)][i].chunk)
                << what << " rank " << r << " step " << i;
        }
      }
}

// 1F1B at pp 2, m 4. The plain replay's ticks: rank 1 (the head's stage) runs F(i) at 2i + 1,
// so rank 0 runs V(i) after its steps of ticks <= 2i + 1: F0@0 F1@1 | B0@3 | F2@4 B1@5 | ...
// Lookups ride in the last pass before the first stage's F, gradients in the first after its B.
TEST(VocabPasses, OneFOneBCarriesTheEmbeddingInThePassesAroundTheFirstStage) {
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 4, 1, true);
  auto text = [](const std::vector<PipeStep>& list) {
    std::string out;
    for (const PipeStep& st : list) out += phase_letter(st.phase) + std::to_string(st.micro_batch) + " ";
    return out;
  };
  EXPECT_EQ(text(s.steps[0]), "V-1 F0 F1 V0 B0 V1 F2 B1 V2 F3 B2 V3 B3 V4 ");
  EXPECT_EQ(text(s.steps[1]), "V-1 F0 V0 B0 F1 V1 B1 F2 V2 B2 F3 V3 B3 V4 ");
  const std::vector<std::vector<int>> embed = {{0, 1}, {}, {2}, {3}, {}, {}}, grad = {{}, {}, {0}, {1}, {2}, {3}};
  for (size_t k = 0; k < s.passes.size(); ++k) {
    EXPECT_EQ(s.passes[k].head, k >= 1 && k <= 4 ? int(k) - 1 : -1) << k;
    EXPECT_EQ(s.passes[k].embed, embed[k]) << k;
    EXPECT_EQ(s.passes[k].embed_grad, grad[k]) << k;
  }
}

// The buffers the first stage holds for the embedding (vocab_buffers): 1F1B at pp 2, m 4 holds
// the two lookups of V(-1) before F0 (then at most one gradient or lookup: V(i) carries
// B(i-1)'s gradient away before it looks F(i+1)'s up); GPipe holds the four gradients of its
// backwards until V(4). Every other rank one, for the lookup it sums onto the first stage.
TEST(VocabPasses, TheFirstStageHoldsItsLookupsAndGradientsInFlight) {
  const Schedule one = make_schedule(ScheduleKind::k1F1B, 2, 4, 1, true);
  EXPECT_EQ(vocab_buffers(one, 0), 2);
  EXPECT_EQ(vocab_buffers(one, 1), 1);
  const Schedule gpipe = make_schedule(ScheduleKind::kGPipe, 2, 4, 1, true);
  EXPECT_EQ(vocab_buffers(gpipe, 0), 4);
  EXPECT_EQ(vocab_buffers(gpipe, 1), 1);
}

// A pass that one rank skips is a deadlock the validator names; the streams and pp 1 are
// refused with the passes.
TEST(VocabPasses, AMissingPassDeadlocksAndTheStreamsAreRefused) {
  Schedule s = make_schedule(ScheduleKind::k1F1B, 3, 4, 1, true);
  auto& list = s.steps[1];
  list.erase(std::find_if(list.begin(), list.end(), [](const PipeStep& st) {
    return st.phase == Phase::kV && st.micro_batch == 0;
  }));  // rank 1's V0
  const ScheduleCheck c = validate(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("deadlock"), std::string::npos) << c.problem;
  for (ScheduleKind k : {ScheduleKind::k2BW, ScheduleKind::kPipeDream, ScheduleKind::kPipeMare})
    EXPECT_THROW(make_schedule(k, 2, k == ScheduleKind::k2BW ? 4 : 1, 1, true), Error) << schedule_name(k);
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 1, 4, 1, true), Error);
}

}  // namespace
}  // namespace loom::parallel
